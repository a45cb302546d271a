"""Many requests at once to one upstream: none waits on the gateway's own connection pool.

Each request in flight holds one upstream connection (a stream for as long as it runs). With a cap on
connections per upstream host, the request past it waited for one to free, and that wait counted as
the upstream's connect timeout: a 504 saying the upstream "did not accept a connection", and a fault
against a replica that had refused nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.server import raise_open_file_limit
from tests.e2e import start_stack

# Past the cap aiohttp's pool had (256 per host).
CONCURRENT = 300


async def test_more_requests_in_flight_than_the_old_pool_cap_are_all_served(aiohttp_server: Any, demo_vocab: Any):
    # Client, gateway and upstream share this process: four descriptors a request, as `serve` allows itself.
    raise_open_file_limit()
    resource = pytest.importorskip("resource")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < 4 * CONCURRENT + 200:
        pytest.skip(f"{soft} open files at most here: {CONCURRENT} requests at once need ~{4 * CONCURRENT}")
    # Each answer takes ~3 s upstream (5 steps of 600 ms); the connect budget is a fraction of that, so a
    # request waiting for a pooled connection would run out of it.
    stack = await start_stack(aiohttp_server, demo_vocab, step_delay_ms=600, timeouts={"connect": 0.3})
    body = {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}

    async def one(session: aiohttp.ClientSession) -> tuple[int, Any]:
        async with session.post(stack.url("/v1/chat/completions"), json=body,
                                headers={"Authorization": "Bearer test-key"}) as resp:
            return resp.status, await resp.json()

    most_in_flight = 0

    async def watch() -> None:
        nonlocal most_in_flight
        while True:
            most_in_flight = max(most_in_flight, stack.stats.snapshot()["in_flight"])
            await asyncio.sleep(0.02)

    watcher = asyncio.ensure_future(watch())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        answers = await asyncio.gather(*(one(session) for _ in range(CONCURRENT)))
    watcher.cancel()
    failed = [(status, answer) for status, answer in answers if status != 200]
    assert not failed, f"{len(failed)} of {CONCURRENT} failed, the first: {failed[0]}"
    assert all(answer["usage"]["completion_tokens"] == 5 for _, answer in answers)
    assert stack.stats.started == CONCURRENT
    assert most_in_flight > 256  # they were in flight upstream at once: past the old cap
