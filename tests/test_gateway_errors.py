"""/v1/responses errors: bad input, unknown models, upstream faults, client disconnects."""

import asyncio
import json

import aiohttp
import pytest

from gateway.app import STATE
from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import LOGPROBS, start_stack


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


async def _post(url: str, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session, session.post(
        url, data=data, headers={"Content-Type": "application/json"}
    ) as response:
        return response.status, await response.json()


def _error(payload: dict) -> dict:
    assert set(payload) == {"error"}
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    return payload["error"]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "demo-model", "input": "hi", "top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
        ({"model": "demo-model", "input": "hi", "top_logprobs": -1}, "top_logprobs", "integer_below_min_value"),
        ({"model": "demo-model", "input": "hi", "top_logprobs": "3"}, "top_logprobs", "invalid_type"),
        ({"model": "demo-model", "input": "hi", "temperature": "hot"}, "temperature", "invalid_type"),
        ({"model": "demo-model", "input": ""}, "input", "empty_input"),
        ({"model": "demo-model", "input": []}, "input", "empty_input"),
        ({"input": "hi"}, "model", "missing_required_parameter"),
        # A typo'd include used to be ignored (200 with no logprobs); OpenAI answers 400.
        ({"model": "demo-model", "input": "hi", "include": ["logprobs"]}, "include", "invalid_value"),
        ({"model": "demo-model", "input": "hi", "include": "message.output_text.logprobs"}, "include",
         "invalid_type"),
        ({"model": "demo-model", "input": "hi", "prompt_cache_retention": "1h"}, "prompt_cache_retention",
         "invalid_value"),
        ({"model": "demo-model", "input": "hi", "top_p": 1.5}, "top_p", "decimal_above_max_value"),
        ({"model": "demo-model", "input": "hi", "conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"model": "demo-model", "input": "hi", "prompt": {"id": "pmpt_1"}}, "prompt", "unsupported_parameter"),
        ({"model": "demo-model", "input": "hi", "max_tool_calls": 0}, "max_tool_calls", "integer_below_min_value"),
    ],
)
async def test_bad_fields_get_400_naming_the_param(aiohttp_server, vocab, body, param, code):
    stack = await start_stack(aiohttp_server, vocab)
    status, payload = await _post(stack.url("/v1/responses"), body)
    error = _error(payload)
    assert status == 400
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert stack.stats.started == 0  # nothing bad reaches the upstream


async def test_malformed_json_gets_400(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    status, payload = await _post(stack.url("/v1/responses"), b'{"model": "demo-model", "input": ')
    assert status == 400 and _error(payload)["code"] == "invalid_json"


async def test_small_max_output_tokens_is_allowed(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    status, payload = await _post(stack.url("/v1/responses"),
                                  {"model": "demo-model", "input": "hi", "max_output_tokens": 4})
    assert status == 200 and payload["status"] == "incomplete"


async def test_unknown_model_gets_404(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    status, payload = await _post(stack.url("/v1/responses"), {"model": "gpt-nope", "input": "hi"})
    assert status == 404 and _error(payload)["code"] == "model_not_found"


async def test_upstream_refusal_becomes_502_with_its_message(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    status, payload = await _post(stack.url("/v1/responses"),
                                  {"model": "demo-model", "input": "hi", "x_sim_fault": "http500"})
    error = _error(payload)
    assert status == 502 and "simulated failure" in error["message"] and error["code"] == "upstream_error"


async def test_upstream_over_its_logprob_cap_keeps_vllms_400_and_message(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, max_logprobs=5)
    status, payload = await _post(stack.url("/v1/responses"), {"model": "demo-model", "input": "hi",
                                                               "include": LOGPROBS, "top_logprobs": 10})
    error = _error(payload)
    assert status == 400 and "max allowed: 5" in error["message"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "top_logprobs")


async def test_unreachable_upstream_becomes_502(aiohttp_server, vocab, unused_tcp_port):
    stack = await start_stack(aiohttp_server, vocab, upstream_url=f"http://127.0.0.1:{unused_tcp_port}",
                              upstream_options={"health_interval": 0})
    status, payload = await _post(stack.url("/v1/responses"), {"model": "demo-model", "input": "hi"})
    assert status == 502 and "unreachable" in _error(payload)["message"]


async def test_upstream_that_hangs_becomes_504(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, timeouts={"first_token": 0.3})
    status, payload = await _post(stack.url("/v1/responses"),
                                  {"model": "demo-model", "input": "hi", "x_sim_fault": "hang"})
    assert status == 504 and _error(payload)["code"] == "upstream_timeout"


async def test_upstream_dying_mid_stream_ends_with_response_failed(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    stream = await stack.client.responses.create(model=stack.model, input="hi", stream=True, include=LOGPROBS,
                                                 extra_body={"x_sim_fault": "die_mid_stream"})
    events = [event async for event in stream]
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "server_error"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert sum(e.type.startswith("response.") and e.type in {"response.completed", "response.failed",
                                                               "response.incomplete"} for e in events) == 1


async def test_client_disconnect_cancels_the_upstream_request_and_logs_499_with_the_tokens_sent(
        aiohttp_server, vocab, caplog):
    stack = await start_stack(aiohttp_server, vocab, step_delay_ms=50)
    caplog.set_level("INFO", logger="responses_gateway")
    deltas = 0
    async with aiohttp.ClientSession() as session:
        response = await session.post(stack.url("/v1/responses"),
                                      json={"model": "demo-model", "input": "hi", "stream": True,
                                            "max_output_tokens": 200, "ignore_eos": True})
        while deltas < 3:  # the stream has begun and tokens arrived
            line = await response.content.readline()
            deltas += line.startswith(b"event: response.output_text.delta")
        response.close()  # the client goes away mid-stream
    for _ in range(100):
        if stack.stats.outcomes["cancelled"] == 1:
            break
        await asyncio.sleep(0.05)
    assert stack.stats.started == 1
    assert stack.stats.outcomes["cancelled"] == 1 and stack.stats.outcomes["finished"] == 0
    for _ in range(100):  # the access line is written once the handler has unwound
        access = [json.loads(r.message) for r in caplog.records if r.name == "responses_gateway.access"]
        if access:
            break
        await asyncio.sleep(0.05)
    assert access[-1]["status"] == 499 and access[-1]["client_disconnected"] is True
    assert 3 <= access[-1]["output_tokens"] < 200  # what was written before it left, not 0 and not 200
    replica = stack.gateway.app[STATE].routes["demo-model"].replicas.replicas[0]
    assert replica.failures == 0  # the client leaving is no fault of the upstream
