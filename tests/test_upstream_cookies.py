"""The upstream connection is shared by every client: nothing one upstream answer sets rides along on
the next request. A cookie an upstream (or a load balancer in front of it) sets in answer to one client
must not be sent upstream with another client's request, nor with a health check.

Real loopback servers: the vLLM simulator, with a middleware that sets a cookie on every answer (as a
sticky-session load balancer does) and records the Cookie header of each request it gets."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.vllm import create_app as vllm_app


def _cookie_setting_upstream(seen: list[str | None]) -> web.Application:
    @web.middleware
    async def record(request: web.Request, handler):
        seen.append(request.headers.get("Cookie"))
        return await handler(request)

    async def sticky(request: web.Request, response: web.StreamResponse) -> None:
        # (a header, not set_cookie: aiohttp reads the cookies into the headers before this hook runs)
        response.headers.add("Set-Cookie", f"sticky=client-{len(seen)}; Path=/")  # streamed or not

    app = vllm_app(build_demo_vocab(), "m")
    app.middlewares.append(record)
    app.on_response_prepare.append(sticky)
    return app


@pytest.mark.parametrize(("stream", "cap"), [(False, 4), (True, 4), (True, None)])  # None: the long-stream pool
async def test_a_cookie_the_upstream_sets_is_never_sent_back_for_the_next_client(aiohttp_server, stream, cap):
    seen: list[str | None] = []
    upstream = await aiohttp_server(_cookie_setting_upstream(seen))
    # By name, as upstreams are in a deployment (`http://vllm:8000`): aiohttp's default jar ignores cookies
    # from an IP address, so 127.0.0.1 would hide what a named upstream's cookies do.
    named = f"http://localhost:{upstream.port}"
    config = parse_config({"upstreams": {"up": {"urls": [named],
                                                "health_interval": 0}},
                           "models": {"m": {"upstream": "up", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "memory"}}, base_dir=Path("."))
    gateway = await aiohttp_server(create_app(config))
    for client in range(3):
        async with aiohttp.ClientSession() as session, session.post(
                gateway.make_url("/v1/responses"),
                json={"model": "m", "input": f"hello from client {client}", "stream": stream,
                      **({} if cap is None else {"max_output_tokens": cap})}) as reply:
            assert reply.status == 200, await reply.text()
            await reply.read()
    assert len(seen) >= 3
    assert seen == [None] * len(seen), seen
