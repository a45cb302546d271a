"""The compiled twins (`gateway/logprobs/_fastpath.c`) return exactly what their Python references
return, or None (leaving the input to Python); they leak no references; the plain shape is theirs.

`.ci/run` builds the extension and fails if it is missing; elsewhere (no C compiler) these tests skip
and the pure-Python path, which every other test exercises then, is the whole story.
"""

import math
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.logprobs import parse as parse_module
from gateway.logprobs.compiled import fastpath
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.render import render_chat, render_chat_entry, render_responses_json
from gateway.logprobs.report import TranslationReport
from gateway.logprobs.tokens import Candidate, Origin, Token
from tests.test_parse_fast_paths import chat_contents, logprobs, strings

pytestmark = pytest.mark.skipif(fastpath is None, reason="the C extension was not built (no compiler at install)")

VOCAB = build_demo_vocab()
TABLE, FLAGS = parse_module.id_table(VOCAB)
SPECIAL_ID = next(i for i in range(len(VOCAB)) if VOCAB.is_special(i))


def _fields(tokens):
    """Every field of every token and candidate, with types: Token equality leaves `top_absent` out."""
    if tokens is None:
        return None
    return [(type(t), tuple(t), [(type(c), tuple(c)) for c in t.top]) for t in tokens]


def _same_result(compiled, python):
    if compiled is None:
        return
    assert _fields(compiled) == _fields(python)


@given(chat_contents)
@settings(max_examples=500)
def test_chat_twin_agrees_with_the_python_reader(content):
    compiled = fastpath.chat_from_ids(content, TABLE, FLAGS)
    python = parse_module._chat_from_ids_python(content, TABLE, VOCAB, TranslationReport())
    _same_result(compiled, python)


def _clean_chat(count, k):
    return [{"token": f"token_id:{(7 * i) % len(VOCAB)}", "logprob": -0.5 - i,
             "top_logprobs": [{"token": f"token_id:{(7 * i + j) % len(VOCAB)}", "logprob": -0.5 - i - j}
                              for j in range(k)]}
            for i in range(count)]


def test_the_plain_chat_shape_is_taken_by_the_twin():
    content = [*_clean_chat(50, 5), {"token": f"token_id:{SPECIAL_ID}", "logprob": -0.1, "top_logprobs": []},
               {"token": "token_id:0005", "logprob": -0.2, "special": True}]
    compiled = fastpath.chat_from_ids(content, TABLE, FLAGS)
    assert compiled is not None
    assert _fields(compiled) == _fields(parse_module._chat_from_ids_python(content, TABLE, VOCAB, TranslationReport()))
    assert compiled[-2].special and compiled[-1].special and compiled[-1].token_id == 5
    assert all(t.origin is Origin.TOKEN_ID for t in compiled)


@pytest.mark.parametrize("odd", [
    {"token": "token_id:3", "logprob": float("-inf")},  # a sentinel: Python counts it in the report
    {"token": "token_id:3", "logprob": -1.0, "id": 3},  # llama.cpp's shape
    {"token": "hello", "logprob": -1.0},
    {"token": "token_id:٣", "logprob": -1.0},  # non-ASCII digits: Python's str.isdecimal decides
    {"token": f"token_id:{len(VOCAB)}", "logprob": -1.0},
    {"token": "token_id:3", "logprob": -1.0, "top_logprobs": {}},
    {"token": "token_id:3", "logprob": 0},  # an int logprob
])
def test_the_twin_declines_what_python_decides(odd):
    assert fastpath.chat_from_ids([*_clean_chat(3, 2), odd], TABLE, FLAGS) is None


top_dicts = st.one_of(st.none(), st.dictionaries(strings, logprobs, max_size=4), st.just([]))


@given(st.lists(st.tuples(strings, st.one_of(logprobs, st.none()), top_dicts), max_size=6), st.booleans())
@settings(max_examples=500)
def test_completions_twin_agrees_with_the_python_reader(rows, without_tops):
    token_strings = [row[0] for row in rows]
    values = [row[1] for row in rows]
    tops = None if without_tops else [row[2] for row in rows]
    compiled = fastpath.completions_from_ids(token_strings, values, tops, TABLE, FLAGS)
    python = parse_module._completions_from_ids_python(token_strings, values, tops, TABLE, VOCAB,
                                                       TranslationReport())
    _same_result(compiled, python)


def test_the_plain_completions_shape_is_taken_by_the_twin():
    strings_ = [f"token_id:{i + 10}" for i in range(20)]
    values = [None] + [-0.25 * i - 0.1 for i in range(1, 20)]
    tops = [None] + [{f"token_id:{i + 10}": -0.1, f"token_id:{i + 11}": -2.5} for i in range(1, 20)]
    compiled = fastpath.completions_from_ids(strings_, values, tops, TABLE, FLAGS)
    assert compiled is not None and compiled[0].top_absent and not compiled[1].top_absent
    python = parse_module._completions_from_ids_python(strings_, values, tops, TABLE, VOCAB, TranslationReport())
    assert _fields(compiled) == _fields(python)


# --- rendering ------------------------------------------------------------------------------------

token_bytes = st.one_of(st.binary(max_size=6), st.sampled_from(["🦀".encode(), "根".encode()[:2], b"\xff", b'"\\\n']))
# A candidate's logprob is a number (the readers never give None); a token's may be None (echo).
render_logprobs = st.one_of(st.floats(min_value=-30, max_value=0),
                            st.sampled_from([float("-inf"), float("nan"), float("inf"), -1e30, -9999.0, 0, -2]))
ids = st.one_of(st.none(), st.integers(0, 6))
candidates = st.builds(Candidate, token_bytes, render_logprobs, ids)
tokens = st.builds(Token, token_bytes, st.one_of(render_logprobs, st.none()),
                   st.one_of(st.lists(candidates, max_size=7).map(tuple), st.lists(candidates, max_size=3)))


@given(st.lists(tokens, max_size=6), st.integers(-1, 8))
@settings(max_examples=600)
def test_render_twin_gives_the_python_entries(token_list, k):
    assert fastpath.render_entries(token_list, k, render_chat_entry) == [render_chat_entry(t, k) for t in token_list]


@given(st.lists(tokens, max_size=6), st.integers(-1, 8))
@settings(max_examples=600)
def test_json_twin_writes_what_orjson_writes_for_the_python_entries(token_list, k):
    expected = orjson.dumps([render_chat_entry(t, k) for t in token_list])
    written = fastpath.render_entries_json(token_list, k, orjson.dumps)
    assert written is None or written == expected
    assert render_responses_json(token_list, k) == expected


every_byte = bytes(range(256))
awkward = [every_byte, every_byte[::-1], "🦀根é".encode(), "🦀".encode()[:3] + b"a", b"\xed\xa0\x80\xef\xbf\xbd",
           b"\xe0\x80\xf4\x90\x80\x80\xc0\xaf\xf0\x9f\xa6", b'"\\/\x7f\x00\x1f\n']


@pytest.mark.parametrize("data", awkward)
def test_json_twin_escapes_every_byte_as_python_and_orjson_do(data):
    token = Token(data, -1.1920928955078125e-07, (Candidate(data[:3], -12.5, 1), Candidate(b"", -1e-300, 2)), 0)
    written = fastpath.render_entries_json([token], 2, orjson.dumps)
    assert written == orjson.dumps([render_chat_entry(token, 2)])
    assert orjson.loads(written)[0]["token"] == data.decode("utf-8", "backslashreplace")


def test_json_twin_declines_odd_tokens():
    plain = Token(b"a", -1.0, (Candidate(b"b", -2.0, 1),), 0)
    assert fastpath.render_entries_json([plain, Token(b"y", float("-inf"), ())], 1, orjson.dumps) is None
    assert fastpath.render_entries_json([plain], 1, orjson.dumps) == orjson.dumps([render_chat_entry(plain, 1)])
    assert fastpath.render_entries_json([], 5, orjson.dumps) == b"[]"


def test_render_twin_sorts_stably_and_cuts_to_k():
    alternatives = (Candidate(b"a", -2.0, 1), Candidate(b"b", -1.0, 2), Candidate(b"c", -2.0, 3),
                    Candidate(b"\xe6\xa0", -0.5, 4), Candidate(b"e", -3.0, 5))
    token = Token(b"\xf0\x9f\xa6\x80", -0.25, alternatives, 9)
    declined = []
    entries = fastpath.render_entries([token], 4, lambda t, k: declined.append(t) or render_chat_entry(t, k))
    assert declined == []  # the plain shape is rendered in C
    assert [e["token"] for e in entries[0]["top_logprobs"]] == ["\\xe6\\xa0", "b", "a", "c"]
    assert entries[0]["token"] == "🦀" and entries[0]["bytes"] == [240, 159, 166, 128]
    assert entries == [render_chat_entry(token, 4)]
    assert render_chat([token], 4) == entries


def test_render_twin_hands_odd_tokens_to_python():
    duplicated = Token(b"x", -1.0, (Candidate(b"a", -1.0, 1), Candidate(b"a", -0.5, 1)))
    sentinel = Token(b"y", float("-inf"), ())
    declined = []
    entries = fastpath.render_entries([duplicated, sentinel], 2,
                                      lambda t, k: declined.append(t) or render_chat_entry(t, k))
    assert declined == [duplicated, sentinel]
    assert entries[1]["logprob"] == -9999.0 and not math.isinf(entries[1]["logprob"])


def test_the_twins_leak_no_references():
    content = _clean_chat(20, 5)
    # Objects the results share with the inputs (True/False are left out: the interpreter moves their counts).
    shared = [TABLE[7 * i % len(VOCAB)] for i in range(1, 20) if len(TABLE[7 * i % len(VOCAB)]) > 1]
    shared += [Origin.TOKEN_ID, content[0]["logprob"], content[3]["top_logprobs"][2]["logprob"]]
    before = [sys.getrefcount(o) for o in shared]
    for _ in range(200):
        parsed = fastpath.chat_from_ids(content, TABLE, FLAGS)
        fastpath.render_entries(parsed, 5, render_chat_entry)
        fastpath.chat_from_ids([*content, {"token": "nope", "logprob": -1.0}], TABLE, FLAGS)  # declined midway
        fastpath.completions_from_ids(["token_id:7"], [-1.0], [{"token_id:8": -2.0}], TABLE, FLAGS)
    del parsed
    assert [sys.getrefcount(o) for o in shared] == before


def test_rendered_entries_leave_the_cycle_collector_alone_and_can_still_change():
    entries = fastpath.render_entries([Token(b"a", -1.0, (Candidate(b"b", -2.0, 1),), 0)], 1, render_chat_entry)
    import gc

    assert not gc.is_tracked(entries[0]) and not gc.is_tracked(entries[0]["bytes"])
    entries[0]["extra"] = [entries[0]]  # a cycle made later: CPython tracks the dict again
    assert gc.is_tracked(entries[0])
