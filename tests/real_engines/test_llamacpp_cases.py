"""Issue 20's llama.cpp cases through the gateway, against the real llama-server (SmolLM2 Q4_1, the session
fixture `real_llama_server`): Responses, chat and completions front doors, streamed and not, on chat and
completions routes; each answer is checked against llama-server's own reply to the same request.

The prompts are the capture's (tests/captures/real/llamacpp-b1-smollm2.json), where SmolLM2 at
temperature 0 splits emoji across tokens, stops inside a character, ends with its EOS and meets stop
strings. `/slots` shows what the gateway asked llama-server for (the last task's `n_probs`, `stream`)."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from tests.e2e import LOGPROBS, assert_bytes_spell, stream_response
from tests.real_engines.stack import start_gateway

CUT = "Reply with only 👋🏽👋🏽👋🏽"
HELLO = "Say hello with emoji 👋🏽 and 你好"
OK = "Say OK."
EMOJI = "Emoji: 👋🏽 你好"
EOS_PROMPT = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", autouse=True)
def _wall_time():
    started = time.monotonic()
    yield
    print(f"\nllama.cpp real-server cases: {time.monotonic() - started:.1f} s wall")


async def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as reply:
        raw = await reply.text()
        if body.get("stream") and reply.status == 200:
            return 200, [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        return reply.status, json.loads(raw)


async def final_response(stack, stream: bool, **params: Any) -> Any:
    """A Response, SDK-validated (streamed: event by event; the one its terminal event carries)."""
    if not stream:
        return await stack.client.responses.create(model=stack.model, **params)
    return (await stream_response(stack, **params))[0]


async def _last_task(engine) -> dict[str, Any]:
    """What llama-server itself was last asked for: the params of the slot with the newest task."""
    async with aiohttp.ClientSession() as session, session.get(engine.base_url + "/slots") as reply:
        slots = await reply.json()
    # A slot that never ran a task has no `id_task` (a fresh server: the other slot took both requests).
    return max(slots, key=lambda slot: slot.get("id_task", -1))["params"]


def _chat(content: str, max_tokens: int, *, k: int | None = 2, **extra: Any) -> dict[str, Any]:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": max_tokens, **extra}
    return body | ({"logprobs": True, "top_logprobs": k} if k is not None else {})


def _completion(prompt: str, max_tokens: int, *, k: int | None = 2, **extra: Any) -> dict[str, Any]:
    body = {"model": "smollm2", "prompt": prompt, "temperature": 0, "max_tokens": max_tokens, **extra}
    return body | ({"logprobs": k} if k is not None else {})


def _chat_reply(answer: Any, stream: bool) -> tuple[str, list[dict[str, Any]], str | None]:
    """(text, entries, finish_reason) of a chat answer, streamed or not (llama's or the gateway's)."""
    if not stream:
        choice = answer["choices"][0]
        return choice["message"]["content"], (choice.get("logprobs") or {}).get("content") or [], choice[
            "finish_reason"]
    text, entries, finish = "", [], None
    for frame in answer:
        for choice in frame["choices"]:
            text += choice["delta"].get("content") or ""
            entries += (choice.get("logprobs") or {}).get("content") or []
            finish = choice.get("finish_reason") or finish
    return text, entries, finish


def _completion_reply(answer: Any, stream: bool) -> tuple[str, list[str], str | None]:
    """(text, token strings, finish_reason) of the gateway's legacy completions answer."""
    choices = [frame["choices"][0] for frame in answer if frame["choices"]] if stream else answer["choices"]
    tokens = [token for choice in choices for token in (choice.get("logprobs") or {}).get("tokens") or []]
    finish = next((c["finish_reason"] for c in reversed(choices) if c.get("finish_reason")), None)
    return "".join(choice["text"] for choice in choices), tokens, finish


def _llama_completion_reply(answer: Any, stream: bool) -> tuple[str, list[str]]:
    choices = [frame["choices"][0] for frame in answer if frame["choices"]] if stream else answer["choices"]
    entries = [e for choice in choices for e in (choice.get("logprobs") or {}).get("content") or []]
    return "".join(choice["text"] for choice in choices), [e["token"] for e in entries if e["bytes"]]


def _close(values: list[float]) -> Any:
    """llama-server's numbers for the same request differ in the last digits with what its prompt cache
    held (the slot's cached prefix changes the batch): equal to 1e-3."""
    return pytest.approx(values, abs=1e-3)


def _spelled(entries: list[dict[str, Any]]) -> list[bytes]:
    return [bytes(entry["bytes"]) for entry in entries]


@pytest.fixture
async def chat(aiohttp_server, real_llama_server):
    return await start_gateway(aiohttp_server, real_llama_server, api="chat")


@pytest.fixture
async def completions(aiohttp_server, real_llama_server):
    return await start_gateway(aiohttp_server, real_llama_server, api="completions")


# --- generation stopping inside a character -------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("k", [None, 2])
async def test_a_chat_reply_cut_inside_a_character_is_the_servers_own(chat, stream, k):
    status, own = await _post(chat.upstream("/v1/chat/completions"), _chat(CUT, 2, k=k, stream=stream))
    assert status == 200
    own_text, own_entries, _ = _chat_reply(own, stream)
    assert own_text == ("" if stream else "\ufffd") and own_entries == []  # what llama.cpp does
    status, answer = await _post(chat.url("/v1/chat/completions"), _chat(CUT, 2, k=k, stream=stream))
    assert status == 200, answer  # was a 502 "unusable logprobs" (non-streamed, logprobs asked)
    assert _chat_reply(answer, stream) == (own_text, [], "length")
    if stream:
        assert answer[0]["choices"][0]["delta"]["role"] == "assistant"  # llama.cpp's stream has no role chunk


@pytest.mark.parametrize("stream", [False, True])
async def test_a_response_cut_inside_a_character_is_incomplete(chat, stream):
    response = await final_response(chat, stream, input=CUT, max_output_tokens=2, temperature=0, top_logprobs=2,
                                    include=LOGPROBS)
    part = response.output[0].content[0]
    assert (response.status, part.text, part.logprobs) == ("incomplete", "" if stream else "\ufffd", [])


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_cut_inside_a_character_keep_the_servers_text_and_entries(completions, stream):
    status, own = await _post(completions.upstream("/v1/completions"), _completion(EMOJI, 16, stream=stream))
    own_text, own_tokens = _llama_completion_reply(own, stream)
    assert status == 200 and own_text.endswith("\ufffd") != stream  # non-streamed it writes the U+FFFD
    status, answer = await _post(completions.url("/v1/completions"), _completion(EMOJI, 16, stream=stream))
    assert status == 200, answer  # was 200 with the text and no logprobs at all
    text, tokens, finish = _completion_reply(answer, stream)
    assert (text, tokens, finish) == (own_text, own_tokens, "length")
    assert "".join(tokens) + ("" if stream else "\ufffd") == text


# --- stop strings -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_keeps_every_entry(chat, real_llama_server, stream):
    status, own = await _post(chat.upstream("/v1/chat/completions"), _chat(HELLO, 24, stop=["🏽"]))
    assert status == 200 and _chat_reply(own, False)[:2] == ("👋", [])  # llama.cpp's trimming: its entry gone
    status, answer = await _post(chat.url("/v1/chat/completions"), _chat(HELLO, 24, stop=["🏽"], stream=stream))
    assert status == 200, answer  # was a 502
    assert (await _last_task(real_llama_server))["stream"] is True  # read from llama.cpp's untrimmed stream
    text, entries, finish = _chat_reply(answer, stream)
    assert (text, _spelled(entries), finish) == ("👋", ["👋".encode()], "stop")
    _, own_stream, _ = _chat_reply((await _post(chat.upstream("/v1/chat/completions"),
                                                _chat(HELLO, 24, stop=["🏽"], stream=True)))[1], True)
    assert [e["logprob"] for e in entries] == _close([e["logprob"] for e in own_stream])


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_stop_string_keeps_every_entry(completions, stream):
    status, own = await _post(completions.upstream("/v1/completions"), _completion(EMOJI, 16, stop=["👑"]))
    own_text, own_tokens = _llama_completion_reply(own, False)
    assert status == 200 and len(own_tokens) < len(own_text)  # entries cut by llama.cpp
    status, answer = await _post(completions.url("/v1/completions"), _completion(EMOJI, 16, stop=["👑"],
                                                                                 stream=stream))
    assert status == 200, answer
    text, tokens, finish = _completion_reply(answer, stream)
    assert (text, "".join(tokens), finish) == (own_text, own_text, "stop")


@pytest.mark.parametrize("stream", [False, True])
async def test_no_logprobs_asked_none_requested_and_the_servers_text(chat, real_llama_server, stream):
    for body in (_chat(HELLO, 24, k=None, stop=["🏽"], stream=stream), _chat(CUT, 2, k=None, stream=stream)):
        status, own = await _post(chat.upstream("/v1/chat/completions"), body)
        status, answer = await _post(chat.url("/v1/chat/completions"), body)
        assert status == 200, answer
        sent = (await chat.recorder.last()).request
        assert "logprobs" not in sent and "top_logprobs" not in sent and bool(sent.get("stream")) is stream
        task = await _last_task(real_llama_server)
        assert task["n_probs"] == 0 and task["stream"] is stream  # never asked for, nor streamed instead
        assert _chat_reply(answer, stream)[0] == _chat_reply(own, stream)[0]
        assert all(frame["choices"][0]["logprobs"] is None for frame in (answer if stream else [answer])
                   if frame["choices"])


# --- the EOS entry ----------------------------------------------------------------------------------


async def test_the_eos_entry_is_gone_so_stream_and_non_stream_agree(chat):
    _, own = await _post(chat.upstream("/v1/chat/completions"), _chat(OK, 40))
    own_entries = _chat_reply(own, False)[1]
    assert own_entries[-1]["bytes"] == [] and own[  # llama.cpp: the EOS entry, non-streamed only
        "choices"][0]["finish_reason"] == "stop"
    _, whole = await _post(chat.url("/v1/chat/completions"), _chat(OK, 40))
    _, frames = await _post(chat.url("/v1/chat/completions"), _chat(OK, 40, stream=True))
    text, entries, finish = _chat_reply(whole, False)
    assert _chat_reply(frames, True) == (text, entries, finish)
    assert _spelled(entries) == _spelled(own_entries[:-1]) and b"".join(_spelled(entries)) == text.encode()


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_eos_entry_is_gone(completions, stream):
    status, answer = await _post(completions.url("/v1/completions"), _completion(EOS_PROMPT, 40, stream=stream))
    assert status == 200
    text, tokens, finish = _completion_reply(answer, stream)
    assert finish == "stop" and "" not in tokens and "".join(tokens) == text


# --- k, alternatives --------------------------------------------------------------------------------


async def test_k_20_is_the_servers_top_20_and_above_20_only_the_front_doors_limit(chat):
    _, own = await _post(chat.upstream("/v1/chat/completions"), _chat(OK, 2, k=25))
    assert [len(e["top_logprobs"]) for e in own["choices"][0]["logprobs"]["content"]] == [25, 25]  # no cap
    _, own = await _post(chat.upstream("/v1/chat/completions"), _chat(OK, 2, k=20))
    status, answer = await _post(chat.url("/v1/chat/completions"), _chat(OK, 2, k=20))
    assert status == 200
    for mine, theirs in zip(_chat_reply(answer, False)[1], own["choices"][0]["logprobs"]["content"], strict=True):
        assert [t["logprob"] for t in mine["top_logprobs"]] == _close([t["logprob"] for t in theirs["top_logprobs"]])
    status, refused = await _post(chat.url("/v1/chat/completions"), _chat(OK, 2, k=21))
    assert status == 400 and refused["error"]["code"] == "integer_above_max_value"


@pytest.mark.parametrize("stream", [False, True])
async def test_alternatives_arriving_as_u_fffd_recognise_the_sampled_token(chat, completions, stream):
    _, own = await _post(chat.upstream("/v1/chat/completions"), _chat(HELLO, 24))
    own_entries = _chat_reply(own, False)[1]
    assert any(t["token"] == "\ufffd" for e in own_entries for t in e["top_logprobs"])  # per-character merging
    _, answer = await _post(chat.url("/v1/chat/completions"), _chat(HELLO, 24, stream=stream))
    entries = _chat_reply(answer, stream)[1]
    assert [e["logprob"] for e in entries] == _close([e["logprob"] for e in own_entries])
    for entry, theirs in zip(entries, own_entries, strict=True):
        top = entry["top_logprobs"]
        assert len({bytes(t["bytes"]) for t in top}) == len(top) == len(theirs["top_logprobs"])
        sampled = [i for i, t in enumerate(theirs["top_logprobs"]) if t["id"] == theirs["id"]]
        for i in sampled:  # the sampled token's alternative carries the entry's (whole character's) bytes
            assert top[i]["bytes"] == entry["bytes"] and top[i]["logprob"] == entry["logprob"]
    _, legacy = await _post(completions.url("/v1/completions"), _completion(EMOJI, 16, stream=stream))
    choices = [f["choices"][0] for f in legacy if f["choices"]] if stream else legacy["choices"]
    for choice in choices:
        for token, top in zip((choice["logprobs"] or {}).get("tokens") or [],
                              (choice["logprobs"] or {}).get("top_logprobs") or [], strict=True):
            assert len(top) == 2 and token in top  # a dict: the sampled token listed once, never twice


# --- Responses: agreement with llama-server, strict SDK validation, its native route unused --------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_responses_agree_with_llama_server_and_validate(chat, completions, route, stream):
    stack = chat if route == "chat" else completions
    if route == "chat":
        _, own = await _post(stack.upstream("/v1/chat/completions"), _chat(HELLO, 24, stream=True))
        own_text, own_entries, _ = _chat_reply(own, True)
        own_bytes = _spelled(own_entries)
    else:
        _, own = await _post(stack.upstream("/v1/completions"), _completion(EMOJI, 16, stream=True))
        choices = [f["choices"][0] for f in own if f["choices"]]
        own_text = "".join(c["text"] for c in choices)
        own_bytes = [bytes(e["bytes"]) for c in choices for e in (c["logprobs"] or {}).get("content") or []
                     if e["bytes"]]
    response = await final_response(stack, stream, input=HELLO if route == "chat" else EMOJI, temperature=0,
                                    max_output_tokens=24 if route == "chat" else 16, top_logprobs=2,
                                    include=LOGPROBS)
    part = response.output[0].content[0]
    assert response.status == "incomplete"
    if stream or route == "chat":
        assert part.text == own_text
    assert [bytes(e.bytes) for e in part.logprobs] == own_bytes
    assert_bytes_spell(b"".join(bytes(e.bytes) for e in part.logprobs), part.text.removesuffix("\ufffd"))


async def test_a_chat_stream_that_starts_inside_a_character_opens_with_the_role(chat):
    _, own = await _post(chat.upstream("/v1/chat/completions"), _chat(HELLO, 24, stream=True))
    assert not any("role" in frame["choices"][0]["delta"] for frame in own if frame["choices"])
    _, frames = await _post(chat.url("/v1/chat/completions"), _chat(HELLO, 24, stream=True))
    roles = [i for i, frame in enumerate(frames) if frame["choices"] and "role" in frame["choices"][0]["delta"]]
    assert roles == [0]
    assert _chat_reply(frames, True)[0] == _chat_reply(own, True)[0]


async def test_llama_servers_own_responses_route_has_no_logprobs_and_fails_the_sdk(chat):
    body = {"model": "smollm2", "input": "Say hi 👋", "max_output_tokens": 16,
            "include": ["message.output_text.logprobs"]}
    status, own = await _post(chat.upstream("/v1/responses"), body)
    assert status == 200 and own["output"][0]["content"][0]["logprobs"] == []
    status, refused = await _post(chat.upstream("/v1/responses"), {**body, "top_logprobs": 2})
    assert status == 400 and "top_logprobs requires logprobs" in refused["error"]["message"]
    async with aiohttp.ClientSession() as session, session.post(chat.upstream("/v1/responses"),
                                                                json={**body, "stream": True}) as reply:
        events = [json.loads(line[6:]) for line in (await reply.text()).splitlines() if line.startswith("data: {")]
    with pytest.raises(ValidationError):
        TypeAdapter(ResponseStreamEvent).validate_python(events[0])  # no sequence_number, a bare response
    # The gateway's Responses (through llama-server's chat route) have them, and validate.
    response = await final_response(chat, True, **{key: value for key, value in body.items() if key != "model"},
                                    top_logprobs=2)
    assert response.output[0].content[0].logprobs


async def test_check_config_says_what_llama_cpp_bytes_are(real_llama_server, tmp_path: Path):
    import asyncio
    import sys

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"upstreams": {"l": {"urls": [real_llama_server.base_url], "dialect": "llamacpp"}},
                                  "models": {"smollm2": {"upstream": "l"}}, "store": {"backend": "none"}}))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "check-config", str(config), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out = (await asyncio.wait_for(process.communicate(), 120))[0].decode()
    assert process.returncode == 0, out
    assert "exact bytes from ids" not in out and "lossy strings" not in out
    assert "per character" in out and "20 alternatives, the server's raw bytes" in out


# --- a long stream, through the long-stream pool -----------------------------------------------------

COUNT = "Count from 1 to 200, one number per line."
LONG = 300  # above gateway.memory.LONG_STREAM_TOKENS; ignore_eos makes every token come


async def test_a_long_stream_comes_whole_through_the_small_receive_window(aiohttp_server, real_llama_server,
                                                                           monkeypatch):
    """The simulator tests (tests/test_memory_tuning.py) prove which pool each kind of request takes; this
    one that a real server's long stream through the long-stream pool (gateway.memory) arrives whole, on a
    socket with the small window. SmolLM2 on one thread is far slower than the gateway, so the window does
    not fill here: holding a fast upstream back is bench.memory's to show."""
    from gateway import memory
    from gateway.app import STATE

    for name in (memory.READ_BUFSIZE_ENV, memory.RECEIVE_BUFFER_ENV):
        monkeypatch.delenv(name, raising=False)  # the defaults a user gets
    # Straight to llama-server (no recording relay), no health checks: the stream opens the only connection.
    stack = await start_gateway(aiohttp_server, real_llama_server, api="chat", record=False,
                                upstream_options={"health_interval": 0})
    connector = stack.gateway.app[STATE].long_stream_session.connector
    make_socket = connector._socket_factory
    receive_buffers: list[int] = []  # of each socket the pool opened (llama-server closes it after the stream)

    def recording(addr_info):
        sock = make_socket(addr_info)
        receive_buffers.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
        return sock

    monkeypatch.setattr(connector, "_socket_factory", recording)
    _, own = await _post(stack.upstream("/v1/chat/completions"), _chat(COUNT, LONG, stream=True, ignore_eos=True))
    own_text, own_entries, _ = _chat_reply(own, True)
    response = await final_response(stack, True, input=COUNT, temperature=0, max_output_tokens=LONG,
                                    top_logprobs=2, include=LOGPROBS, extra_body={"ignore_eos": True})

    [receive_buffer] = receive_buffers
    if sys.platform.startswith("linux"):  # Linux reports twice what was asked
        assert receive_buffer == 2 * memory.LONG_STREAM_RECEIVE_BUFFER
    part = response.output[0].content[0]
    assert len(own_entries) == LONG
    assert part.text == own_text
    assert [bytes(entry.bytes) for entry in part.logprobs] == _spelled(own_entries)
    assert_bytes_spell(b"".join(_spelled(own_entries)), part.text)
