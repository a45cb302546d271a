"""An upstream's whole (non-streamed) answer is read up to `limits.max_upstream_body_bytes`: an upstream
that keeps sending (a wrong URL, a broken proxy, a compressed body that inflates without end) gets the
client a 502 that names the limit, and its connection is dropped, instead of growing the gateway's
memory, which every client shares, until the total timeout. An error answer is read up to 1 MiB; past it
the upstream's status alone is its verdict.

Real loopback servers: the vLLM simulator, behind middlewares that send its answers chunked or gzipped
(what a proxy in front of a server may do), and small aiohttp upstreams for the broken answers."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.vllm import create_app as vllm_app

LIMIT = 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _gateway(aiohttp_server, upstream, limit: int = LIMIT) -> str:
    # Two replicas (one server, two names): an answer too large is not tried again on the other.
    urls = [f"http://127.0.0.1:{upstream.port}", f"http://localhost:{upstream.port}"]
    config = parse_config({"upstreams": {"up": {"urls": urls, "health_interval": 0, "retries": 1}},
                           "models": {"m": {"upstream": "up", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "none"}, "limits": {"max_upstream_body_bytes": limit}},
                          base_dir=Path("."))
    gateway = await aiohttp_server(create_app(config))
    return str(gateway.make_url("/v1/responses"))


async def _ask(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(
            url, json={"model": "m", "input": "tell me a story", "max_output_tokens": 40,
                       "include": ["message.output_text.logprobs"], "top_logprobs": 3}) as reply:
        return reply.status, await reply.json()


def _simulator(reshape: Callable[[web.Request, web.Response], Awaitable[web.StreamResponse]] | None,
               seen: list[int]) -> web.Application:
    @web.middleware
    async def resend(request: web.Request, handler: Handler) -> web.StreamResponse:
        seen.append(1)
        response = await handler(request)
        return response if reshape is None else await reshape(request, response)

    app = vllm_app(build_demo_vocab(), "m")
    app.middlewares.append(resend)
    return app


async def _chunked(request: web.Request, response: web.Response) -> web.StreamResponse:
    body = response.body
    streamed = web.StreamResponse(status=response.status, headers={"Content-Type": response.content_type})
    streamed.enable_chunked_encoding()
    await streamed.prepare(request)
    for start in range(0, len(body), 1000):
        await streamed.write(body[start:start + 1000])
    await streamed.write_eof()
    return streamed


async def _gzipped(request: web.Request, response: web.Response) -> web.StreamResponse:
    response.enable_compression(force=web.ContentCoding.gzip)
    return response


@pytest.mark.parametrize("reshape", [_chunked, _gzipped])
async def test_an_answer_without_a_plain_length_is_read_whole_and_bounded(aiohttp_server, reshape):
    seen: list[int] = []
    plain = await _ask(await _gateway(aiohttp_server, await aiohttp_server(_simulator(None, seen))))
    reshaped_upstream = await aiohttp_server(_simulator(reshape, seen))
    status, body = await _ask(await _gateway(aiohttp_server, reshaped_upstream))
    assert (status, plain[0]) == (200, 200), body
    assert body["output"][0]["content"] == plain[1]["output"][0]["content"]  # read through the counting path
    assert body["output"][0]["content"][0]["logprobs"]
    del seen[:]
    status, body = await _ask(await _gateway(aiohttp_server, reshaped_upstream, limit=1000))  # well below it
    assert status == 502, body
    assert "limits.max_upstream_body_bytes" in body["error"]["message"]
    assert "larger than 1000 bytes" in body["error"]["message"]
    assert len(seen) == 1  # not tried again on the other replica: it would send the same answer


def _broken_upstream(write: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", write)
    return app


async def test_an_answer_that_never_ends_is_dropped_at_the_limit(aiohttp_server):
    stopped = asyncio.Event()

    async def unending(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        sent_all = False
        try:
            for _ in range(64):  # 64 x the limit at most
                await response.write(b" " * LIMIT)
            sent_all = True
        finally:  # (a write fails, or the handler is cancelled, when the gateway drops the connection)
            if not sent_all:
                stopped.set()
        return response

    status, body = await _ask(await _gateway(aiohttp_server, await aiohttp_server(_broken_upstream(unending))))
    assert status == 502, body
    assert f"larger than {LIMIT} bytes" in body["error"]["message"]
    assert body["error"]["code"] == "upstream_error"
    await asyncio.wait_for(stopped.wait(), 10)


async def test_an_answer_whose_length_says_too_large_is_not_read(aiohttp_server):
    stopped = asyncio.Event()

    async def declared(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 100 * LIMIT
        await response.prepare(request)
        try:
            for _ in range(100):
                await response.write(b" " * LIMIT)
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.CancelledError):
            stopped.set()
            raise
        return response

    status, body = await _ask(await _gateway(aiohttp_server, await aiohttp_server(_broken_upstream(declared))))
    assert status == 502, body
    assert f"its Content-Length says {100 * LIMIT}" in body["error"]["message"]
    await asyncio.wait_for(stopped.wait(), 10)


async def test_a_compressed_answer_that_inflates_past_the_limit_is_refused(aiohttp_server):
    bomb = gzip.compress(b" " * (16 * LIMIT))  # ~16 KB on the wire

    async def inflating(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})

    assert len(bomb) < LIMIT
    status, body = await _ask(await _gateway(aiohttp_server, await aiohttp_server(_broken_upstream(inflating))))
    assert status == 502, body
    assert f"larger than {LIMIT} bytes" in body["error"]["message"]


async def test_an_error_answer_past_a_mebibyte_keeps_its_status_without_its_text(aiohttp_server):
    async def refusing(request: web.Request) -> web.Response:
        await request.read()
        text = "x" * (2 * 1024 * 1024)
        return web.json_response({"error": {"message": text, "type": "BadRequestError", "code": 400}}, status=400)

    status, body = await _ask(await _gateway(aiohttp_server, await aiohttp_server(_broken_upstream(refusing))))
    assert status == 400, body  # the upstream's verdict on the request is kept
    assert "xxxx" not in body["error"]["message"]
    assert len(body["error"]["message"]) < 1000
