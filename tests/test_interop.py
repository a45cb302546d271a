"""Interoperability: the gateway's Responses output against both contracts, cell by cell.

Every non-streamed Response and every streamed event is validated by the OpenAI SDK's types and by
the Open Responses spec (JSON Schema 2020-12 over /work/shared/reference/openresponses-openapi.json,
read in place; those checks skip when it is absent), over the vLLM simulator's chat and completions
routes, with and without logprobs. The SSE framing is checked byte by byte. Completions routes
cannot carry tools or images: those cells expect the gateway's 400.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import aiohttp
import openai.types.responses
import pytest
from pydantic import TypeAdapter

from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import LOGPROBS, chatml_template, start_stack
from tests.openresponses import load_spec

SDK_RESPONSE = openai.types.responses.Response
SDK_EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)
SPEC = load_spec()

TINY_PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")).decode()
WEATHER_TOOL = {"type": "function", "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SPLIT = "Hi 👋🏽 根据 🦀 done."  # byte tokens for every emoji and CJK character in the demo tokenizer
REPLIES = {
    "hello": SPLIT,
    "and then?": "Then 根据 🦀.",
    "what is in the picture?": "A single pixel 🖼.",
    "weather in Paris?": {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    "think": {"reasoning": "Hmm 🤔 根据…", "content": "42 🦀"},
    "as json": '{"answer": 42, "emoji": "🦀"}',
}
JSON_FORMAT = {"format": {"type": "json_schema", "name": "answer", "strict": True,
                          "schema": {"type": "object", "properties": {"answer": {"type": "integer"}},
                                     "required": ["answer"]}}}

# name -> (request fields, needs a chat upstream: the param a completions route refuses)
CELLS: dict[str, tuple[dict[str, Any], str | None]] = {
    "plain message": ({"input": "hello"}, None),
    "system and user": ({"input": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "hello"}]}, None),
    "multi-turn with a plain-string assistant": ({"input": [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi! What next?"},
        {"role": "user", "content": "and then?"}]}, None),
    "input_image as a data URL": ({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is in the picture?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{TINY_PNG}", "detail": "auto"}]}]},
        "input"),
    "function tool": ({"input": "weather in Paris?", "tools": [WEATHER_TOOL]}, "tools"),
    "reasoning": ({"input": "think"}, None),
    "json_schema": ({"input": "as json", "text": JSON_FORMAT}, None),
}
LOGPROB_MODES = {"no logprobs": {}, "logprobs k=3": {"include": LOGPROBS, "top_logprobs": 3}}


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def test_the_open_responses_spec_is_there_to_check_against():
    if SPEC is None:
        pytest.skip("Open Responses spec absent (/work/shared): spec checks in this module are skipped")
    assert "ResponseResource" in SPEC.schemas


# --- checks ---------------------------------------------------------------------------------------


def _logprob_entries(value: Any) -> list[dict[str, Any]]:
    """Every logprob entry anywhere in a body or event (under any `logprobs` list)."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "logprobs" and isinstance(item, list):
                found += item
            else:
                found += _logprob_entries(item)
    elif isinstance(value, list):
        for item in value:
            found += _logprob_entries(item)
    return found


def _check_logprobs_carry_bytes(value: Any, wanted: bool) -> None:
    entries = _logprob_entries(value)
    if not wanted:
        assert entries == []
    for entry in entries:
        assert isinstance(entry["bytes"], list) and all(isinstance(b, int) for b in entry["bytes"])
        assert len(entry["top_logprobs"]) <= 3
        for top in entry["top_logprobs"]:
            assert isinstance(top["bytes"], list)


def check_response(body: dict[str, Any], request: dict[str, Any], *, json_schema_format: bool) -> None:
    """One Response (a body, or a terminal event's snapshot) against both contracts."""
    SDK_RESPONSE.model_validate(body)
    if SPEC is not None:
        SPEC.validate("ResponseResource", body, json_schema_format=json_schema_format)
        assert SPEC.response_required | {"user"} <= body.keys()
    for key in ("temperature", "top_p", "top_logprobs", "presence_penalty", "frequency_penalty"):
        assert isinstance(body[key], int | float) and not isinstance(body[key], bool), key
    for tool in body["tools"]:
        assert {"description", "parameters", "strict"} <= tool.keys()
    assert [tool["name"] for tool in body["tools"]] == [tool["name"] for tool in request.get("tools", [])]
    assert body["top_logprobs"] == request.get("top_logprobs", 0)
    for item in body["output"]:
        for part in item.get("content") or []:
            if part["type"] == "output_text":
                assert "logprobs" in part
                if part["logprobs"]:
                    assert b"".join(bytes(e["bytes"]) for e in part["logprobs"]) == part["text"].encode()
    _check_logprobs_carry_bytes(body, "include" in request)


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Frames of a Responses stream, asserting the framing: `event:` + one `data:` line + a blank line."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n") and "\r" not in text
    frames = []
    for block in text[:-2].split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 2, f"a frame is one event line and one data line: {block[:200]!r}"
        event_line, data_line = lines
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        assert data_line != "data: [DONE]"
        frames.append((event_line[7:], json.loads(data_line[6:])))
    return frames


def check_stream(raw: bytes, request: dict[str, Any], *, json_schema_format: bool) -> dict[str, Any]:
    frames = parse_sse(raw)
    events = [data for _, data in frames]
    assert [name for name, _ in frames] == [event["type"] for event in events]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for event in events:
        SDK_EVENT.validate_python(event)
        if SPEC is not None:
            SPEC.validate_event(event, json_schema_format=json_schema_format)
    _check_logprobs_carry_bytes(events, "include" in request)
    terminal = events[-1]
    assert terminal["type"] in ("response.completed", "response.incomplete")
    check_response(terminal["response"], request, json_schema_format=json_schema_format)
    for event in events[:2]:
        check_response(event["response"], request, json_schema_format=json_schema_format)
    return terminal["response"]


# --- the matrix -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("logprobs", LOGPROB_MODES, ids=list(LOGPROB_MODES))
@pytest.mark.parametrize("cell", CELLS, ids=list(CELLS))
@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_output_validates_against_the_sdk_and_the_spec(aiohttp_server, vocab, tmp_path, api, cell, logprobs,
                                                             stream):
    stack = await start_stack(aiohttp_server, vocab, api=api, replies=REPLIES, tokens_per_step="vary",
                              chat_template=chatml_template(tmp_path))
    fields, chat_only = CELLS[cell]
    request = {"model": stack.model, **fields, **LOGPROB_MODES[logprobs], "stream": stream}
    json_schema_format = "text" in fields
    async with aiohttp.ClientSession() as session, session.post(stack.url("/v1/responses"), json=request) as reply:
        raw = await reply.read()
        if api == "completions" and chat_only:
            assert reply.status == 400, raw
            error = json.loads(raw)["error"]
            assert error["code"] == "unsupported_parameter" and error["param"] == chat_only
            assert error["type"] == "invalid_request_error"
            return
        assert reply.status == 200, raw
        if stream:
            assert reply.headers["Content-Type"] == "text/event-stream; charset=utf-8"
            response = check_stream(raw, request, json_schema_format=json_schema_format)
        else:
            response = json.loads(raw)
            check_response(response, request, json_schema_format=json_schema_format)
    assert response["status"] == "completed"
    kinds = [item["type"] for item in response["output"]]
    if cell == "function tool":
        assert kinds == ["function_call"]
    elif cell == "reasoning" and api == "chat":
        assert kinds == ["reasoning", "message"]
    else:
        assert kinds == ["message"]


async def test_the_strict_sdk_client_reads_a_streamed_tool_call_and_reasoning(aiohttp_server, vocab):
    """The SDK's own stream helper (strict validation, snapshot accumulation) over both new item kinds."""
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step="vary")
    for fields in (CELLS["function tool"][0], CELLS["reasoning"][0]):
        async with stack.client.responses.stream(model=stack.model, include=LOGPROBS, top_logprobs=3,
                                                 **fields) as events:
            final = await events.get_final_response()
        assert final.status == "completed" and final.output
