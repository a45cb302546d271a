"""Client disconnects at random points of a stream: every upstream request is cancelled, and
nothing (tasks, in-flight counts, upstream connections) is left behind."""

import asyncio
import random

import aiohttp

from gateway.app import STATE
from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import start_stack

CUTS = 25


async def test_every_disconnect_cancels_its_upstream_request(aiohttp_server):
    stack = await start_stack(aiohttp_server, build_demo_vocab(), step_delay_ms=5,
                              upstream_options={"health_interval": 0})
    state = stack.gateway.app[STATE]
    rng = random.Random(1234)
    tasks_before = len(asyncio.all_tasks())
    body = {"model": stack.model, "input": "hi", "stream": True, "max_output_tokens": 400, "ignore_eos": True,
            "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    for _ in range(CUTS):
        async with aiohttp.ClientSession() as session:
            response = await session.post(stack.url("/v1/responses"), json=body)
            await response.content.read(rng.randint(1, 6000))  # somewhere in the stream
            response.close()
    for _ in range(200):  # the cancellations travel through two servers
        if stack.stats.outcomes["cancelled"] == CUTS and state.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert stack.stats.started == CUTS
    assert stack.stats.outcomes["cancelled"] == CUTS and stack.stats.outcomes["finished"] == 0
    assert state.in_flight == 0
    assert all(r.in_flight == 0 for r in state.routes[stack.model].replicas.replicas)
    await asyncio.sleep(0.2)
    assert len(asyncio.all_tasks()) <= tasks_before + 1  # no handler or upstream task lingers
    connector = state.session.connector
    assert sum(len(v) for v in connector._acquired_per_host.values()) == 0  # no upstream connection held


async def test_a_slow_client_gets_backpressure_not_unbounded_buffering(aiohttp_server):
    """A client that stops reading: the gateway stops pulling from the upstream instead of buffering
    the whole answer (the simulator, driven by TCP backpressure, stays mid-stream)."""
    stack = await start_stack(aiohttp_server, build_demo_vocab(), upstream_options={"health_interval": 0},
                              max_model_len=200_000)
    body = {"model": stack.model, "input": "hi", "stream": True, "max_output_tokens": 150_000, "ignore_eos": True,
            "include": ["message.output_text.logprobs"], "top_logprobs": 20}
    reader, writer = await asyncio.open_connection(stack.gateway.host, stack.gateway.port)
    payload = __import__("json").dumps(body).encode()
    writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    await writer.drain()
    await reader.read(1000)  # the stream has begun; now the client stops reading
    await asyncio.sleep(1.5)
    # ~400 MB of events would follow: the gateway must not have pulled them all.
    assert stack.stats.outcomes["finished"] == 0 and stack.stats.outcomes["rejected"] == 0
    writer.close()
    for _ in range(200):
        if stack.stats.outcomes["cancelled"] == 1:
            break
        await asyncio.sleep(0.05)
    assert stack.stats.outcomes["cancelled"] == 1, (stack.stats.snapshot(), stack.gateway.app[STATE].in_flight)
