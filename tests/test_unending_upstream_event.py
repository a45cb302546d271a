"""An upstream stream that never ends an event is broken, not slow: the gateway stops reading it at
sse.MAX_EVENT_BYTES (what it would hold for the event meanwhile) instead of growing its memory, shared by
every client, until the total timeout. The client gets the failure as any other broken stream: a 502
before the stream began, `response.failed` after; the upstream connection is dropped.

Real loopback servers: a small aiohttp upstream that writes a first chunk and then a line that never
ends (what a wrong URL or a broken proxy can send)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import orjson
import pytest
from aiohttp import web

from gateway import app as gateway_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.sse import MAX_EVENT_BYTES

MIB = b"x" * (1024 * 1024)


def _unending_upstream(first_event: bool, stopped: asyncio.Event) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if first_event:
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b'data: {"id": "')
        sent_all = False
        try:
            for _ in range(2 * MAX_EVENT_BYTES // len(MIB)):  # never a line break; twice the bound at most
                await response.write(MIB)
            sent_all = True
        finally:  # (a write fails, or the handler is cancelled, when the gateway drops the connection)
            if not sent_all:
                stopped.set()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _gateway(aiohttp_server, upstream) -> openai.AsyncOpenAI:
    config = parse_config({"upstreams": {"up": {"urls": [str(upstream.make_url("")).rstrip("/")],
                                                "health_interval": 0, "retries": 0}},
                           "models": {"m": {"upstream": "up", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "none"}}, base_dir=Path("."))
    gateway = await aiohttp_server(create_app(config))
    return openai.AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key="none", max_retries=0)


async def test_a_stream_whose_event_never_ends_fails_and_the_upstream_is_dropped(aiohttp_server):
    stopped = asyncio.Event()
    client = await _gateway(aiohttp_server, await aiohttp_server(_unending_upstream(True, stopped)))
    stream = await client.responses.create(model="m", input="hi", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.failed"
    assert "without ending an event" in events[-1].response.error.message
    assert "hi" in [event.delta for event in events if event.type == "response.output_text.delta"]
    await asyncio.wait_for(stopped.wait(), 10)


async def test_before_any_event_it_is_an_upstream_error_the_client_may_retry(aiohttp_server, monkeypatch):
    # The answer begins once the first event came or a short hold passed (gateway.app): held longer here, so
    # that the bound is always reached before it, however slow the machine reads the upstream's bytes.
    monkeypatch.setattr(gateway_app, "_FIRST_EVENT_HOLD_SECONDS", 60.0)
    stopped = asyncio.Event()
    client = await _gateway(aiohttp_server, await aiohttp_server(_unending_upstream(False, stopped)))
    with pytest.raises(openai.APIStatusError) as raised:
        await client.responses.create(model="m", input="hi", stream=True)
    assert raised.value.status_code == 502 and "without ending an event" in raised.value.message
    await asyncio.wait_for(stopped.wait(), 10)
