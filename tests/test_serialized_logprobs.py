"""The server's translator mode (logprobs kept as JSON written once; no delta events when not streaming)
gives byte for byte what the plain mode gives, streamed and whole, for awkward tokens too."""

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.logprobs.tokens import Candidate, Token
from gateway.sse import encode_event
from gateway.translate.grouping import TextGrouper, TextMismatch
from gateway.translate.response_object import ResponseSettings
from gateway.translate.stream import ResponsesStream

CRAB = "🦀".encode()


def _steps():
    """Upstream steps: whole tokens, a character split over three steps, a sentinel, broken bytes last."""
    top = (Candidate(b" b", -1.5, 11), Candidate(b"\xe6", -0.7, 12), Candidate(b" a", -0.5, 13))
    yield [Token(b"Hello", -0.25, top, 1), Token(b",", -0.5, (), 2)], "Hello,"
    yield [Token(CRAB[:2], -0.1, top, 3)], ""
    yield [Token(CRAB[2:3], -0.2, (), 4)], ""
    yield [Token(CRAB[3:], float("-inf"), top, 5), Token(b' "q"\n', -3.0, top, 6)], '🦀 "q"\n'
    yield [Token(b"\xe6\xa0", -0.3, top, 7)], ""  # a length cap inside a character: dangling bytes


def _run(settings, *, serialized, deltas):
    stream = ResponsesStream(settings, response_id="resp_1", created_at=1, serialized=serialized, deltas=deltas)
    stream.message_id = "msg_1"
    events = stream.start()
    for tokens, text in _steps():
        events += stream.feed(tokens, text)
    events += stream.finish("length", {"input_tokens": 1, "output_tokens": 7})
    for event in events:
        response = event.get("response") or {}
        response.pop("completed_at", None)  # a clock reading
    return events


@pytest.mark.parametrize("k", [0, 2, 5])
@pytest.mark.parametrize("include", [True, False])
def test_serialized_stream_frames_equal_the_plain_ones(k, include):
    settings = ResponseSettings(model="m", top_logprobs=k, include_logprobs=include)
    plain = [encode_event(e) for e in _run(settings, serialized=False, deltas=True)]
    serialized = [encode_event(e) for e in _run(settings, serialized=True, deltas=True)]
    assert serialized == plain
    final = orjson.loads(plain[-1].split(b"data: ", 1)[1])["response"]
    entries = final["output"][0]["content"][0]["logprobs"]
    assert len(entries) == (7 if include else 0)
    if include:
        assert b"".join(bytes(e["bytes"]) for e in entries).startswith(('Hello,🦀 "q"\n').encode())


@pytest.mark.parametrize("serialized", [True, False])
def test_without_delta_events_the_response_is_the_same(serialized):
    settings = ResponseSettings(model="m", top_logprobs=2, include_logprobs=True)
    streamed = _run(settings, serialized=False, deltas=True)
    whole = _run(settings, serialized=serialized, deltas=False)
    # Nobody sees a non-streamed Response's events: none is built but the one that carries the Response.
    assert [e["type"] for e in whole] == ["response.incomplete"]
    assert orjson.dumps(whole[-1]["response"]) == orjson.dumps(streamed[-1]["response"])


def test_the_plain_mode_still_hands_out_dicts():
    stream = ResponsesStream(ResponseSettings(model="m", top_logprobs=1, include_logprobs=True))
    stream.feed([Token(b"hi", -0.5, (Candidate(b"ho", -1.0, 2),), 1)], "hi")
    assert stream.logprobs == [{"token": "hi", "logprob": -0.5, "bytes": [104, 105],
                                "top_logprobs": [{"token": "ho", "logprob": -1.0, "bytes": [104, 111]}]}]
    serialized = ResponsesStream(ResponseSettings(model="m", top_logprobs=1, include_logprobs=True),
                                 serialized=True)
    serialized.feed([Token(b"hi", -0.5, (Candidate(b"ho", -1.0, 2),), 1)], "hi")
    assert isinstance(serialized.logprobs, orjson.Fragment)  # JSON written once, no dicts kept
    assert orjson.dumps(serialized.logprobs) == orjson.dumps(stream.logprobs)


# --- one group per step when no delta events are wanted -------------------------------------------

pieces = st.sampled_from(["a", " the", "🦀", "根据", "é", "\n", " 👋🏽"]).map(str.encode)


@st.composite
def steps(draw):
    """A step's tokens: text cut at random byte offsets (inside characters too), maybe a control token,
    maybe broken bytes; and the text the upstream reports (the same, without its leading space, or none)."""
    data = b"".join(draw(st.lists(pieces, max_size=8)))
    if draw(st.booleans()):
        data += draw(st.sampled_from([b"\xff", b"\xe6\xa0", b"\xf0\x9f"]))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=6))) | {0, len(data)})
    tokens = [Token(data[a:b], -0.5, (), i) for i, (a, b) in enumerate(itertools.pairwise(cuts)) if b > a]
    if tokens and draw(st.booleans()):
        tokens.insert(draw(st.integers(0, len(tokens))), Token(b"", -0.1, (), 99, special=True))
    text = data.decode("utf-8", errors="ignore")
    upstream = draw(st.sampled_from([text, text.lstrip(" "), ""]))
    return tokens, upstream


def _grouped(method, tokens, upstream, finish_reason):
    grouper = TextGrouper()
    try:
        groups = getattr(grouper, method)(tokens, upstream) + grouper.finish(finish_reason)
    except TextMismatch as exc:
        return "mismatch", str(exc)
    return "".join(text for text, _ in groups), [tuple(t) for _, group in groups for t in group]


@given(steps(), st.sampled_from(["stop", "length"]))
@settings(max_examples=400)
def test_one_group_per_step_sums_to_the_per_character_groups(step, finish_reason):
    tokens, upstream = step
    assert _grouped("feed_all", tokens, upstream, finish_reason) == _grouped("feed", tokens, upstream, finish_reason)


def _groups_of_steps(token_steps, upstream, finish_reason):
    grouper = TextGrouper()
    groups = []
    try:
        for index, tokens in enumerate(token_steps):
            groups += grouper.feed(tokens, upstream if index == 0 else "")  # (its head: a leading space)
        groups += grouper.finish(finish_reason)
    except TextMismatch as exc:
        return "mismatch", str(exc)
    return [(text, [tuple(t) for t in group]) for text, group in groups]


@given(steps(), st.sampled_from(["stop", "length"]))
@settings(max_examples=400)
def test_a_streams_one_token_steps_group_as_one_step_of_the_same_tokens(step, finish_reason):
    """The grouper's shortcut for the usual stream step (one ASCII token, nothing waiting) makes the group
    its general loop makes: one token per step gives the groups of all tokens in one step."""
    tokens, upstream = step
    assert (_groups_of_steps([[token] for token in tokens], upstream, finish_reason)
            == _groups_of_steps([tokens], upstream, finish_reason))
