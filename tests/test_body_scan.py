"""The compiled body scanner (`_fastpath_json.c` split_body, behind `body_scan.load_chat_body`) keeps its contract:

it declines (None), or it cuts `choices[0].logprobs` out of the body and returns a batch of Tokens equal to what
the id reader makes of the same JSON read by orjson; what is left is the body byte for byte with
`null` in place of the cut value, valid JSON exactly when the whole body is; nothing leaks; and the
plain vLLM shape is always taken. Skips where the extension was not built (no compiler).
"""

import json
import math
import sys
from decimal import Decimal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.canonical.step import UpstreamFormatError
from gateway.logprobs.align import AlignmentError
from gateway.logprobs.body_scan import load_chat_body
from gateway.logprobs.compiled import TokenBatch, fastpath
from gateway.logprobs.parse import ParseOptions, id_table
from gateway.logprobs.tokens import Origin
from gateway.upstreams.openai_compatible import chat_step, completions_step
from tests.test_fastpath import FLAGS, TABLE, VOCAB, _fields
from tests.test_parse_fast_paths import chat_contents, completions_payloads

pytestmark = pytest.mark.skipif(fastpath is None, reason="the C extension was not built (no compiler at install)")

OPTIONS = ParseOptions(vocab=VOCAB)


def _body(content, text="hi", *, extra_choices=0, stream=False):
    choice = {"index": 0, ("delta" if stream else "message"): {"role": "assistant", "content": text},
              "logprobs": {"content": content}, "finish_reason": None if stream else "stop", "stop_reason": None}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [choice] + [{**choice, "index": i + 1} for i in range(extra_choices)],
            "usage": None if stream else {"prompt_tokens": 3, "completion_tokens": len(content or [])}}


def _plain_content(count, k, start=0):
    return [{"token": f"token_id:{(start + 7 * i) % len(VOCAB)}", "logprob": -0.25 - i / 7,
             "bytes": list(b"token_id:1"),
             "top_logprobs": [{"token": f"token_id:{(start + 7 * i + j) % len(VOCAB)}", "logprob": -0.5 - j / 3,
                               "bytes": [116, 111]} for j in range(k)]}
            for i in range(count)]


def _split(raw):
    """`split_body` of a chat body: None, or (body, its batch made Tokens)."""
    split = fastpath.split_body(raw, False, TABLE, FLAGS)
    return None if split is None else (split[0], split[1].tokens())


def _check_contract(raw: bytes, split) -> None:
    """What a non-None answer promises about `raw`."""
    body, tokens = split
    whole = orjson.loads(raw)
    choice = whole["choices"][0]
    assert list(choice["logprobs"]) == ["content"] and choice["logprobs"]["content"] is not None
    expected = fastpath.chat_from_ids(choice["logprobs"]["content"], TABLE, FLAGS)
    assert expected is not None and _fields(tokens) == _fields(expected)
    cut = orjson.loads(body)
    assert cut["choices"][0]["logprobs"] is None
    choice["logprobs"] = None
    assert cut == whole


def _dumps(value, style: int) -> bytes:
    if style == 0:
        return orjson.dumps(value)
    if style == 1:
        return json.dumps(value, ensure_ascii=False).encode()  # ", " and ": " between members
    if style == 2:
        return json.dumps(value, indent=1, ensure_ascii=True).encode()  # new lines; non-ASCII escaped
    return (" \r\n\t" + json.dumps(value, separators=(" ,", " : ")) + "\n").encode()


@given(chat_contents, st.integers(0, 3), st.integers(0, 2), st.booleans())
@settings(max_examples=600)
def test_an_answer_keeps_the_contract(content, style, extra_choices, stream):
    content = orjson.loads(orjson.dumps(content))  # JSON has no inf or NaN (orjson writes null)
    raw = _dumps(_body(content, extra_choices=extra_choices, stream=stream), style)
    split = _split(raw)
    if split is not None:
        _check_contract(raw, split)
    elif orjson.loads(raw)["choices"][0]["logprobs"]["content"] is not None and style in (0, 1, 3):
        # Declined: the id reader must decline the same entries (or they hold what the scanner leaves alone).
        parsed = orjson.loads(raw)["choices"][0]["logprobs"]["content"]
        assert fastpath.chat_from_ids(parsed, TABLE, FLAGS) is None or _outside_the_subset(raw)


def _outside_the_subset(raw: bytes) -> bool:
    # What the scanner declines although the id reader would take it: escapes, numbers spelled as
    # exponents of 3+ digits, long integers, duplicate names (never sent by a server; orjson keeps the last).
    return b"\\" in raw or b"e-" in raw or b"e+" in raw or b"E" in raw


@given(st.integers(1, 30), st.integers(0, 20), st.integers(0, 3), st.booleans())
@settings(max_examples=200)
def test_the_plain_shape_is_always_taken(count, k, style, stream):
    content = _plain_content(count, k, start=count)
    raw = _dumps(_body(content, text="caf\u00e9 \U0001f980 \"quoted\" \\ end", stream=stream), style)
    split = _split(raw)
    assert split is not None
    _check_contract(raw, split)


def test_special_tokens_and_the_special_member_are_kept():
    special_id = next(i for i in range(len(VOCAB)) if VOCAB.is_special(i))
    content = [{"token": f"token_id:{special_id}", "logprob": -0.1, "top_logprobs": []},
               {"token": "token_id:7", "logprob": -0.2, "special": True, "top_logprobs": None},
               {"token": "token_id:8", "logprob": -0.3, "special": "yes"}]
    raw = orjson.dumps(_body(content))
    _, tokens = _split(raw)
    assert [t.special for t in tokens] == [True, True, False]
    assert all(t.origin is Origin.TOKEN_ID and t.top == () for t in tokens)


@pytest.mark.parametrize("spelling", ["-0.5", "-5e-1", "-5E-01", "-0.50000000000000000001", "-0.1234567890123456789",
                                      "123456789012345.5", "-0.0", "-1e-99", "-0.30000000000000004",
                                      "-9998.999999999999", "-2.2250738585072014e-08", "0.0", "-7.0e0"])
def test_logprobs_read_as_orjson_reads_them(spelling):
    raw = b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":%s}]}}]}' % spelling.encode()
    split = _split(raw)
    assert split is not None
    value = split[1][0].logprob
    expected = orjson.loads(raw)["choices"][0]["logprobs"]["content"][0]["logprob"]
    assert value == expected and math.copysign(1, value) == math.copysign(1, expected)


@given(st.floats(min_value=-9998.0, max_value=1000.0, allow_nan=False),
       st.sampled_from(["{!r}", "{:.6f}", "{:.17g}", "{:.3e}", "{:.15f}", "{:.20f}"]))
@settings(max_examples=600)
def test_any_float_spelling_reads_as_orjson_reads_it(value, template):
    spelled = template.format(value)
    if "." not in spelled and "e" not in spelled:
        spelled += ".0"
    raw = b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":%s}]}}]}' % spelled.encode()
    split = _split(raw)
    expected = orjson.loads(raw)["choices"][0]["logprobs"]["content"][0]["logprob"]
    if split is not None:
        assert split[1][0].logprob == expected
    else:
        assert expected <= -9999.0 or "e" in spelled  # only the sentinel or a 3-digit exponent is left to Python


@given(st.floats(min_value=-9998.0, max_value=0.0, allow_nan=False, width=32))
@settings(max_examples=600)
def test_float32_logprobs_as_vllm_prints_them_read_as_orjson_reads_them(value):
    """Real vLLM and llama.cpp send float32 logprobs printed in full (`-0.5733780264854431`, 16-17 digits):
    past Clinger's 15, read by the compiled reader's exact path, never by Python's (~2,000 instructions)."""
    raw = b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":%s}]}}]}' % repr(value).encode()
    split = _split(raw)
    expected = orjson.loads(raw)["choices"][0]["logprobs"]["content"][0]["logprob"]
    assert split is not None
    assert split[1][0].logprob.hex() == expected.hex()


@given(st.integers(1, 10**19 - 1), st.integers(0, 27), st.booleans())
@settings(max_examples=1500)
def test_long_digit_strings_read_as_orjson_reads_them(digits, decimals, near_halfway):
    """Up to 19 significant digits, the decimal point anywhere: the exact reader proves its double or leaves
    the number to Python, never a neighbour; `near_halfway` spells the midpoint between two doubles."""
    if near_halfway:  # the exact midpoint above some double, written out (Python's Decimal is exact)
        low = float(f"{digits}e-{decimals}") if decimals else float(digits)
        text = format((Decimal(low) + Decimal(math.ulp(low)) / 2), "f")
        if len(text.replace(".", "").lstrip("0")) > 19:
            text = text[:21]
    else:
        text = str(digits).rjust(decimals + 1, "0")
        text = f"{text[:len(text) - decimals]}.{text[len(text) - decimals:]}" if decimals else text + ".0"
    raw = b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":-%s}]}}]}' % text.encode()
    expected = orjson.loads(raw)["choices"][0]["logprobs"]["content"][0]["logprob"]
    split = _split(raw)
    if expected > -9999.0:
        assert split is not None
        assert split[1][0].logprob.hex() == expected.hex(), text


@pytest.mark.parametrize(("token", "logprob", "taken"), [
    ('"token_id:007"', "-0.5", True),  # leading zeros: orjson's string, the id reader's 7
    ('"token_id:7"', "-0.000000000000000000001234567", True),  # leading zeros are not significant digits
    ('"token_id:7"', "-1.23456789012345678901", True),  # 21 significant digits: Python's reader
    ('"token_id:7"', "-12345678901234567890.5", False),  # below the sentinel (-9999): left to Python
    ('"token_id:7"', "-0.12345678901234567890123", True),  # 23 significant digits: Python's reader
    ('"token_id:7"', "-0.5e1", True), ('"token_id:7"', "-0.5E-1", True),  # exponents
    ('"token_id:7"', " -0.5 ", True), ('"token_id:7"', "-1.00000000", True),
    ('"token_id:"', "-0.5", False), ('"token_id:7 "', "-0.5", False), ('"token_id:7\\u0030"', "-0.5", False),
    ('"token_id:-7"', "-0.5", False), ('"token_id:99999999999999999999"', "-0.5", False),
    ('"token_id:7', "-0.5", False), ('"token_id:7"', "-00.5", False), ('"token_id:7"', "-.5", False),
    ('"token_id:7"', "-5.", False), ('"token_id:7"', "-0.5.5", False), ('"token_id:7"', "-0.5e", False),
    ('"token_id:7"', "- 0.5", False), ('"token_id:7"', "-0.5x", False),
])
def test_spellings_beside_the_usual_ones_read_as_orjson_reads_them(token, logprob, taken):
    """The usual `"token":"token_id:N"` and `-0.d...d` are read in one pass; a spelling beside them is read
    the long way, as before: the same answer, or declined."""
    raw = (b'{"choices":[{"logprobs":{"content":[{"token":%s,"logprob":%s,"bytes":[55],"top_logprobs":[]}]}}]}'
           % (token.encode(), logprob.encode()))
    split = _split(raw)
    assert (split is not None) is taken
    if split is not None:
        _check_contract(raw, split)
        expected = orjson.loads(raw)["choices"][0]["logprobs"]["content"][0]["logprob"]
        assert split[1][0].logprob.hex() == expected.hex()


PLACEHOLDER = ",".join(str(b) for b in b"token_id:") + ","  # 116,111,...,58,


@pytest.mark.parametrize("values", ["0", "0,1", "255,0,7", "1000,2", "12,1000", " 1,2", "1 ,2", "1, 2", "1,2 ",
                                    "01", "0,01", "1,,2", ",1", "1,", "1.5,2", "1e2", "-1,2", "1,2,3,4,5,6,7,8,9,10",
                                    "999,99,9", "9999", "1,2}", "",
                                    # vLLM's spelling of an alternative's bytes (`token_id:8`), and beside it
                                    f"{PLACEHOLDER}56", f"{PLACEHOLDER}49,48,50", f"{PLACEHOLDER}", PLACEHOLDER[:-1],
                                    f"{PLACEHOLDER},56", f"{PLACEHOLDER}056", f"{PLACEHOLDER}5600", f"{PLACEHOLDER} 56",
                                    f"{PLACEHOLDER}56,", f"{PLACEHOLDER}56 ", f"{PLACEHOLDER}-1", f"{PLACEHOLDER}1.0"])
def test_byte_lists_read_as_orjson_reads_them(values):
    """A `bytes` list is only checked (the bytes come from the ids), four bytes at a time when it is short
    numbers and commas: valid JSON is taken, and a list orjson refuses leaves the cut body refused too."""
    listed = values.encode()
    raw = (b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":-0.5,"bytes":[%s],'
           b'"top_logprobs":[{"token":"token_id:8","logprob":-1.5,"bytes":[%s]}]}]}}]}' % (listed, listed))
    split = _split(raw)
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        if split is not None:
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(split[0])
        return
    assert split is not None
    _check_contract(raw, split)


@pytest.mark.parametrize("raw", [
    b'{"choices":[{"logprobs":null}]}',  # no logprobs
    b'{"choices":[]}',  # the usage chunk
    b'{"choices":[{"logprobs":{"content":null}}]}',
    b'{"choices":[{"logprobs":{"content":[],"refusal":null}}]}',  # another member: Python's
    b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":-1}]}}]}',  # an int logprob
    b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":-9999.0}]}}]}',  # the sentinel
    b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":-1.0,"id":7}]}}]}',  # llama.cpp
    b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","token":"token_id:8","logprob":-1.0}]}}]}',
    b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":-1.0,"top_logprobs":{}}]}}]}',
    b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":-1.0,"bytes":[1e999]}]}}]}',
    b'{"choices":[{"logprobs":{"content":[{"token":"token_id:99999999","logprob":-1.0}]}}]}',  # not in the table
    b'{"choices":[{"logprobs":{"content":[{"token":"\\u0074oken_id:7","logprob":-1.0}]}}]}',  # an escape
    b'{"choices":[{"logprobs":{"content":[{"token":"token_id:7","logprob":-1.0}]}}],"choices":[]}',
    b'{"choices":[{"logprobs":{"content":[]},"logprobs":null}]}',
    b'{"choi\\u0063es":[{"logprobs":{"content":[]}}]}',
    b'{"choices":[{"logprobs":{"content":[]}}]} x',
    b'[{"choices":[{"logprobs":{"content":[]}}]}]',
])
def test_shapes_left_to_python(raw):
    assert _split(raw) is None


def _mutated(data, raw: bytes) -> bytes:
    """`raw` with one to three bytes deleted, inserted or replaced (JSON's structural bytes and worse)."""
    mutated = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(mutated) - 1))
        operation = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        byte = data.draw(st.sampled_from(list(b'{}[]",:\\ 0-.eantrufl\x00\x1f\xc3\xa9\xff')))
        if operation == "delete":
            del mutated[at]
        elif operation == "insert":
            mutated.insert(at, byte)
        else:
            mutated[at] = byte
    return bytes(mutated)


@given(st.data())
@settings(max_examples=800)
def test_a_broken_body_stays_broken(data):
    raw = _mutated(data, orjson.dumps(_body(_plain_content(3, 2), text='a "b" \\ c')))
    split = _split(raw)
    if split is None:
        return
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(split[0])
        return
    _check_contract(raw, split)


def _steps(raw: bytes, stream: bool):
    outcomes = []
    for loaded in (load_chat_body(raw, OPTIONS), orjson.loads(raw)):
        try:
            step = chat_step(loaded, OPTIONS, streaming=stream)
        except AlignmentError as exc:
            outcomes.append(("raised", str(exc)))
            continue
        outcomes.append((_fields(step.tokens), step.text, step.finish_reason, step.usage, step.report.from_ids,
                         step.report.aligned))
    return outcomes


def test_the_loader_gives_the_steps_orjson_gives():
    cut_char = TABLE.index(b"\xe6")  # the first byte of a CJK character
    for stream in (False, True):
        content = _plain_content(6, 3, start=40)
        assert not any(FLAGS[int(e["token"][9:])] for e in content)
        text = b"".join(TABLE[int(e["token"][9:])] for e in content).decode()
        cut = [*content, {"token": f"token_id:{cut_char}", "logprob": -0.5}]
        # Spelled by the tokens; a length cap's U+FFFD for a cut character; text the tokens do not spell.
        for body_content, body_text in ((content, text), (cut, text + "\ufffd"), (content, text + "!")):
            raw = orjson.dumps(_body(body_content, text=body_text, stream=stream))
            assert type(load_chat_body(raw, OPTIONS)["choices"][0]["logprobs"]["content"]) is TokenBatch
            scanned, ordinary = _steps(raw, stream)
            assert scanned == ordinary


def test_the_loader_raises_what_orjson_raises():
    raw = orjson.dumps(_body(_plain_content(2, 1)))[:-1] + b"]"
    assert _split(raw) is None
    with pytest.raises(orjson.JSONDecodeError):
        load_chat_body(raw, OPTIONS)
    assert load_chat_body(b'{"choices":[]}', OPTIONS) == {"choices": []}
    assert load_chat_body(orjson.dumps(_body([])), ParseOptions()) == _body([])  # no tokenizer: orjson alone


def test_the_scanner_leaks_no_references():
    raw = orjson.dumps(_body(_plain_content(20, 5)))
    declined = raw.replace(b'"token_id:21"', b'"nope"', 1)
    shared = [TABLE[7 * i % len(VOCAB)] for i in range(1, 20) if len(TABLE[7 * i % len(VOCAB)]) > 1]
    shared += [Origin.TOKEN_ID, raw, declined]
    before = [sys.getrefcount(o) for o in shared]
    for _ in range(200):
        split = _split(raw)
        assert _split(declined) is None
    del split
    assert [sys.getrefcount(o) for o in shared] == before


def test_the_table_must_match_its_flags():
    table, flags = id_table(VOCAB)
    with pytest.raises(TypeError):
        fastpath.split_body(b"{}", False, table, flags[:-1])
    with pytest.raises(TypeError):
        fastpath.split_body("{}", False, table, flags)


# --- whole stream chunks (`read_chunk`, read without orjson) -------------------------------------------

# An explicit alphabet (ASCII, controls, 2-, 3- and 4-byte characters): st.text()'s default one builds
# Hypothesis's Unicode table on first use, seconds in a fresh clone, which its health check refuses.
ALPHABET = "ab \"\\/\n\t\x00\x1f\x7f\u00e9\u6839\uffff\U0001f980"
texts = st.one_of(st.none(), st.just(""), st.text(ALPHABET, max_size=8),
                  st.sampled_from(["\n", '"q"', "\\", "\U0001f980\u6839", "\x00\x1f", "\ud7ff\ue000"]), st.just(5))


@st.composite
def chunks(draw):
    plain = st.builds(_plain_content, st.integers(0, 3), st.integers(0, 5), st.integers(0, 1000))
    content = orjson.loads(orjson.dumps(draw(st.one_of(chat_contents, plain, plain))))
    delta = {}
    if draw(st.booleans()):
        delta["role"] = "assistant"
    if draw(st.integers(0, 5)):
        delta["content"] = draw(texts)
    extra = draw(st.sampled_from([None, None, None, "tool_calls", "tool_calls_null", "reasoning", "reasoning_content"]))
    if extra == "tool_calls":
        delta["tool_calls"] = [{"index": 0, "function": {"arguments": "{"}}]
    elif extra == "tool_calls_null":
        delta["tool_calls"] = None
    elif extra:
        delta[extra] = "thinking"
    choice = {"index": 0, "delta": delta, "logprobs": draw(st.sampled_from([None, {"content": content}])),
              "finish_reason": draw(st.sampled_from([None, None, "stop", "length", 3])), "token_ids": None}
    if draw(st.integers(0, 9)) == 0:
        del choice["delta"]
    body = {"id": "chatcmpl-\u00e9", "object": "chat.completion.chunk", "created": 1796052125, "model": "m",
            "choices": [choice] * draw(st.sampled_from([1, 1, 1, 0, 2]))}
    for name in ("usage", "error"):
        value = draw(st.sampled_from([None, "absent", "absent", "absent", {"prompt_tokens": 1}, "text"]))
        if value != "absent":
            body[name] = value
    return body


def _chunk_outcome(raw: bytes):
    try:
        step = chat_step(orjson.loads(raw), OPTIONS, streaming=True)
    except (orjson.JSONDecodeError, UpstreamFormatError):
        return "raised"
    return step


def _check_batched(raw: bytes, completions: bool, fields) -> None:
    """Asked for a TokenBatch, the reader gives the same chunk with its tokens as one (or [] for a chunk
    with no logprobs): the batch's tokens() are the list's Tokens. It declines exactly where the list
    reader does, but for a completions position with no logprob (a batch holds only plain values)."""
    batched = fastpath.read_chunk(raw, completions, TABLE, FLAGS, True)
    if fields is None:
        assert batched is None
        return
    if batched is None:
        assert completions and any(t.logprob is None for t in fields[1])
        return
    text, tokens, finish_reason = batched
    assert (text, finish_reason) == (fields[0], fields[2])
    if type(tokens) is list:
        assert tokens == [] == fields[1]
        return
    assert type(tokens) is TokenBatch and len(tokens) == len(fields[1])
    assert _fields(tokens.tokens()) == _fields(fields[1])
    assert [t.top_absent for t in tokens.tokens()] == [t.top_absent for t in fields[1]]


def _check_chunk(raw: bytes) -> bool:
    """The compiled chunk reader declines, or gives what chat_step gives; True when it answered."""
    fields = fastpath.read_chunk(raw, False, TABLE, FLAGS)
    _check_batched(raw, False, fields)
    if fields is None:
        return False
    step = _chunk_outcome(raw)
    assert step != "raised"
    text, tokens, finish_reason = fields
    assert (type(text), text, finish_reason) == (str, step.text, step.finish_reason)
    assert _fields(tokens) == _fields(step.tokens)
    assert step.usage is None and not step.tool_calls and step.reasoning is None
    return True


@given(chunks(), st.integers(0, 3))
@settings(max_examples=800)
def test_the_chunk_reader_reads_what_chat_step_reads(body, style):
    _check_chunk(_dumps(body, style))


def test_the_chunk_reader_takes_the_common_chunk_and_leaves_the_rest():
    content = _plain_content(1, 5, start=40)
    common = _body(content, text='caf\u00e9 "\U0001f980"\n\\', stream=True)
    for style in range(4):  # style 2 escapes every non-ASCII character (a surrogate pair for the crab)
        assert _check_chunk(_dumps(common, style))
    first = {**common, "choices": [{**common["choices"][0], "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None}]}
    assert fastpath.read_chunk(orjson.dumps(first), False, TABLE, FLAGS) == ("", [], None)
    last = {**common, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    assert fastpath.read_chunk(orjson.dumps(last), False, TABLE, FLAGS) is None
    for lone in (b'"\\ud800"', b'"\\udc00x"', b'"\\ud800\\u0041"'):
        raw = orjson.dumps(common).replace(b'"chatcmpl-1"', lone)
        assert raw != orjson.dumps(common)
        assert fastpath.read_chunk(raw, False, TABLE, FLAGS) is None


@given(st.data())
@settings(max_examples=800)
def test_a_broken_chunk_is_never_read(data):
    _check_chunk(_mutated(data, orjson.dumps(_body(_plain_content(1, 2), text='a "b" \\ \u00e9', stream=True))))


def test_the_server_reads_chunks_through_the_compiled_reader():
    from gateway.upstreams.openai_compatible import chat_chunk_reader

    raw = orjson.dumps(_body(_plain_content(2, 3, start=40), text="hi", stream=True))
    read_chunk = chat_chunk_reader(OPTIONS, False)
    assert read_chunk is not None
    step = read_chunk(raw)
    ordinary = chat_step(orjson.loads(raw), OPTIONS, streaming=True)
    assert step is not None and _fields(step.tokens) == _fields(ordinary.tokens)
    assert (step.report.from_ids, step.report.aligned) == (ordinary.report.from_ids, ordinary.report.aligned) == (2, 0)
    assert chat_chunk_reader(ParseOptions(), False) is None  # no tokenizer: chat_step reads it
    batched = chat_chunk_reader(OPTIONS, True)(raw)
    assert batched is not None and type(batched.tokens) is TokenBatch
    assert _fields(batched.tokens.tokens()) == _fields(ordinary.tokens) and batched.report.from_ids == 2
    assert read_chunk(orjson.dumps({"choices": [{"delta": {"tool_calls": []}}]})) is None  # not the common shape


@st.composite
def completions_chunks(draw):
    if draw(st.booleans()):
        logprobs = orjson.loads(orjson.dumps(draw(completions_payloads())))  # JSON has no inf or NaN
    else:  # the plain vLLM shape, sometimes with an array cut short or a member missing
        count = draw(st.integers(0, 3))
        ids = [draw(st.integers(40, 900)) for _ in range(count)]
        logprobs = {"text_offset": list(range(count)), "token_logprobs": [-0.5 - i / 3 for i in range(count)],
                    "tokens": [f"token_id:{i}" for i in ids],
                    "top_logprobs": [{f"token_id:{i + j}": -0.75 - j for j in range(draw(st.integers(0, 3)))}
                                     for i in ids]}
        if count and draw(st.integers(0, 4)) == 0:
            logprobs[draw(st.sampled_from(sorted(logprobs)))].pop()
        if draw(st.integers(0, 4)) == 0:
            del logprobs[draw(st.sampled_from(sorted(logprobs)))]
    choice = {"index": 0, "text": draw(texts), "logprobs": draw(st.sampled_from([logprobs, logprobs, None])),
              "finish_reason": draw(st.sampled_from([None, None, "stop", 3])), "stop_reason": None}
    body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [choice] * draw(st.sampled_from([1, 1, 1, 0, 2]))}
    if draw(st.booleans()):
        body["usage"] = draw(st.sampled_from([None, None, {"prompt_tokens": 1}]))
    return body


def _check_completions_chunk(raw: bytes) -> bool:
    fields = fastpath.read_chunk(raw, True, TABLE, FLAGS)
    _check_batched(raw, True, fields)
    if fields is None:
        return False
    step = completions_step(orjson.loads(raw), OPTIONS, streaming=True)
    text, tokens, finish_reason = fields
    assert (type(text), text, finish_reason, step.usage) == (str, step.text, step.finish_reason, None)
    assert _fields(tokens) == _fields(step.tokens)
    assert [t.top_absent for t in tokens] == [t.top_absent for t in step.tokens]
    return True


@given(completions_chunks(), st.integers(0, 3))
@settings(max_examples=800)
def test_the_chunk_reader_reads_what_completions_step_reads(body, style):
    _check_completions_chunk(_dumps(body, style))


def test_the_common_completions_chunk_is_taken():
    logprobs = {"text_offset": [0, 2], "token_logprobs": [-0.5, None], "tokens": ["token_id:40", "token_id:41"],
                "top_logprobs": [{"token_id:40": -0.5, "token_id:42": -1.5}, None]}
    body = {"choices": [{"index": 0, "text": "h\u00e9", "logprobs": logprobs, "finish_reason": None}], "usage": None}
    assert _check_completions_chunk(orjson.dumps(body))
    text, tokens, _ = fastpath.read_chunk(orjson.dumps(body), True, TABLE, FLAGS)
    assert text == "h\u00e9"
    assert [t.top_absent for t in tokens] == [False, True] and tokens[1].logprob is None
    repeated = orjson.dumps(body).replace(b'"token_id:42"', b'"token_id:40"')
    assert fastpath.read_chunk(repeated, True, TABLE, FLAGS) is None  # orjson keeps one of a repeated name


@given(st.data())
@settings(max_examples=500)
def test_a_broken_completions_chunk_is_never_read(data):
    logprobs = {"text_offset": [0], "token_logprobs": [-0.5], "tokens": ["token_id:40"],
                "top_logprobs": [{"token_id:40": -0.5, "token_id:42": -1.5}]}
    raw = orjson.dumps({"choices": [{"index": 0, "text": 'a"\u00e9', "logprobs": logprobs, "finish_reason": None}]})
    mutated = _mutated(data, raw)
    if fastpath.read_chunk(mutated, True, TABLE, FLAGS) is not None:
        orjson.loads(mutated)  # raises if the reader took a body orjson refuses
    _check_completions_chunk(mutated)
