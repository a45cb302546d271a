"""A bounded fuzz over upstream faults: every fault class x streamed/whole x one and three replicas.

Sick replicas are real vLLM simulators told to misbehave on every request (its `x-sim-fault`
hooks, see gateway/simulator/faults.py) or a loopback server answering malformed JSON; healthy
ones are plain simulators. What must hold whatever happens:

- no 503 while a replica is reachable (a 503 only when every replica fails its health check);
- with one replica, once it is well again the very next request is served (no lockout);
- with three, the sick ones are ejected (the `replica_ejected` log line) and the rest is served;
- an upstream's verdict on the request (400, in band or not; 429) ejects nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.app import STATE, create_app
from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.vllm import create_app as vllm_app

# fault -> is it the replica's fault (counts toward ejection)?
FAULTS = {
    "refuse": True, "http500": True, "http503": True, "hang": True, "hang_before_first_token": True,
    "die_mid_stream": True, "error_mid_stream": True, "malformed": True,
    "http400": False, "http429": False,
}
REQUESTS = 7  # more than eject_after (5)
MAX_REQUESTS = 40


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def _sick(vocab, fault: str, sick: dict[str, bool]) -> web.Application:
    """A vLLM simulator that answers every request with `fault` while sick["now"] is true
    ("malformed": a body that is not JSON, or a stream event that is not)."""

    @web.middleware
    async def inject(request: web.Request, handler):
        if not sick["now"] or not request.path.startswith("/v1/"):
            return await handler(request)
        if fault == "malformed":
            if not (await request.json()).get("stream"):
                return web.Response(body=b'{"choices": [}', content_type="application/json")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"choices": [}\n\n')
            await response.write_eof()
            return response
        return await handler(request.clone(headers={**request.headers, "x-sim-fault": fault,
                                                    "x-sim-die-after": "2"}))

    app = vllm_app(vocab, "m")
    app.middlewares.append(inject)
    return app


async def _gateway(aiohttp_server, urls: list[str]):
    config = parse_config({"upstreams": {"up": {"urls": urls, "health_interval": 0, "retries": 2,
                                                "timeouts": {"first_token": 0.3, "idle": 0.5}}},
                           "models": {"m": {"upstream": "up", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "memory"}}, base_dir=Path("."))
    return await aiohttp_server(create_app(config))


async def _ask(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[int, str | None]:
    """(status, the terminal event type of a stream or None)."""
    body = {"model": "m", "input": "hi", "max_output_tokens": 4, "stream": stream}
    async with session.post(url, json=body) as reply:
        raw = await reply.read()
    if reply.status != 200 or not stream:
        return reply.status, None
    frames = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    return reply.status, frames[-1]["type"] if frames else None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("replicas", [1, 3])
async def test_upstream_faults_never_take_a_reachable_model_away(aiohttp_server, vocab, caplog, fault, stream,
                                                               replicas, unused_tcp_port):
    caplog.set_level("INFO", logger="responses_gateway")
    sick = {"now": True}
    urls = []
    for index in range(replicas):
        if index == replicas - 1 and replicas > 1:
            server = await aiohttp_server(vllm_app(vocab, "m"))  # the one healthy replica of three
        elif fault == "refuse":
            urls.append(f"http://127.0.0.1:{unused_tcp_port + index}")  # nothing listens there
            continue
        else:
            server = await aiohttp_server(_sick(vocab, fault, sick))
        urls.append(str(server.make_url("")).rstrip("/"))
    gateway = await _gateway(aiohttp_server, urls)
    url = str(gateway.make_url("/v1/responses"))
    outcomes = []
    ejected: list[dict] = []
    async with aiohttp.ClientSession() as session:
        # One replica: a fixed number of requests. Three: until both sick ones are ejected (the
        # choice rotates, so how many requests that takes varies), at most MAX_REQUESTS.
        while len(outcomes) < (REQUESTS if replicas == 1 or not FAULTS[fault] else MAX_REQUESTS):
            outcomes.append(await _ask(session, url, stream))
            ejected = [json.loads(r.message) for r in caplog.records if '"replica_ejected"' in r.message]
            if replicas > 1 and len(ejected) == 2:
                outcomes.append(await _ask(session, url, stream))  # one more, with both sitting out
                break
        sick["now"] = False  # the sick replicas recover (a refused port stays refused)
        recovered = await _ask(session, url, stream)
    statuses = [status for status, _ in outcomes]
    assert 503 not in statuses, outcomes  # a replica was reachable every time
    if not FAULTS[fault]:  # the upstream's verdict: passed on, and no host failure
        expected = 400 if fault == "http400" else 429
        assert set(statuses) <= ({expected, 200} if replicas > 1 else {expected})
        assert ejected == []
        return
    if replicas == 1:
        # One replica is never ejected by traffic (it is the last healthy one) ...
        assert ejected == []
        assert any('"replica_ejection_skipped"' in r.message for r in caplog.records)
        if fault != "refuse":  # ... so once it is well, the very next request is served.
            assert recovered == (200, "response.incomplete" if stream else None)
        return
    # Three: the two sick ones are ejected once each, with their reason; the healthy one serves.
    assert sorted(e["replica"] for e in ejected) == sorted(urls[:2]), ejected
    assert all(e["consecutive_failures"] == 5 and e["ejected_for_s"] == 10.0 for e in ejected)
    # A stream whose replica fails after the gateway began answering cannot move elsewhere.
    before_first_byte = fault not in ("die_mid_stream", "error_mid_stream", "hang_before_first_token") or not stream
    if before_first_byte:  # retried on another replica before the client got anything
        assert set(statuses) == {200}, outcomes
    assert outcomes[-1] == (200, "response.incomplete" if stream else None)  # the sick ones sit out now
    state = gateway.app[STATE].routes["m"].replicas.state()
    assert [state[u]["state"] for u in urls] == ["ejected", "ejected", "healthy"]
