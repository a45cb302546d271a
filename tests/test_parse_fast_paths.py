"""The one-pass readers for token-id placeholders and exact bytes give what the general reader gives."""

import codecs
import json
import math
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.logprobs import parse as parse_module
from gateway.logprobs.align import AlignmentError
from gateway.logprobs.body_scan import load_chat_body
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.parse import LogprobParseError, ParseOptions, parse_chat, parse_completions
from gateway.logprobs.tokens import Candidate, Token, normalize_candidates

VOCAB = build_demo_vocab()

strings = st.one_of(
    st.integers(0, len(VOCAB) + 5).map(lambda i: f"token_id:{i}"),  # a few past the end
    st.sampled_from(["hello", "", "\ufffd", "bytes:\\xe6\\xa0", "token_id:", "token_id:x", "token_id:٣", "<|im_end|>"]),
)
logprobs = st.one_of(
    st.floats(min_value=-30, max_value=0),
    st.sampled_from([None, float("-inf"), float("nan"), float("inf"), -1e30, -9999.0, 0, -3]),
)
byte_lists = st.one_of(st.none(), st.lists(st.integers(0, 255), max_size=4), st.just([256]))


valid_ids = st.integers(0, len(VOCAB) - 1).map(lambda i: f"token_id:{i}")
plain = st.sampled_from(["hello", " the", "\ufffd", "a\\xe6"])


@st.composite
def chat_entries(draw, clean, depth=0):
    """Entries the fast readers take whole (`clean`: "ids" or "bytes"), or anything at all (None)."""
    if clean == "ids":
        entry = {"token": draw(valid_ids), "logprob": draw(logprobs)}
    elif clean == "bytes":
        entry = {"token": draw(plain), "logprob": draw(logprobs), "bytes": draw(st.lists(st.integers(0, 255),
                                                                                           max_size=4))}
    else:
        entry = {"token": draw(strings), "logprob": draw(logprobs)}
        if draw(st.booleans()):
            entry["bytes"] = draw(byte_lists)
        if draw(st.integers(0, 9)) == 0:
            entry["id"] = draw(st.integers(0, 50))
    if draw(st.integers(0, 9)) == 0:
        entry["special"] = True
    if depth == 0:
        entry["top_logprobs"] = draw(st.one_of(st.none(), st.lists(chat_entries(clean, depth=1), max_size=4)))
    return entry


chat_contents = st.sampled_from(["ids", "bytes", None]).flatmap(lambda clean: st.lists(chat_entries(clean),
                                                                                        max_size=6))


def _outcome(call):
    try:
        parsed = call()
    except (LogprobParseError, AlignmentError) as exc:
        return type(exc).__name__, str(exc)
    # tuple(token): every field, `top_absent` too (token equality leaves it out on purpose).
    return [tuple(t) for t in parsed.tokens], parsed.report


def _general_only(monkeypatch):
    monkeypatch.setattr(parse_module, "_chat_from_ids", lambda *args: None)
    monkeypatch.setattr(parse_module, "_chat_from_exact_bytes", lambda *args: None)
    monkeypatch.setattr(parse_module, "_completions_from_ids", lambda *args: None)


@given(chat_contents, st.booleans(), st.sampled_from([None, True]))
@settings(max_examples=400)
def test_chat_fast_readers_agree_with_the_general_reader(content, with_text, trust_bytes):
    options = ParseOptions(vocab=VOCAB if trust_bytes is None else None, trust_bytes=trust_bytes)
    text = None
    if with_text:
        # The text the tokens spell when every one is readable (the fast path's case), else any text.
        try:
            tokens = parse_chat(content, options).tokens
            text = b"".join(t.bytes for t in tokens if not t.special).decode("utf-8", "replace")
        except ValueError:  # LogprobParseError and AlignmentError are ValueErrors
            text = "hello"
    fast = _outcome(lambda: parse_chat(content, options, text))
    with pytest.MonkeyPatch.context() as patch:
        _general_only(patch)
        general = _outcome(lambda: parse_chat(content, options, text))
    assert _same(fast, general)


@st.composite
def completions_payloads(draw):
    count = draw(st.integers(0, 5))
    tokens = [draw(st.one_of(valid_ids, strings) if draw(st.booleans()) else valid_ids) for _ in range(count)]
    values = [draw(logprobs) for _ in range(count)]
    tops = draw(st.one_of(st.none(), st.lists(
        st.one_of(st.none(), st.dictionaries(valid_ids, logprobs, max_size=4),
                  st.dictionaries(strings, logprobs, max_size=4)), min_size=count, max_size=count)))
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}


@given(completions_payloads())
@settings(max_examples=300)
def test_completions_fast_reader_agrees_with_the_general_reader(payload):
    options = ParseOptions(vocab=VOCAB)
    fast = _outcome(lambda: parse_completions(payload, options))
    with pytest.MonkeyPatch.context() as patch:
        _general_only(patch)
        general = _outcome(lambda: parse_completions(payload, options))
    assert _same(fast, general)


def _same(a, b) -> bool:
    """Equal, counting NaN equal to NaN (a NaN logprob stays NaN through both readers)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_token_equality_ignores_whether_the_upstream_sent_a_top_list():
    assert Token(b"a", -1.0, (), top_absent=True) == Token(b"a", -1.0)
    assert hash(Token(b"a", -1.0, (), top_absent=True)) == hash(Token(b"a", -1.0))
    assert Token(b"a", -1.0) != Token(b"b", -1.0)


def test_candidates_with_equal_logprobs_keep_upstream_order_after_normalizing():
    cands = [Candidate(b"a", -1.0, 1), Candidate(b"b", -0.5, 2), Candidate(b"c", -1.0, 3), Candidate(b"d", -1.0, 4)]
    assert [c.token_id for c in normalize_candidates(cands, 3)] == [2, 1, 3]


def _normalize_reference(candidates, k):
    """normalize_candidates as first written: dedupe into a dict keyed by id or bytes, then sort."""
    if k <= 0 or not candidates:
        return ()
    best = {}
    for cand in candidates:
        key = ("id", cand.token_id) if cand.token_id is not None else ("bytes", cand.bytes)
        kept = best.get(key)
        if kept is None or cand.logprob > kept.logprob:
            best[key] = cand
    return tuple(sorted(best.values(), key=lambda c: -c.logprob)[:k])


candidate_lists = st.lists(st.builds(Candidate, st.sampled_from([b"a", b"b", b"\xe6", b""]),
                                     st.sampled_from([-0.5, -1.0, -2.0, -9999.0, 0.0]),
                                     st.one_of(st.none(), st.integers(0, 4))), max_size=8)


@given(candidate_lists, st.integers(-1, 9))
@settings(max_examples=500)
def test_normalizing_candidates_matches_the_reference_dedupe_and_stable_sort(candidates, k):
    assert [tuple(c) for c in normalize_candidates(candidates, k)] == \
        [tuple(c) for c in _normalize_reference(candidates, k)]


@st.composite
def unspelled_texts(draw, vocab, size):
    """Token ids and a text their bytes do not spell as they are, as servers send them: a length cap left
    the last character unfinished (the text holds it back), a stop string cut from the text, a lossy
    text (U+FFFD or another character in place of one of its characters)."""
    ids = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=12))
    joined = b"".join(vocab.token_bytes(i) for i in ids if not vocab.is_special(i))
    kind = draw(st.sampled_from(["held tail", "stop string", "lossy", "any"]))
    if kind == "held tail":
        text = codecs.utf_8_decode(joined, "replace", False)[0]
    elif kind == "stop string":
        cut = draw(st.integers(0, len(ids)))
        text = b"".join(vocab.token_bytes(i) for i in ids[:cut] if not vocab.is_special(i)).decode("utf-8", "replace")
    elif kind == "lossy":
        text = joined.decode("utf-8", "replace")
        if text:
            at = draw(st.integers(0, len(text) - 1))
            text = text[:at] + draw(st.sampled_from(["\ufffd", "?", ""])) + text[at + 1:]
    else:
        text = draw(st.text(max_size=6))
    return ids, text


def _id_entries(draw, ids, size):
    alternatives = st.lists(st.tuples(st.integers(0, size - 1), logprobs), max_size=3)
    return [{"token": f"token_id:{i}", "logprob": draw(logprobs), "bytes": [],
             "top_logprobs": [{"token": f"token_id:{j}", "logprob": lp, "bytes": []} for j, lp in draw(alternatives)]}
            for i in ids]


def _assert_exact_tokens_settle_as_the_general_reader(vocab, data):
    ids, text = data.draw(unspelled_texts(vocab, len(vocab)))
    content = _id_entries(data.draw, ids, len(vocab))
    options = ParseOptions(vocab=vocab)
    body = orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": {"content": content}, "finish_reason": "length"}]})
    from_list = _outcome(lambda: parse_chat(content, options, text))
    # The compiled reader's TokenBatch (when it is built and takes the body), as the server reads a body.
    scanned = load_chat_body(body, options)["choices"][0]["logprobs"]["content"]
    from_scanner = _outcome(lambda: parse_chat(scanned, options, text))
    with pytest.MonkeyPatch.context() as patch:
        _general_only(patch)
        general = _outcome(lambda: parse_chat(content, options, text))
    assert _same(from_list, general)
    assert _same(from_scanner, general)
    payload = {"tokens": [entry["token"] for entry in content],
               "token_logprobs": [entry["logprob"] for entry in content],
               "top_logprobs": [{alt["token"]: alt["logprob"] for alt in entry["top_logprobs"]} for entry in content]}
    fast = _outcome(lambda: parse_completions(payload, options, text))
    with pytest.MonkeyPatch.context() as patch:
        _general_only(patch)
        general = _outcome(lambda: parse_completions(payload, options, text))
    assert _same(fast, general)


@given(st.data())
@settings(max_examples=300)
def test_id_tokens_a_text_does_not_spell_settle_as_the_general_reader_does(data):
    """The id reader's exact Tokens go to the same settling (`_finish`) the general reader's entries go to,
    instead of every entry being read again: the same Tokens and report, or the same error."""
    _assert_exact_tokens_settle_as_the_general_reader(VOCAB, data)


@given(st.data())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_qwen2_id_tokens_a_text_does_not_spell_settle_as_the_general_reader_does(qwen2_vocab, data):
    """The same over Qwen2's real BPE, whose tokens split CJK characters and emoji."""
    _assert_exact_tokens_settle_as_the_general_reader(qwen2_vocab, data)


def test_real_vllm_reply_cut_inside_a_character_keeps_its_exact_tokens(qwen2_vocab):
    """Real vLLM 0.32 (tests/captures/real, "chat token ids, cap inside a character"): the 40th token leaves a
    character unfinished and the text holds it back, so the tokens do not spell the text as they are. The
    body's tokens are read once (by the compiled scanner where built) and settled against the text: the
    bytes of all 40 stay exact, the unfinished last one kept past the text, as the general reader gives them."""
    capture = json.loads((Path(__file__).parent / "captures" / "real" / "vllm-0.32.0-qwen2-tiny.json").read_text())
    case = next(c for c in capture["cases"] if c["name"] == "chat token ids, cap inside a character")
    body = case["response"]["body"]
    options = ParseOptions(vocab=qwen2_vocab)
    text = body["choices"][0]["message"]["content"]
    content = body["choices"][0]["logprobs"]["content"]
    scanned = load_chat_body(orjson.dumps(body), options)["choices"][0]["logprobs"]["content"]
    parsed = parse_chat(scanned, options, text)
    joined = b"".join(token.bytes for token in parsed.tokens)
    assert len(parsed.tokens) == 40 and joined != text.encode()
    # vLLM holds back the whole last token (a space and two bytes of a three-byte character); its bytes stay
    # the id's own, past the text.
    last = parsed.tokens[-1]
    assert b"".join(token.bytes for token in parsed.tokens[:-1]) == text.encode()
    assert last.bytes == qwen2_vocab.token_bytes(int(content[-1]["token"].removeprefix("token_id:")))
    assert codecs.utf_8_decode(last.bytes, "strict", False)[1] < len(last.bytes)  # unfinished
    assert parsed.report.from_ids == 40 and parsed.report.aligned == 0
    with pytest.MonkeyPatch.context() as patch:
        _general_only(patch)
        general = _outcome(lambda: parse_chat(content, options, text))
    assert _same(_outcome(lambda: parse_chat(scanned, options, text)), general)
