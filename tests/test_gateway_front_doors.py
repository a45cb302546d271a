"""/v1/chat/completions and /v1/completions front doors over chat and completions upstreams."""

import json

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.spellings import parse_bytes_spelling
from tests.e2e import chatml_template, start_stack

TEXT = "Hi 👋🏽 根据 🦀 done."


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def _check_chat_entries(entries, text, k):
    assert b"".join(bytes(e.bytes) for e in entries) == text.encode()
    for entry in entries:
        assert entry.token == bytes(entry.bytes).decode("utf-8", errors="backslashreplace")
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) <= k and values == sorted(values, reverse=True)


def _completions_bytes(token: str) -> bytes:
    spelled = parse_bytes_spelling(token)
    return spelled if spelled is not None else token.encode()


def _check_completions_logprobs(logprobs, text, k, start=0):
    tokens = logprobs["tokens"]
    assert b"".join(_completions_bytes(t) for t in tokens) == text.encode()
    assert len(tokens) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == len(
        logprobs["text_offset"])
    for token, offset, top in zip(tokens, logprobs["text_offset"], logprobs["top_logprobs"], strict=True):
        data = _completions_bytes(token)
        if data and (data[0] & 0xC0) != 0x80:  # a token that starts a character points at it
            assert text[offset - start:].encode().startswith(data[: len(text[offset - start].encode())])
        if top is not None:
            assert len(top) <= k + 1


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("k", [0, 3, 20])
async def test_chat_front_door_non_streaming(aiohttp_server, vocab, api, k, tmp_path):
    stack = await start_stack(aiohttp_server, vocab, api=api, default_reply=TEXT,
                              chat_template=chatml_template(tmp_path))
    completion = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hello"}], logprobs=True, top_logprobs=k)
    choice = completion.choices[0]
    assert choice.message.content == TEXT and choice.finish_reason == "stop"
    _check_chat_entries(choice.logprobs.content, TEXT, k)
    assert len(choice.logprobs.content) == completion.usage.completion_tokens - 1  # EOS set aside


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_chat_front_door_streaming(aiohttp_server, vocab, api, tmp_path):
    stack = await start_stack(aiohttp_server, vocab, api=api, default_reply=TEXT, tokens_per_step="vary",
                              chat_template=chatml_template(tmp_path))
    stream = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hello"}], logprobs=True, top_logprobs=2,
        stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert text == TEXT
    _check_chat_entries(entries, TEXT, 2)
    assert chunks[-1].usage.completion_tokens == len(entries) + 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


async def test_chat_stream_ends_with_done(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    body = {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as session, session.post(stack.url("/v1/chat/completions"),
                                                                json=body) as reply:
        raw = await reply.text()
    assert raw.endswith("data: [DONE]\n\n")
    first = json.loads(raw.split("\n\n")[0].removeprefix("data: "))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


async def test_chat_front_door_without_logprobs_has_null_logprobs(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies={"hello": TEXT})
    completion = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hello"}])
    assert completion.choices[0].logprobs is None and completion.choices[0].message.content == TEXT


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("k", [0, 1, 5])
async def test_completions_front_door_non_streaming(aiohttp_server, vocab, api, k):
    stack = await start_stack(aiohttp_server, vocab, api=api, replies={"hello": TEXT})
    completion = await stack.client.completions.create(model=stack.model, prompt="hello", logprobs=k,
                                                       max_tokens=100)
    choice = completion.choices[0]
    assert choice.text == TEXT
    _check_completions_logprobs(choice.logprobs.model_dump(), TEXT, k)
    assert any(t.startswith("bytes:") for t in choice.logprobs.tokens)


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_completions_front_door_streaming_offsets_continue(aiohttp_server, vocab, api):
    stack = await start_stack(aiohttp_server, vocab, api=api, replies={"hello": TEXT}, tokens_per_step="vary")
    # OpenAI's SDK types legacy completion chunks with a non-null finish_reason, which no server sends
    # before the last chunk (OpenAI included): strict validation cannot pass here, so it is off.
    lenient = stack.client.with_options()
    lenient._strict_response_validation = False
    stream = await lenient.completions.create(model=stack.model, prompt="hello", logprobs=2, max_tokens=100,
                                              stream=True)
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    text = ""
    async for chunk in stream:
        if not chunk.choices:
            continue
        text += chunk.choices[0].text
        if chunk.choices[0].logprobs:
            for key in merged:
                merged[key] += getattr(chunk.choices[0].logprobs, key)
    assert text == TEXT
    _check_completions_logprobs(merged, TEXT, 2)
    assert merged["text_offset"] == sorted(merged["text_offset"])


async def test_completions_default_max_tokens_is_16(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies={"hello": TEXT * 5})
    completion = await stack.client.completions.create(model=stack.model, prompt="hello")
    assert completion.usage.completion_tokens == 16 and completion.choices[0].finish_reason == "length"


async def test_completions_echo_with_logprobs_has_a_null_first_entry(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, api="completions", replies={"hello there": "Hi 🦀"})
    body = {"model": stack.model, "prompt": "hello there", "logprobs": 1, "echo": True, "max_tokens": 20}
    async with aiohttp.ClientSession() as session, session.post(stack.url("/v1/completions"), json=body) as reply:
        payload = await reply.json()
    choice = payload["choices"][0]
    assert choice["text"] == "hello thereHi 🦀"
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    _check_completions_logprobs(logprobs, choice["text"], 1)
    assert logprobs["text_offset"][0] == 0


async def test_completions_echo_without_logprobs_needs_no_upstream_support(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, api="chat", replies={"hello": "Hi"})
    completion = await stack.client.completions.create(model=stack.model, prompt="hello", echo=True)
    assert completion.choices[0].text == "helloHi"


@pytest.mark.parametrize(
    ("api", "path", "body", "param"),
    [
        ("chat", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 6}, "top_logprobs"),
        ("chat", "/v1/responses", {"input": "x", "top_logprobs": 6, "include": ["message.output_text.logprobs"]},
         "top_logprobs"),
        ("completions", "/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
        ("chat", "/v1/completions", {"prompt": "x", "logprobs": 1, "echo": True}, "echo"),
        ("completions", "/v1/completions", {"prompt": "x", "logprobs": 1, "echo": True, "stream": True}, "echo"),
    ],
)
async def test_what_a_route_cannot_serve_is_refused_not_silently_shortened(aiohttp_server, vocab, api, path, body,
                                                                         param):
    stack = await start_stack(aiohttp_server, vocab, api=api, upstream_options={"max_top_logprobs": 5})
    async with aiohttp.ClientSession() as session, session.post(
        stack.url(path), json={"model": stack.model, **body}
    ) as reply:
        payload = await reply.json()
    assert reply.status == 400, payload
    assert payload["error"]["code"] == "unsupported_parameter" and payload["error"]["param"] == param
    assert stack.stats.started == 0


async def test_k_at_the_cap_is_served(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, upstream_options={"max_top_logprobs": 5}, max_logprobs=5)
    completion = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=5)
    assert max(len(e.top_logprobs) for e in completion.choices[0].logprobs.content) == 5


# --- a stream keeps nothing for a final body it never sends ---------------------------------------------

def _joined_logprobs(door: str, chunks: list[bytes]) -> dict:
    """The logprobs of every streamed chunk, end to end: what the whole answer's body must hold."""
    import orjson

    joined: dict = {"content": [], "refusal": None} if door == "chat" else {
        "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in map(orjson.loads, chunks):
        for key, values in ((chunk["choices"] or [{}])[0].get("logprobs") or {}).items():
            if values is not None:
                joined[key] += values
    return joined


def _front_chunks(front, steps):
    import orjson

    from gateway.canonical.step import Step

    chunks = front.start()
    for tokens, text in steps:
        chunks += front.feed_step(Step(text, tokens))
    chunks += front.finish("length", {"prompt_tokens": 1, "completion_tokens": len(steps)})
    return [orjson.dumps({**chunk, "id": "x", "created": 0}) for chunk in chunks]


@pytest.mark.parametrize("door", ["chat", "completions"])
def test_a_streamed_chat_or_completion_keeps_no_entries_and_sends_the_same_chunks(door):
    """The chat and completions translators kept every token's rendered logprobs (and the text) for a final
    body; a stream never asks for one (a 1,000-token k=5 chat stream held ~2 MB). Streamed, they keep none
    and send the same chunks; not streamed, the final body is whole."""
    from gateway.logprobs.tokens import Candidate, Token
    from gateway.translate.front_doors import generation_from_chat, generation_from_completions
    from gateway.translate.fronts import ChatFront, CompletionsFront

    steps = [([Token(b" w%d" % i, -0.5, tuple(Candidate(b" a%d" % j, -1.0 - j, 100 + j) for j in range(3)), i)],
              f" w{i}") for i in range(200)]

    def front(stream):
        if door == "chat":
            gen = generation_from_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                        "logprobs": True, "top_logprobs": 3, "stream": stream})
            return ChatFront(gen, False)
        gen = generation_from_completions({"model": "m", "prompt": "hi", "logprobs": 3, "stream": stream})
        return CompletionsFront(gen, False)

    streamed, whole = front(True), front(False)
    streamed_chunks = _front_chunks(streamed, steps)
    # A whole answer builds no chunk for its text (nobody would see one): only the finishing one.
    assert _front_chunks(whole, steps) == streamed_chunks[-1:]
    assert b'"finish_reason":"length"' in streamed_chunks[-1]
    kept = (streamed.stream._whole.whole(), streamed.stream._text) if door == "chat" else (
        streamed.stream._kept, streamed.stream._text)
    assert not any(kept)
    final = front(False)
    final.start()
    for tokens, text in steps:
        final.feed(tokens, text)
    body = final.final("length", None)
    choice = body["choices"][0]
    assert (choice["message"]["content"] if door == "chat" else choice["text"]) == "".join(t for _, t in steps)
    entries = choice["logprobs"]["content"] if door == "chat" else choice["logprobs"]["tokens"]
    assert len(entries) == len(steps)
    assert choice["logprobs"] == _joined_logprobs(door, streamed_chunks)  # the streamed chunks' lists end to end
    with pytest.raises(RuntimeError):
        streamed.final("length", None)


# Text (its characters cut anywhere by the token boundaries), any bytes (invalid UTF-8, lone continuation
# bytes), and text that would read back as the legacy `bytes:` spelling.
_ANSWER_BYTES = st.one_of(st.text(min_size=1, max_size=30).map(str.encode), st.binary(min_size=1, max_size=40),
                          st.just("bytes:x 日本".encode()))


@st.composite
def _answer_steps(draw):
    """(k, steps): tests.test_convert's token runs, cut into upstream steps of 1-3 tokens."""
    from tests.test_convert import token_runs

    k, tokens = draw(token_runs(max_k=4, data=_ANSWER_BYTES))
    steps = []
    while tokens:
        size = draw(st.integers(1, 3))
        steps.append((tokens[:size], ""))  # (no upstream text: the grouper spells it from the exact bytes)
        tokens = tokens[size:]
    return k, steps


@pytest.mark.parametrize("serialized", [False, True])
@pytest.mark.parametrize("door", ["chat", "completions"])
@settings(max_examples=150, deadline=None, database=None)
@given(run=_answer_steps())
def test_a_whole_answer_is_its_stream_joined(door, serialized, run):
    """Not streamed, chat and legacy completions keep the tokens and render the logprobs once at the end (no
    chunk per group; chat as one JSON list when serialized, as the server asks): the text and the logprobs
    are exactly what the same answer streamed sends, chunk after chunk, also for invalid UTF-8 and characters
    cut across tokens (where a group's text is not its bytes decoded)."""
    import orjson

    from gateway.translate.front_doors import generation_from_chat, generation_from_completions

    k, steps = run
    from gateway.translate.fronts import ChatFront, CompletionsFront

    def front(stream: bool):
        if door == "chat":
            return ChatFront(generation_from_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                   "logprobs": True, "top_logprobs": k, "stream": stream}),
                             False, serialized=serialized)
        return CompletionsFront(generation_from_completions({"model": "m", "prompt": "hi", "logprobs": k,
                                                            "stream": stream}), False)

    chunks = _front_chunks(front(True), steps)
    choices = [orjson.loads(chunk)["choices"][0] for chunk in chunks if b'"choices":[]' not in chunk]
    text = "".join((choice["delta"].get("content") or "") if door == "chat" else choice["text"] for choice in choices)
    whole = front(False)
    whole.start()
    for tokens, step_text in steps:
        whole.feed(tokens, step_text)
    choice = orjson.loads(orjson.dumps(whole.final("length", None)))["choices"][0]
    assert (choice["message"]["content"] if door == "chat" else choice["text"]) == text
    assert choice["logprobs"] == _joined_logprobs(door, chunks)
