"""The gateway in front of real llama-server replies (the capture in tests/captures/real, replayed):
every case of issue 20 that llama.cpp's wire shows, through the Responses, chat and completions front doors.

llama.cpp's entries are one per piece of text it sent (gateway/upstreams/llamacpp.py): a reply cut inside
a character is a 200 whose text ends in the U+FFFD llama.cpp wrote and no entry covers; the EOS entry is
gone from non-streamed answers as it is from streams; a stop string does not make real entries vanish."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from gateway.app import create_app
from gateway.config import parse_config
from tests.e2e import LOGPROBS, assert_bytes_spell, stream_response
from tests.llamacpp_capture import CASES, replay_app

CUT = "Reply with only 👋🏽👋🏽👋🏽"
HELLO = "Say hello with emoji 👋🏽 and 你好"
OK = "Say OK."
EMOJI = "Emoji: 👋🏽 你好"


class Stack:
    def __init__(self, gateway, seen: list[dict[str, Any]]) -> None:
        self.gateway, self.seen = gateway, seen
        self.client = AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key="x",
                                  _strict_response_validation=True, max_retries=0)
        self.model = "smollm2"

    def url(self, path: str) -> str:
        return str(self.gateway.make_url(path))

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.post(self.url(path), json=body) as reply:
            raw = await reply.text()
        if body.get("stream") and reply.status == 200:
            return reply.status, [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        return reply.status, json.loads(raw)


@pytest.fixture
async def stack(aiohttp_server):
    seen: list[dict[str, Any]] = []
    upstream = await aiohttp_server(replay_app(seen))
    url = str(upstream.make_url("")).rstrip("/")
    config = parse_config({
        "upstreams": {"chat": {"urls": [url], "dialect": "llamacpp", "api": "chat", "health_interval": 0},
                      "completions": {"urls": [url], "dialect": "llamacpp", "api": "completions",
                                      "health_interval": 0}},
        "models": {"smollm2": {"upstream": "chat"},
                   "smollm2-c": {"upstream": "completions", "upstream_model": "smollm2"}},
        "store": {"backend": "none"}}, Path("."))
    return Stack(await aiohttp_server(create_app(config)), seen)


def _chat(content: str, max_tokens: int, *, k: int | None = 2, **extra: Any) -> dict[str, Any]:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": max_tokens, **extra}
    return body | ({"logprobs": True, "top_logprobs": k} if k is not None else {})


def _chat_stream(frames: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], str | None]:
    text, entries, finish = "", [], None
    for frame in frames:
        for choice in frame["choices"]:
            text += choice["delta"].get("content") or ""
            entries += (choice.get("logprobs") or {}).get("content") or []
            finish = choice.get("finish_reason") or finish
    return text, entries, finish


def _captured_text(name: str) -> str:
    choice = CASES[name]["response"]["body"]["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


# --- generation stopping inside a character -------------------------------------------------------


@pytest.mark.parametrize("k", [None, 2])
async def test_a_reply_cut_inside_a_character_is_a_200_with_the_servers_text(stack, k):
    assert _captured_text("chat cut inside a character") == "\ufffd"  # llama.cpp: no entries at all
    status, body = await stack.post("/v1/chat/completions", _chat(CUT, 2, k=k))
    assert status == 200, body
    choice = body["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("\ufffd", "length")
    assert choice["logprobs"] == (None if k is None else {"content": [], "refusal": None})


async def _final_response(stack, stream: bool, **params: Any) -> Any:
    """A Response (streamed: the one its terminal event carries, every event validated and in order)."""
    if not stream:
        return await stack.client.responses.create(model=stack.model, **params)
    return (await stream_response(stack, **params))[0]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_response_cut_inside_a_character_is_incomplete(stack, stream):
    response = await _final_response(stack, stream, input=CUT, max_output_tokens=2, temperature=0,
                                     top_logprobs=2, include=LOGPROBS)
    assert response.status == "incomplete"
    part = response.output[0].content[0]
    # Non-streamed llama.cpp writes U+FFFD for the unfinished character; streamed it sends nothing.
    assert (part.text, part.logprobs) == ("" if stream else "\ufffd", [])


async def test_a_chat_stream_that_starts_inside_a_character_still_opens_with_the_role(stack):
    # llama.cpp sends its role chunk with the first token's result only; a first token that leaves a
    # character unfinished has none, so neither of these streams has one.
    for name in ("chat cut inside a character, stream", "chat stream"):
        assert '"role"' not in "".join(CASES[name]["response"]["events"])
    status, frames = await stack.post("/v1/chat/completions", _chat(CUT, 2, stream=True))
    assert status == 200
    assert frames[0]["choices"][0]["delta"]["role"] == "assistant"
    assert _chat_stream(frames) == ("", [], "length")
    status, frames = await stack.post("/v1/chat/completions", _chat(HELLO, 24, stream=True))
    assert frames[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum("role" in frame["choices"][0]["delta"] for frame in frames if frame["choices"]) == 1
    assert _chat_stream(frames)[0] == _captured_text("chat")


async def test_llama_cpp_has_no_cap_on_k_so_the_route_has_none(stack):
    status, body = await stack.post("/v1/chat/completions", _chat(OK, 2, k=25))
    assert status == 400 and body["error"]["code"] == "integer_above_max_value"  # OpenAI's limit, the front door's
    assert [len(e["top_logprobs"]) for e in CASES["chat top_logprobs 25"]["response"]["body"]["choices"][0][
        "logprobs"]["content"]] == [25, 25]  # llama-server itself answers any k
    config = parse_config({"upstreams": {"u": {"urls": ["http://127.0.0.1:1"], "dialect": "llamacpp"}},
                           "models": {"m": {"upstream": "u"}}}, Path("."))
    assert config.upstreams["u"].top_logprobs_cap is None


async def test_completions_cut_inside_a_character_keeps_the_servers_text_and_every_entry(stack):
    captured = CASES["completions"]["response"]["body"]["choices"][0]
    status, body = await stack.post("/v1/completions", {"model": "smollm2-c", "prompt": EMOJI, "temperature": 0,
                                                        "max_tokens": 16, "logprobs": 2})
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["text"] == captured["text"] and choice["text"].endswith("\ufffd")
    assert choice["logprobs"]["tokens"] == [entry["token"] for entry in captured["logprobs"]["content"]]
    assert "".join(choice["logprobs"]["tokens"]) + "\ufffd" == choice["text"]


# --- stop strings -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_keeps_the_entries_llama_cpp_would_cut(stack, stream):
    assert "logprobs" not in CASES["chat stop string"]["response"]["body"]["choices"][0]  # "👋" lost its entry
    status, body = await stack.post("/v1/chat/completions", _chat(HELLO, 24, stop=["🏽"], stream=stream))
    assert status == 200, body
    # Asked for as a stream (never trimmed) even when the client does not stream.
    assert stack.seen[-1]["stream"] is True
    text, entries, finish = _chat_stream(body) if stream else (
        body["choices"][0]["message"]["content"], body["choices"][0]["logprobs"]["content"],
        body["choices"][0]["finish_reason"])
    assert (text, [e["token"] for e in entries], finish) == ("👋", ["👋"], "stop")
    assert entries[0]["bytes"] == list("👋".encode())


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_stop_string_keeps_every_entry(stack, stream):
    captured = CASES["completions stop string"]["response"]["body"]["choices"][0]
    assert len(captured["logprobs"]["content"]) == 1 and captured["text"] == "？👍👏"  # two entries cut
    status, body = await stack.post("/v1/completions", {"model": "smollm2-c", "prompt": EMOJI, "temperature": 0,
                                                        "max_tokens": 16, "logprobs": 2, "stop": ["👑"],
                                                        "stream": stream})
    assert status == 200, body
    choices = [frame["choices"][0] for frame in body] if stream else body["choices"]
    tokens = [token for choice in choices for token in (choice["logprobs"] or {}).get("tokens", [])]
    assert "".join(choice["text"] for choice in choices) == "？👍👏"
    assert tokens == ["？", "👍", "👏"]


async def test_no_logprobs_asked_no_logprobs_requested_and_no_stream_forced(stack):
    status, body = await stack.post("/v1/chat/completions", _chat(HELLO, 24, k=None, stop=["🏽"]))
    assert status == 200 and body["choices"][0]["message"]["content"] == "👋"
    sent = stack.seen[-1]
    assert "logprobs" not in sent and "top_logprobs" not in sent and not sent.get("stream")


# --- the EOS entry ----------------------------------------------------------------------------------


async def test_the_eos_entry_is_gone_so_stream_and_non_stream_agree(stack):
    captured = CASES["chat eos"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert captured[-1]["token"] == "" and captured[-1]["bytes"] == []
    status, whole = await stack.post("/v1/chat/completions", _chat(OK, 40))
    status_s, frames = await stack.post("/v1/chat/completions", _chat(OK, 40, stream=True))
    assert status == status_s == 200
    entries = whole["choices"][0]["logprobs"]["content"]
    text, streamed, _ = _chat_stream(frames)
    assert entries == streamed and len(entries) == len(captured) - 1
    assert text == whole["choices"][0]["message"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode()


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_eos_entry_is_gone_streamed_or_not(stack, stream):
    prompt = CASES["completions eos"]["request"]["prompt"]
    status, body = await stack.post("/v1/completions", {"model": "smollm2-c", "prompt": prompt, "temperature": 0,
                                                        "max_tokens": 40, "logprobs": 2, "stream": stream})
    assert status == 200
    choices = [frame["choices"][0] for frame in body] if stream else body["choices"]
    tokens = [token for choice in choices for token in (choice["logprobs"] or {}).get("tokens", [])]
    assert "" not in tokens and "".join(tokens) == "".join(choice["text"] for choice in choices)


# --- alternatives -----------------------------------------------------------------------------------


async def test_the_sampled_token_is_recognised_among_alternatives_that_arrive_as_u_fffd(stack):
    first = CASES["chat"]["response"]["body"]["choices"][0]["logprobs"]["content"][0]
    assert first["top_logprobs"][0] == {**first["top_logprobs"][0], "id": first["id"], "token": "\ufffd"}
    status, body = await stack.post("/v1/chat/completions", _chat(HELLO, 24))
    assert status == 200
    for entry in body["choices"][0]["logprobs"]["content"]:
        top = entry["top_logprobs"]
        assert len({bytes(t["bytes"]) for t in top}) == len(top)
        sampled = [t for t in top if t["bytes"] == entry["bytes"]]
        assert len(sampled) <= 1 and all(t["logprob"] == entry["logprob"] for t in sampled)
    status, body = await stack.post("/v1/completions", {"model": "smollm2-c", "prompt": EMOJI, "temperature": 0,
                                                        "max_tokens": 16, "logprobs": 2})
    logprobs = body["choices"][0]["logprobs"]
    for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True):
        assert len(top) == 2 and token in top  # the sampled token listed once, under its own key


# --- Responses, SDK-validated -----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_with_logprobs_validate_and_spell_the_text(stack, stream):
    response = await _final_response(stack, stream, input=HELLO, max_output_tokens=24, temperature=0,
                                     top_logprobs=2, include=LOGPROBS)
    assert response.status == "incomplete"
    part = response.output[0].content[0]
    assert part.text == _captured_text("chat")
    assert_bytes_spell(b"".join(bytes(e.bytes) for e in part.logprobs), part.text)
    assert len(part.logprobs) == len(CASES["chat"]["response"]["body"]["choices"][0]["logprobs"]["content"])
