"""The Vercel AI SDK, the OpenAI Node SDK and the OpenAI Python SDK, unchanged, against the gateway in
front of the vLLM simulator. The npm clients are the versions pinned in .ci/clients/package.json
(tests/real_clients.py); each Node script prints one JSON document that the test then checks, with
what the simulator received.
"""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import LOGPROBS, start_stack
from tests.real_clients import run_node

QUESTION = "What is the weather in Paris?"
REPLIES = {
    "hello": "Hi there.",
    "and then?": "Then more.",
    # Text and a tool call in one step: the AI SDK's next step refers to both by id.
    QUESTION: {"content": "Let me check.", "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    '{"city":"Paris","temp_c":21}': "It is 21 °C in Paris 🌤.",
    "as json": '{"city": "Paris", "temp_c": 21}',
    "with logprobs": "Logprobs 👋 根据 here.",
}


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


async def _stack(aiohttp_server, vocab):
    return await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step="vary")


def _chat_bodies(stack) -> list[dict]:
    return [entry["body"] for entry in stack.stats.recent if entry["path"] == "/v1/chat/completions"]


def _env(stack) -> dict[str, str]:
    return {"GATEWAY_URL": stack.url("/v1"), "GATEWAY_KEY": "test-key", "MODEL": stack.model}


async def _node_json(script: str, stack) -> dict:
    ran = (await run_node(script, env=_env(stack))).check()
    return json.loads(ran.stdout.strip().splitlines()[-1])


AI_SDK_TWO_TURNS = """
import { generateText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
const sent = [];  // what the SDK itself sent, as the gateway got it
const fetchAndKeep = (url, init) => { sent.push(JSON.parse(init.body)); return fetch(url, init); };
const openai = createOpenAI({ baseURL: process.env.GATEWAY_URL, apiKey: process.env.GATEWAY_KEY, fetch: fetchAndKeep });
const model = openai(process.env.MODEL);  // the Responses API, store: true by default
const messages = [{ role: "user", content: "hello" }];
const first = await generateText({ model, messages });
messages.push(...first.response.messages, { role: "user", content: "and then?" });
const second = await generateText({ model, messages });
console.log(JSON.stringify({ first: first.text, second: second.text, sent: sent.map((body) => body.input) }));
"""


async def test_ai_sdk_multi_turn_with_store_sends_earlier_turns_by_reference(aiohttp_server, vocab):
    stack = await _stack(aiohttp_server, vocab)
    out = await _node_json(AI_SDK_TWO_TURNS, stack)
    assert (out["first"], out["second"]) == ("Hi there.", "Then more.")
    reference = out["sent"][1][1]
    assert reference["type"] == "item_reference" and reference["id"].startswith("msg_")
    turn1, turn2 = _chat_bodies(stack)
    # Turn 2 named turn 1's answer by id (item_reference); upstream it is the assistant's text again.
    assert turn2["messages"] == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi there."},
                                 {"role": "user", "content": "and then?"}]
    assert turn1["messages"] == [{"role": "user", "content": "hello"}]


AI_SDK_TOOL_LOOP = """
import { generateText, tool, stepCountIs } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";
const sent = [];
const fetchAndKeep = (url, init) => { sent.push(JSON.parse(init.body)); return fetch(url, init); };
const openai = createOpenAI({ baseURL: process.env.GATEWAY_URL, apiKey: process.env.GATEWAY_KEY, fetch: fetchAndKeep });
const calls = [];
const result = await generateText({
  model: openai(process.env.MODEL),
  prompt: "What is the weather in Paris?",
  tools: {
    get_weather: tool({
      description: "Current weather in a city.",
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => { calls.push(city); return { city, temp_c: 21 }; },
    }),
  },
  stopWhen: stepCountIs(3),
});
console.log(JSON.stringify({ text: result.text, calls, steps: result.steps.length, sent: sent.map((b) => b.input) }));
"""


async def test_ai_sdk_tool_loop_with_text_and_a_call_in_one_step(aiohttp_server, vocab):
    stack = await _stack(aiohttp_server, vocab)
    out = await _node_json(AI_SDK_TOOL_LOOP, stack)
    assert (out["text"], out["calls"], out["steps"]) == ("It is 21 °C in Paris 🌤.", ["Paris"], 2)
    # The step's text goes back by reference (its call in full, with the call's output).
    assert [item.get("type") for item in out["sent"][1]][1:] == ["item_reference", "function_call",
                                                                "function_call_output"]
    _, step2 = _chat_bodies(stack)
    user, assistant, result = step2["messages"]
    assert user == {"role": "user", "content": QUESTION}
    assert assistant["content"] == "Let me check."  # the step's text, by reference, kept with its call
    [call] = assistant["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {
        "city": "Paris"}
    assert result == {"role": "tool", "tool_call_id": call["id"], "content": '{"city":"Paris","temp_c":21}'}


NODE_STREAM_LOGPROBS = """
import OpenAI from "openai";
const client = new OpenAI({ baseURL: process.env.GATEWAY_URL, apiKey: process.env.GATEWAY_KEY, maxRetries: 0 });
const stream = client.responses.stream({
  model: process.env.MODEL, input: "with logprobs", include: ["message.output_text.logprobs"], top_logprobs: 3,
});
const deltas = [];
stream.on("response.output_text.delta", (event) => deltas.push({ delta: event.delta, logprobs: event.logprobs }));
const final = await stream.finalResponse();
console.log(JSON.stringify({ deltas, text: final.output_text, part: final.output[0].content[0] }));
"""


async def test_node_sdk_stream_helper_with_logprobs(aiohttp_server, vocab):
    stack = await _stack(aiohttp_server, vocab)
    out = await _node_json(NODE_STREAM_LOGPROBS, stack)
    assert out["text"] == "Logprobs 👋 根据 here." == "".join(d["delta"] for d in out["deltas"])
    entries = [entry for d in out["deltas"] for entry in d["logprobs"]]
    assert entries == out["part"]["logprobs"] and len(entries) > len(out["deltas"]) / 2
    assert b"".join(bytes(entry["bytes"]) for entry in entries) == out["text"].encode()
    assert all(len(entry["top_logprobs"]) == 3 for entry in entries)


class Weather(BaseModel):
    city: str
    temp_c: int


async def test_python_sdk_parse_and_stream_helper(aiohttp_server, vocab):
    stack = await _stack(aiohttp_server, vocab)
    parsed = await stack.client.responses.parse(model=stack.model, input="as json", text_format=Weather)
    assert parsed.output_parsed == Weather(city="Paris", temp_c=21)
    fmt = _chat_bodies(stack)[-1]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Weather"

    async with stack.client.responses.stream(model=stack.model, input="as json", text_format=Weather,
                                             include=LOGPROBS) as stream:
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_parsed == Weather(city="Paris", temp_c=21)
