"""After a stream's `data: [DONE]` the upstream ends its chunked body, often in a later network read
(uvicorn, which serves vLLM, writes the ending as its own send). The gateway reads that ending, so the
connection serves the next request instead of every stream connecting anew (a TCP handshake, and a TLS
one to an https upstream). An upstream that sends no ending, or more than an ending, after `[DONE]` has
its connection closed; the client's answer never waits for any of it.

Real loopback servers: small aiohttp upstreams replaying a vLLM simulator stream, recording the client
port of each request (a new port is a new connection)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.test_stream_batching import MODEL, _recorded_frames


def _upstream(frames: list[bytes], ports: list[int], after_done: bytes | None, dropped: asyncio.Event
              ) -> web.Application:
    """Writes `frames` (ending with [DONE]), a loop turn later `after_done`, then ends the body; with
    `after_done` None it keeps the body open instead."""

    async def chat(request: web.Request) -> web.StreamResponse:
        ports.append(request.transport.get_extra_info("peername")[1])
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"".join(frames))
        try:
            await asyncio.sleep(0.01)  # the ending comes in a later read
            if after_done is None:
                await asyncio.sleep(30)
            else:
                await response.write(after_done)
                await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            dropped.set()
            raise
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _streams(aiohttp_server, upstream, count: int) -> list[float]:
    config = parse_config({"upstreams": {"up": {"urls": [str(upstream.make_url("")).rstrip("/")],
                                                "health_interval": 0}},
                           "models": {MODEL: {"upstream": "up", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "none"}}, base_dir=Path("."))
    gateway = await aiohttp_server(create_app(config))
    took = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.monotonic()
            async with session.post(gateway.make_url("/v1/responses"),
                                    json={"model": MODEL, "input": "hi", "stream": True}) as reply:
                assert reply.status == 200
                data = await reply.read()
            took.append(time.monotonic() - started)
            assert b"event: response.incomplete" in data or b"event: response.completed" in data, data[-300:]
            await asyncio.sleep(0.1)  # (the body's end is read after the client's answer, while it reads)
    return took


async def test_streams_one_after_another_share_one_upstream_connection(aiohttp_server):
    frames = await _recorded_frames(aiohttp_server, build_demo_vocab())
    ports: list[int] = []
    await _streams(aiohttp_server, await aiohttp_server(_upstream(frames, ports, b"", asyncio.Event())), 5)
    assert len(ports) == 5 and len(set(ports)) == 1, ports


async def test_an_upstream_that_sends_no_ending_after_done_has_its_connection_closed(aiohttp_server):
    frames = await _recorded_frames(aiohttp_server, build_demo_vocab())
    ports: list[int] = []
    dropped = asyncio.Event()
    took = await _streams(aiohttp_server, await aiohttp_server(_upstream(frames, ports, None, dropped)), 2)
    assert max(took) < 5  # the client's answer did not wait for the upstream's 30 s
    await asyncio.wait_for(dropped.wait(), 5)
    assert len(set(ports)) == 2  # the second stream had a connection of its own


async def test_an_upstream_that_sends_more_after_done_has_its_connection_closed(aiohttp_server):
    frames = await _recorded_frames(aiohttp_server, build_demo_vocab())
    ports: list[int] = []
    more = b": " + b"x" * (256 * 1024) + b"\n\n"  # past what an ending can be
    await _streams(aiohttp_server, await aiohttp_server(_upstream(frames, ports, more, asyncio.Event())), 3)
    assert len(set(ports)) == 3, ports
