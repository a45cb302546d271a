"""The server's translator mode (logprobs kept as JSON written once; no delta events when not streaming)
gives byte for byte what the plain mode gives, streamed and whole, for awkward tokens too."""

import codecs
import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.logprobs.body_scan import load_chat_body
from gateway.logprobs.compiled import fastpath
from gateway.logprobs.parse import ParseOptions, id_table
from gateway.logprobs.tokens import Candidate, Token
from gateway.logprobs.vocab import _TableVocab
from gateway.sse import encode_event
from gateway.translate.grouping import TextGrouper, TextMismatch
from gateway.translate.response_object import ResponseSettings
from gateway.translate.stream import ResponsesStream
from gateway.upstreams.base import UpstreamCall
from gateway.upstreams.openai_compatible import (
    chat_chunk_reader,
    chat_step,
    completions_chunk_reader,
    completions_step,
)
from tests.test_fastpath import VOCAB

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


# --- a stream chunk's tokens as a TokenBatch (how the server reads vLLM's `token_id:N` chunks) -------------

class _PiecesVocab(_TableVocab):
    """The demo vocabulary, then pieces of characters as a byte-level BPE has them (Qwen2 streams ' 👋' as
    b' \xf0\x9f' then b'\x91\x8b'), some with bytes no token can mend."""

    PIECES = (b" \xf0\x9f", b"\x91\x8b", b"\xf0\x9f\xa6", b" \xe6", b"\xa0\xb9", b"\xff\xe6", b"\xe6\xa0", b"\xb9 a")

    def __init__(self) -> None:
        self.name = "demo+pieces"
        self._set_tables([VOCAB.token_bytes(i) for i in range(len(VOCAB))] + list(self.PIECES),
                         [i for i in range(len(VOCAB)) if VOCAB.is_special(i)])

    def id_for_piece(self, piece):
        return None


PIECES_VOCAB = _PiecesVocab()
PIECES_TABLE, PIECES_FLAGS = id_table(PIECES_VOCAB)


def _id_pools():
    ids = range(len(PIECES_TABLE))
    return ([i for i in ids if not PIECES_FLAGS[i] and PIECES_TABLE[i].isascii()],
            [i for i in ids if not PIECES_FLAGS[i]], [i for i in ids if PIECES_FLAGS[i]])


ASCII_IDS, VISIBLE_IDS, SPECIAL_IDS = _id_pools()
# Tokens as vLLM streams a character its tokenizer splits (one token, one chunk each), and broken ones:
# single bytes (the demo vocabulary has all 256) and the pieces.
BYTE_IDS = {PIECES_TABLE[i]: i for i in VISIBLE_IDS if len(PIECES_TABLE[i]) == 1}
PIECE_IDS = [BYTE_IDS[bytes([b])] for b in [*"\U0001f980\u6839\u00e9a".encode(), 0xFF, 0xED, 0xA0, 0xE6, 0xE6]]
PIECE_IDS += [len(VOCAB) + i for i in range(len(_PiecesVocab.PIECES))]


@st.composite
def id_streams(draw, completions=False):
    """A stream's chunks as vLLM writes them: token ids (mostly ASCII words; pieces of characters, bytes no
    character completes, control tokens too), one or a few a chunk, k alternatives each, and the text each
    chunk completes (an incremental decode: a character cut between chunks comes with its last piece)."""
    pick = st.one_of(st.sampled_from(ASCII_IDS), st.sampled_from(ASCII_IDS), st.sampled_from(VISIBLE_IDS),
                     st.sampled_from(SPECIAL_IDS))
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    steps = []
    for index in range(draw(st.integers(1, 10))):
        if index and draw(st.booleans()):  # a run of one-byte tokens, one a chunk
            steps += [[i] for i in draw(st.lists(st.sampled_from(PIECE_IDS), max_size=6))]
        else:
            steps.append(draw(st.lists(pick, min_size=1, max_size=3)) if index or draw(st.booleans()) else [])
    chunks = []
    for ids in steps:
        text = decoder.decode(b"".join(PIECES_TABLE[i] for i in ids if i not in SPECIAL_IDS))
        content = [{"token": f"token_id:{i}", "logprob": -0.25 - n / 8, "bytes": list(PIECES_TABLE[i]),
                    "top_logprobs": [{"token": f"token_id:{(i + j) % len(PIECES_TABLE)}", "logprob": -0.5 - j / 4,
                                      "bytes": []} for j in range(draw(st.integers(0, 3)))]}
                   for n, i in enumerate(ids)]
        chunks.append([text, content])
    chunks[-1][0] += decoder.decode(b"", final=True)  # dangling bytes: U+FFFD with the last chunk
    finish_reason = draw(st.sampled_from(["stop", "length"]))
    if completions:  # the same tokens as legacy completions logprobs
        return [orjson.dumps({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [
            {"index": 0, "text": text, "logprobs": {
                "text_offset": [0] * len(content), "token_logprobs": [entry["logprob"] for entry in content],
                "tokens": [entry["token"] for entry in content],
                "top_logprobs": [{top["token"]: top["logprob"] for top in entry["top_logprobs"]} or None
                                 for entry in content]},  # (None where a position has no alternatives)
             "finish_reason": finish_reason if n == len(chunks) - 1 else None}]})
            for n, (text, content) in enumerate(chunks)]
    return [orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                          "choices": [{"index": 0, "delta": {"content": text}, "logprobs": {"content": content},
                                       "finish_reason": finish_reason if n == len(chunks) - 1 else None}]})
            for n, (text, content) in enumerate(chunks)]


def _drive(chunks, read, start, feed, finish):
    """A translator's output for a stream's chunks, each read by `read` and fed by `feed(step)` (or what it
    raised), and the types the steps' tokens came as."""
    kinds = set()
    try:
        out, finish_reason = start(), None
        for raw in chunks:
            step = read(raw)
            kinds.add(type(step.tokens).__name__)
            out += feed(step)
            finish_reason = step.finish_reason or finish_reason
        out += finish(finish_reason, None)
    except (TextMismatch, ValueError) as exc:
        return ("raised", type(exc).__name__, str(exc)), kinds
    return out, kinds


def _served_frames(chunks, k, batches, completions=False):
    """The frames a Responses stream writes for `chunks`, each read as the server reads it (`batches`: its
    tokens a TokenBatch where the compiled reader takes it), and the types the tokens came as."""
    call = (UpstreamCall("/v1/completions", {}, completions_step, read_chunk=completions_chunk_reader) if completions
            else UpstreamCall("/v1/chat/completions", {}, chat_step, load_chat_body, chat_chunk_reader))
    read = call.stream_reader(ParseOptions(vocab=PIECES_VOCAB), batches)
    stream = ResponsesStream(ResponseSettings(model="m", top_logprobs=k, include_logprobs=True), vocab=PIECES_VOCAB,
                             response_id="resp_1", created_at=1, serialized=True)
    stream.message_id = "msg_1"
    events, kinds = _drive(chunks, read, stream.start, lambda step: stream.feed(step.tokens, step.text), stream.finish)
    if type(events) is tuple:  # (what it raised)
        return events, kinds
    for event in events:
        (event.get("response") or {}).pop("completed_at", None)  # a clock reading
    return [encode_event(event) for event in events], kinds


@given(st.data(), st.sampled_from([0, 1, 5]), st.booleans())
@settings(max_examples=300)
def test_a_stream_read_as_token_batches_writes_the_frames_of_one_read_as_tokens(data, k, completions):
    """The server reads a Responses stream's chunks into TokenBatches (no Token built; the grouper passes
    a one-token batch on whole and the message keeps it as ids): every frame, the closing ones with the
    message's whole logprob list included, is byte for byte what reading the same chunks as Tokens gives."""
    chunks = data.draw(id_streams(completions))
    as_tokens, kinds = _served_frames(chunks, k, False, completions)
    as_batches, batch_kinds = _served_frames(chunks, k, True, completions)
    assert as_batches == as_tokens
    assert kinds == {"list"}
    if fastpath is not None:
        assert batch_kinds == {"TokenBatch"} | ({"list"} if len(batch_kinds) > 1 else set())
        assert "TokenBatch" in batch_kinds


def _chat_chunks(chunks, k, batches):
    """The chat chunks the chat front door streams for `chunks` (vLLM chat chunks): read as the server reads
    them (`batches`: as TokenBatches, each entry list written once as JSON from the ids), or read as Tokens
    (each entry list written from the Tokens' bytes)."""
    from gateway.translate.front_doors import generation_from_chat
    from gateway.translate.fronts import ChatFront

    gen = generation_from_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                                "top_logprobs": k, "stream": True})
    front = ChatFront(gen, False, PIECES_VOCAB)
    read = UpstreamCall("/v1/chat/completions", {}, chat_step, load_chat_body, chat_chunk_reader).stream_reader(
        ParseOptions(vocab=PIECES_VOCAB), batches and front.takes_token_batches)
    out, kinds = _drive(chunks, read, front.start, front.feed_step, front.finish)
    if type(out) is tuple:
        return out, kinds
    return [orjson.dumps({**chunk, "id": "x", "created": 0}) for chunk in out], kinds


@given(st.data(), st.sampled_from([0, 1, 5]))
@settings(max_examples=200)
def test_a_chat_stream_read_as_token_batches_sends_the_chunks_of_one_read_as_tokens(data, k):
    """The chat front door's streams take TokenBatches too and write each chunk's entries as JSON from
    the ids: every chunk is byte for byte what the same chunks read as Tokens give (their entries written
    from the Tokens' bytes; that writer is held to the entry dicts in tests/test_fastpath.py)."""
    chunks = data.draw(id_streams())
    as_batches, batch_kinds = _chat_chunks(chunks, k, batches=True)
    as_tokens, kinds = _chat_chunks(chunks, k, batches=False)
    assert as_batches == as_tokens
    assert kinds == {"list"}
    if fastpath is not None:
        assert "TokenBatch" in batch_kinds
