"""WebSocket mode on /v1/responses with a real WebSocket client (aiohttp's): the Open Responses
spec's messages, continuation from the per-connection cache, eviction, limits, auth, disconnects."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import STATE
from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import Stack, start_stack
from tests.openresponses import load_spec

REPLIES = {"hello": "Hi there.", "and then?": "Then more.", "last one": "Bye now."}
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
SPEC = load_spec()


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def _ws_url(stack: Stack) -> str:
    return str(stack.gateway.make_url("/v1/responses")).replace("http://", "ws://")


async def _turn(ws: aiohttp.ClientWebSocketResponse, message: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one response.create; every message up to its terminal event or error."""
    await ws.send_json(message)
    received = []
    while True:
        event = await ws.receive_json(timeout=30)
        received.append(event)
        if event["type"] in TERMINAL or event["type"] == "error":
            return received


async def _upstream_messages(stack: Stack) -> list[list[dict[str, Any]]]:
    async with aiohttp.ClientSession() as session, session.get(str(stack.simulator.make_url("/sim/requests"))) as r:
        return [entry["body"]["messages"] for entry in await r.json() if entry["path"] == "/v1/chat/completions"]


def _create(stack: Stack, text: Any, **fields: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": stack.model, "input": text, **fields}


async def test_a_store_false_chain_of_three_turns_continues_on_the_socket(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    headers = {"Authorization": "Bearer test-key"}
    async with aiohttp.ClientSession() as session, session.ws_connect(_ws_url(stack), headers=headers) as ws:
        first = await _turn(ws, _create(stack, "hello", store=False))
        second = await _turn(ws, _create(stack, "and then?", store=False,
                                         previous_response_id=first[-1]["response"]["id"]))
        third = await _turn(ws, _create(stack, "last one", store=False,
                                        previous_response_id=second[-1]["response"]["id"],
                                        include=["message.output_text.logprobs"], top_logprobs=2))
    for events in (first, second, third):
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["response"]["store"] is False
        if SPEC is not None:
            for event in events:
                SPEC.validate_event(event)
    assert [t[-1]["response"]["output"][0]["content"][0]["text"] for t in (first, second, third)] == \
        ["Hi there.", "Then more.", "Bye now."]
    assert third[-1]["response"]["previous_response_id"] == second[-1]["response"]["id"]
    assert third[-1]["response"]["output"][0]["content"][0]["logprobs"]  # logprobs over the socket too
    # The upstream saw the whole conversation on turn 3 although the client sent only the new input.
    *_, last = await _upstream_messages(stack)
    assert [m["content"] for m in last] == ["hello", "Hi there.", "and then?", "Then more.", "last one"]
    # A store:false chain lives on its socket only: over HTTP it is unknown.
    unknown = stack.url(f"/v1/responses/{first[-1]['response']['id']}")
    async with aiohttp.ClientSession() as session, session.get(unknown, headers=headers) as r:
        assert r.status == 404


async def test_the_events_are_the_sse_streams_events(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    body = {"model": stack.model, "input": "hello", "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(_ws_url(stack)) as ws:
            over_ws = await _turn(ws, {"type": "response.create", **body})
        sse = [e.model_dump(mode="json", exclude_unset=True)
               async for e in await stack.client.responses.create(stream=True, **body)]
    def shape(events: list[dict[str, Any]]) -> list[Any]:
        return [(e["type"], e["sequence_number"], e.get("delta"), e.get("logprobs")) for e in events]
    assert shape(over_ws) == shape(sse)


async def test_a_new_socket_does_not_know_a_store_false_response_and_recovers(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(_ws_url(stack)) as ws:
            first = await _turn(ws, _create(stack, "hello", store=False))
        async with session.ws_connect(_ws_url(stack)) as ws:
            missed = await _turn(ws, _create(stack, "and then?", store=False,
                                             previous_response_id=first[-1]["response"]["id"]))
            recovered = await _turn(ws, _create(stack, "hello", store=False))
    assert missed == [{"type": "error", "status": 400, "error": {
        "message": f"Previous response with id '{first[-1]['response']['id']}' not found.",
        "type": "invalid_request_error", "param": "previous_response_id", "code": "previous_response_not_found"}}]
    if SPEC is not None:
        SPEC.validate("WebSocketErrorEvent", missed[0])
    assert recovered[-1]["type"] == "response.completed"


async def test_a_failed_continuation_evicts_the_id_it_continued(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    async with aiohttp.ClientSession() as session, session.ws_connect(_ws_url(stack)) as ws:
        first = await _turn(ws, _create(stack, "hello", store=False))
        first_id = first[-1]["response"]["id"]
        bad_part = [{"type": "message", "role": "user", "content": [{"type": "input_audio", "data": "x"}]}]
        failed = await _turn(ws, _create(stack, bad_part, store=False, previous_response_id=first_id))
        stale = await _turn(ws, _create(stack, "and then?", store=False, previous_response_id=first_id))
        fresh = await _turn(ws, _create(stack, "hello", store=False))
        after = await _turn(ws, _create(stack, "and then?", store=False,
                                        previous_response_id=fresh[-1]["response"]["id"]))
    assert failed[-1]["type"] == "error" and failed[-1]["status"] == 400
    assert stale[-1]["type"] == "error" and stale[-1]["error"]["code"] == "previous_response_not_found"
    assert after[-1]["type"] == "response.completed"  # other ids are unaffected
    assert len(await _upstream_messages(stack)) == 3  # neither failed turn reached the upstream


async def test_a_failed_stream_also_evicts(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    async with aiohttp.ClientSession() as session, session.ws_connect(_ws_url(stack)) as ws:
        first = await _turn(ws, _create(stack, "hello", store=False))
        first_id = first[-1]["response"]["id"]
        # The upstream drops the connection mid-stream (the simulator's injected fault, a vendor field).
        broken = await _turn(ws, _create(stack, "and then?", store=False, previous_response_id=first_id,
                                         x_sim_fault="die_mid_stream"))
        stale = await _turn(ws, _create(stack, "and then?", store=False, previous_response_id=first_id))
    assert broken[-1]["type"] == "response.failed"
    assert stale[-1]["error"]["code"] == "previous_response_not_found"


async def test_transport_fields_and_other_messages_are_refused_in_band(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    async with aiohttp.ClientSession() as session, session.ws_connect(_ws_url(stack)) as ws:
        for name, value in (("stream", True), ("stream_options", {"include_usage": True}), ("background", True)):
            [error] = await _turn(ws, _create(stack, "hello", **{name: value}))
            assert error["status"] == 400 and error["error"]["param"] == name
        [unknown] = await _turn(ws, {"type": "session.update"})
        assert unknown["error"]["param"] == "type"
        await ws.send_str("not json")
        assert (await ws.receive_json(timeout=30))["error"]["code"] == "invalid_json"
        [missing] = await _turn(ws, _create(stack, "hello", model="nope"))
        assert missing["status"] == 404 and missing["error"]["code"] == "model_not_found"
        assert (await _turn(ws, _create(stack, "hello")))[-1]["type"] == "response.completed"  # still open


async def test_one_response_at_a_time(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, step_delay_ms=20)
    async with aiohttp.ClientSession() as session, session.ws_connect(_ws_url(stack)) as ws:
        await ws.send_json(_create(stack, "hello"))
        await ws.send_json(_create(stack, "and then?"))
        received = []
        while not received or received[-1]["type"] not in TERMINAL:
            received.append(await ws.receive_json(timeout=30))
    busy = [e for e in received if e["type"] == "error"]
    assert len(busy) == 1 and busy[0]["status"] == 409 and busy[0]["error"]["code"] == "response_in_progress"
    assert received[-1]["response"]["output"][0]["content"][0]["text"] == "Hi there."
    assert stack.stats.started == 1


async def test_closing_the_socket_cancels_the_upstream_request(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, step_delay_ms=20, upstream_options={"health_interval": 0})
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(_ws_url(stack))
        await ws.send_json(_create(stack, "hi", max_output_tokens=2000, ignore_eos=True))
        for _ in range(4):
            await ws.receive_json(timeout=30)
        await ws.close()
    for _ in range(200):
        if stack.stats.outcomes["cancelled"]:
            break
        await asyncio.sleep(0.02)
    assert stack.stats.outcomes["cancelled"] == 1 and stack.stats.outcomes["finished"] == 0
    # The client left: not the upstream's fault, so its replica is not counted against.
    [replica] = stack.gateway.app[STATE].routes[stack.model].replicas.state().values()
    assert replica == {"state": "healthy", "consecutive_failures": 0}


async def test_the_connection_time_limit(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, limits={"websocket_seconds": 0.5})
    async with aiohttp.ClientSession() as session, session.ws_connect(_ws_url(stack)) as ws:
        assert (await _turn(ws, _create(stack, "hello")))[-1]["type"] == "response.completed"
        limit = await ws.receive_json(timeout=30)
        assert limit["type"] == "error" and limit["error"]["code"] == "websocket_connection_limit_reached"
        closing = await ws.receive(timeout=30)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


async def test_auth_and_plain_get(aiohttp_server, vocab, monkeypatch):
    monkeypatch.setenv("GATEWAY_TEST_KEYS", "key-a")
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, auth={"api_keys_env": "GATEWAY_TEST_KEYS"})
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(_ws_url(stack), headers={"Authorization": "Bearer wrong"})
        assert refused.value.status == 401
        async with session.get(stack.url("/v1/responses"), headers={"Authorization": "Bearer key-a"}) as plain:
            assert plain.status == 405
        async with session.ws_connect(_ws_url(stack), headers={"Authorization": "Bearer key-a"}) as ws:
            assert (await _turn(ws, _create(stack, "hello")))[-1]["type"] == "response.completed"


async def test_each_turn_is_an_access_line_and_a_metrics_sample(aiohttp_server, vocab, caplog):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    with caplog.at_level(logging.INFO, logger="responses_gateway.access"):
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(_ws_url(stack), headers={"X-Request-Id": "conn-1"}) as ws:
                await _turn(ws, _create(stack, "hello"))
                await _turn(ws, _create(stack, "hello", previous_response_id="resp_gone"))
            async with session.get(stack.url("/metrics")) as scrape:
                metrics = await scrape.text()
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "responses_gateway.access"]
    turns = [line for line in lines if line["method"] == "WS"]
    assert [(t["request_id"], t["status"]) for t in turns] == [("conn-1.1", 200), ("conn-1.2", 400)]
    assert turns[0]["model"] == stack.model and turns[0]["output_tokens"] > 0
    assert turns[1]["error_code"] == "previous_response_not_found"
    [connection] = [line for line in lines if line["method"] == "GET" and line["path"] == "/v1/responses"]
    assert connection["request_id"] == "conn-1" and connection["turns"] == 2
    samples = {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(metrics)
               if family.name == "gateway_requests" for s in family.samples if s.name == "gateway_requests_total"}
    assert samples[(("model", stack.model), ("route", "responses"), ("status", "200"), ("stream", "true"),
                    ("upstream", "sim"))] == 1.0


async def test_a_draining_gateway_refuses_new_turns_on_open_sockets(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    async with aiohttp.ClientSession() as session, session.ws_connect(_ws_url(stack)) as ws:
        assert (await _turn(ws, _create(stack, "hello")))[-1]["type"] == "response.completed"
        stack.gateway.app[STATE].draining = True
        [going] = await _turn(ws, _create(stack, "hello"))
        assert going["status"] == 503 and going["error"]["code"] == "shutting_down"
        assert (await ws.receive(timeout=30)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert stack.stats.started == 1
