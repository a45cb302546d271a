"""Scripted thinking and tool calls in the vLLM simulator: what vLLM's reasoning and tool parsers send.

Logprobs cover every generated token (thinking, text, tool-call markup, EOS); the message splits them
into `reasoning` (or `reasoning_content`), `content` and `tool_calls`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.scripted import markup, read_script
from gateway.simulator.testing import read_sse
from gateway.simulator.vllm import create_app

MODEL = "sim/demo-model"
THINKING = "Hmm 🤔 根据."
REPLIES = {
    "think": {"reasoning": THINKING, "content": "Yes 🦀."},
    "call": {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    "21": "It is 21.",
}


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def body(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "logprobs": True, "top_logprobs": 1,
            "return_tokens_as_token_ids": True, **fields}


def _ids(entries: list[dict[str, Any]]) -> list[int]:
    return [int(entry["token"].removeprefix("token_id:")) for entry in entries]


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_thinking_comes_apart_from_the_text_but_the_logprobs_cover_both(aiohttp_client, vocab, field):
    client = await aiohttp_client(create_app(vocab, MODEL, replies=REPLIES, reasoning_field=field))
    reply = await (await client.post("/v1/chat/completions", json=body("think"))).json()
    choice = reply["choices"][0]
    assert choice["message"][field] == THINKING and choice["message"]["content"] == "Yes 🦀."
    ids = _ids(choice["logprobs"]["content"])
    assert ids[:-1] == vocab.encode(THINKING) + vocab.encode("Yes 🦀.") and vocab.is_special(ids[-1])
    assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize("tokens_per_step", [1, 4])
async def test_streamed_thinking_then_text(aiohttp_client, vocab, tokens_per_step):
    client = await aiohttp_client(create_app(vocab, MODEL, replies=REPLIES, tokens_per_step=tokens_per_step))
    chunks = await read_sse(await client.post("/v1/chat/completions", json=body("think", stream=True)))
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == THINKING
    assert "".join(d.get("content") or "" for d in deltas) == "Yes 🦀."
    if tokens_per_step == 1:
        assert any(d.get("reasoning") == "" for d in deltas)  # a character still held back
    else:
        assert any("reasoning" in d and "content" in d for d in deltas)  # the step where thinking ends


async def test_a_tool_call_comes_back_parsed_with_finish_reason_tool_calls(aiohttp_client, vocab):
    client = await aiohttp_client(create_app(vocab, MODEL, replies=REPLIES))
    reply = await (await client.post("/v1/chat/completions", json=body("call"))).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    script = read_script(REPLIES["call"])
    assert _ids(choice["logprobs"]["content"])[:-1] == vocab.encode(markup(script.tool_calls[0]))


async def test_a_streamed_tool_call_gives_id_and_name_first_then_argument_pieces(aiohttp_client, vocab):
    client = await aiohttp_client(create_app(vocab, MODEL, replies=REPLIES))
    chunks = await read_sse(await client.post("/v1/chat/completions", json=body("call", stream=True)))
    pieces = [p for c in chunks[:-1] if c["choices"] for p in c["choices"][0]["delta"].get("tool_calls", [])]
    assert pieces[0]["id"].startswith("chatcmpl-tool-") and pieces[0]["function"]["name"] == "get_weather"
    assert all("id" not in p and "name" not in p["function"] for p in pieces[1:])
    assert json.loads("".join(p["function"]["arguments"] for p in pieces)) == {"city": "Paris"}
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]][-1] == "tool_calls"


async def test_the_turn_after_a_tool_call_is_looked_up_by_the_tool_result(aiohttp_client, vocab):
    client = await aiohttp_client(create_app(vocab, MODEL, replies=REPLIES))
    messages = [{"role": "user", "content": "call"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "21"}]
    reply = await (await client.post("/v1/chat/completions", json={**body("x"), "messages": messages})).json()
    assert reply["choices"][0]["message"]["content"] == "It is 21."
