"""Routing across replicas, health, auth, request ids, limits and metrics — real loopback servers."""

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from gateway.app import STATE, create_app
from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.vllm import SIMULATOR_KEY
from gateway.simulator.vllm import create_app as create_simulator

MODEL = "demo-model"


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def _broken_upstream(kind: str) -> web.Application:
    """A real server on loopback that misbehaves the way a sick replica does."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if kind == "http500":
            return web.json_response({"error": {"message": "engine died"}}, status=500)
        await asyncio.sleep(3600)  # "hang": never answers
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


async def _gateway(aiohttp_server, urls, **upstream):
    config = parse_config({"upstreams": {"sim": {"urls": urls, **upstream}},
                           "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"},
                                              "aliases": ["demo-alias"]}},
                           "store": {"backend": "memory"}}, base_dir=__import__("pathlib").Path("."))
    return await aiohttp_server(create_app(config))


async def _post(url, body, headers=None):
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers or {}) as reply:
        return reply.status, await reply.json(content_type=None), reply.headers


def _url(server) -> str:
    return str(server.make_url("")).rstrip("/")


BODY = {"model": MODEL, "input": "hi", "max_output_tokens": 4}


@pytest.mark.parametrize("fault", ["refuse", "http500", "hang"])
async def test_a_sick_replica_is_retried_elsewhere_and_five_faults_in_a_row_eject_it(aiohttp_server, unused_tcp_port,
                                                                                    vocab, fault, caplog):
    good = await aiohttp_server(create_simulator(vocab, MODEL))
    bad_url = f"http://127.0.0.1:{unused_tcp_port}" if fault == "refuse" else _url(
        await aiohttp_server(_broken_upstream(fault)))
    gateway = await _gateway(aiohttp_server, [bad_url, _url(good)], health_interval=0, retries=1,
                             timeouts={"first_token": 0.3})
    state = gateway.app[STATE]
    replicas = state.routes[MODEL].replicas
    sick = replicas.replicas[0]
    kind = {"refuse": "connect", "http500": "http_500", "hang": "timeout"}[fault]
    caplog.set_level("INFO", logger="responses_gateway")
    for attempt in range(1, 6):
        replicas.replicas[1].in_flight = 1  # make the sick one the first choice
        status, payload, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)
        replicas.replicas[1].in_flight = 0
        assert status == 200 and payload["status"] == "incomplete"  # retried on the good replica
        assert state.metrics.upstream_errors.labels("sim", bad_url, kind)._value.get() == attempt
        assert (sick.ejected_until > 0) == (attempt == 5)  # the fifth fault in a row ejects it
    ejected = [json.loads(r.message) for r in caplog.records if '"replica_ejected"' in r.message]
    assert [(e["replica"], e["reason"], e["consecutive_failures"], e["ejected_for_s"]) for e in ejected] == [
        (bad_url, kind, 5, 10.0)]
    async with aiohttp.ClientSession() as session, session.get(str(gateway.make_url("/metrics"))) as reply:
        scraped = await reply.text()
    ejections = [line for line in scraped.splitlines() if line.startswith("gateway_replica_ejections_total{")]
    assert ejections == [f'gateway_replica_ejections_total{{kind="{kind}",replica="{bad_url}",upstream="sim"}} 1.0']
    # Ejected, it is no longer tried while the other replica is healthy.
    status, _, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)
    assert status == 200 and state.metrics.upstream_errors.labels("sim", bad_url, kind)._value.get() == 5


@pytest.mark.parametrize(("fault", "status", "code"), [("http500", 502, "upstream_error"),
                                                      ("hang", 504, "upstream_timeout")])
async def test_when_every_replica_fails_the_client_gets_a_clear_error(aiohttp_server, vocab, fault, status, code):
    bad = [_url(await aiohttp_server(_broken_upstream(fault))) for _ in range(2)]
    gateway = await _gateway(aiohttp_server, bad, health_interval=0, retries=1, timeouts={"first_token": 0.3},
                             eject_after=1)
    got, payload, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)
    assert got == status and payload["error"]["code"] == code
    # One is ejected now, the other was the last healthy one and is not: both are still tried
    # (the ejected one in panic), so the client hears what the upstream did, never a bare 503.
    replicas = gateway.app[STATE].routes[MODEL].replicas.replicas
    assert sorted(r.ejected_until > 0 for r in replicas) == [False, True]
    got, payload, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)
    assert got == status and payload["error"]["code"] == code


async def test_dying_mid_stream_fails_the_stream_and_counts_one_fault(aiohttp_server, vocab):
    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    gateway = await _gateway(aiohttp_server, [_url(sim)], health_interval=0)
    body = {**BODY, "stream": True, "x_sim_fault": "die_mid_stream"}
    async with aiohttp.ClientSession() as session, session.post(str(gateway.make_url("/v1/responses")),
                                                                json=body) as reply:
        frames = [line for line in (await reply.text()).splitlines() if line.startswith("data: ")]
    assert json.loads(frames[-1][6:])["type"] == "response.failed"
    state = gateway.app[STATE]
    replica = state.routes[MODEL].replicas.replicas[0]
    assert replica.failures == 1 and replica.ejected_until == 0
    assert state.metrics.upstream_errors.labels("sim", _url(sim), "mid_stream")._value.get() == 1
    status, _, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)  # at once: served
    assert status == 200 and replica.failures == 0


async def test_readiness_follows_active_health_checks(aiohttp_server, unused_tcp_port, vocab):
    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    healthy = await _gateway(aiohttp_server, [_url(sim)], health_interval=0.05)
    dead = await _gateway(aiohttp_server, [f"http://127.0.0.1:{unused_tcp_port}"], health_interval=0.05)
    await asyncio.sleep(0.3)
    async with aiohttp.ClientSession() as session:
        async with session.get(str(healthy.make_url("/readyz"))) as reply:
            assert reply.status == 200
        async with session.get(str(dead.make_url("/readyz"))) as reply:
            assert reply.status == 503
            assert MODEL in (await reply.json())["models_without_replica"]
        async with session.get(str(dead.make_url("/healthz"))) as reply:
            assert reply.status == 200  # alive, just not ready
    # A replica that fails its check takes no traffic.
    status, payload, headers = await _post(str(dead.make_url("/v1/responses")), BODY)
    assert status == 503 and payload["error"]["code"] == "upstream_unavailable"
    assert headers["Retry-After"] == "1"  # the health checks' period, rounded up


async def test_draining_refuses_new_requests_and_turns_readiness_off(aiohttp_server, vocab):
    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    gateway = await _gateway(aiohttp_server, [_url(sim)], health_interval=0)
    gateway.app[STATE].draining = True
    status, payload, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)
    assert status == 503 and payload["error"]["code"] == "shutting_down"
    async with aiohttp.ClientSession() as session, session.get(str(gateway.make_url("/readyz"))) as reply:
        assert reply.status == 503


async def test_model_aliases_route_to_the_same_upstream(aiohttp_server, vocab):
    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    gateway = await _gateway(aiohttp_server, [_url(sim)], health_interval=0)
    status, payload, _ = await _post(str(gateway.make_url("/v1/responses")), {**BODY, "model": "demo-alias"})
    assert status == 200 and payload["model"] == "demo-alias"
    assert sim.app[SIMULATOR_KEY].stats.recent[-1]["body"]["model"] == MODEL


async def test_request_id_is_accepted_returned_and_sent_upstream(aiohttp_server, vocab):
    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    gateway = await _gateway(aiohttp_server, [_url(sim)], health_interval=0)
    _, _, headers = await _post(str(gateway.make_url("/v1/responses")), BODY, {"X-Request-Id": "abc-123"})
    assert headers["X-Request-Id"] == "abc-123"
    sent = {k.lower(): v for k, v in sim.app[SIMULATOR_KEY].stats.recent[-1]["headers"].items()}
    assert sent["x-request-id"] == "abc-123"
    _, _, headers = await _post(str(gateway.make_url("/v1/responses")), BODY, {"X-Request-Id": "bad id!"})
    assert headers["X-Request-Id"] != "bad id!" and len(headers["X-Request-Id"]) == 32


async def test_api_keys_and_the_client_key_never_reaches_the_upstream(aiohttp_server, vocab, monkeypatch):
    monkeypatch.setenv("TEST_GATEWAY_KEYS", "key-one, key-two")
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "upstream-secret")
    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    config = parse_config({"auth": {"api_keys_env": "TEST_GATEWAY_KEYS"},
                           "upstreams": {"sim": {"urls": [_url(sim)], "health_interval": 0}},
                           "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "memory"}},
                          base_dir=__import__("pathlib").Path("."))
    gateway = await aiohttp_server(create_app(config))
    url = str(gateway.make_url("/v1/responses"))
    status, payload, _ = await _post(url, BODY)
    assert status == 401 and payload["error"]["code"] == "invalid_api_key"
    status, _, _ = await _post(url, BODY, {"Authorization": "Bearer key-three"})
    assert status == 401
    status, _, _ = await _post(url, BODY, {"Authorization": "Bearer key-two"})
    assert status == 200
    sent = {k.lower() for k in sim.app[SIMULATOR_KEY].stats.recent[-1]["headers"]}
    assert "authorization" not in sent
    async with aiohttp.ClientSession() as session, session.get(str(gateway.make_url("/healthz"))) as reply:
        assert reply.status == 200  # probes need no key
    # With an upstream credential configured, that one (and only that one) goes upstream.
    config = parse_config({"auth": {"api_keys_env": "TEST_GATEWAY_KEYS"},
                           "upstreams": {"sim": {"urls": [_url(sim)], "health_interval": 0,
                                                 "api_key_env": "TEST_UPSTREAM_KEY"}},
                           "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "memory"}},
                          base_dir=__import__("pathlib").Path("."))
    gateway = await aiohttp_server(create_app(config))
    async with aiohttp.ClientSession() as session, session.post(
        str(gateway.make_url("/v1/responses")), json=BODY, headers={"Authorization": "Bearer key-one"}
    ) as reply:
        assert reply.status == 200
    sent = {k.lower(): v for k, v in sim.app[SIMULATOR_KEY].stats.recent[-1]["headers"].items()}
    assert "authorization" in sent  # the simulator redacts the value it records


async def test_a_running_stream_is_in_the_upstream_latency_before_it_ends(aiohttp_server, vocab):
    # Request metrics wait for the answer (middleware.after_answer); the time to upstream headers of a
    # stream, which may run for minutes, is observed when the headers come.
    sim = await aiohttp_server(create_simulator(vocab, MODEL, step_delay_ms=300))
    gateway = await _gateway(aiohttp_server, [_url(sim)], health_interval=0)
    async with aiohttp.ClientSession() as session, session.post(
            str(gateway.make_url("/v1/responses")), json={**BODY, "stream": True}) as reply:
        assert reply.status == 200
        await reply.content.readline()  # the stream has begun; its last steps are seconds away
        async with session.get(str(gateway.make_url("/metrics"))) as scrape:
            text = await scrape.text()
        assert not reply.content.at_eof()
        await reply.read()
    counts = [line for line in text.splitlines() if line.startswith("gateway_upstream_latency_seconds_count")]
    assert counts and float(counts[0].rsplit(" ", 1)[1]) == 1
    assert "gateway_request_duration_seconds_count{" not in text  # the request's own figures: at its end


async def test_oversized_bodies_get_an_openai_shaped_413(aiohttp_server, vocab):
    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    config = parse_config({"limits": {"max_body_bytes": 1024},
                           "upstreams": {"sim": {"urls": [_url(sim)], "health_interval": 0}},
                           "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "memory"}},
                          base_dir=__import__("pathlib").Path("."))
    gateway = await aiohttp_server(create_app(config))
    status, payload, _ = await _post(str(gateway.make_url("/v1/responses")), {**BODY, "input": "x" * 5000})
    assert status == 413 and payload["error"]["code"] == "request_too_large"


async def test_metrics_after_a_run_hold_every_family(aiohttp_server, vocab):
    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    gateway = await _gateway(aiohttp_server, [_url(sim)], health_interval=0)
    url = str(gateway.make_url("/v1/responses"))
    await _post(url, {**BODY, "include": ["message.output_text.logprobs"], "top_logprobs": 2})
    async with aiohttp.ClientSession() as session, session.post(url, json={**BODY, "stream": True}) as reply:
        await reply.read()
    await _post(url, {**BODY, "top_logprobs": 21})
    async with aiohttp.ClientSession() as session, session.get(str(gateway.make_url("/metrics"))) as reply:
        text = await reply.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            samples[name_labels] = float(value)

    def total(prefix):
        return sum(v for k, v in samples.items() if k.startswith(prefix))

    assert total('gateway_requests_total{model="demo-model"') == 2
    assert total("gateway_request_duration_seconds_count") == 2
    assert total("gateway_time_to_first_token_seconds_count") == 2
    assert total("gateway_time_per_output_token_seconds_count") == 2
    assert total('gateway_tokens_total{direction="out"') == 8
    assert total('gateway_tokens_total{direction="in"') > 0
    assert total("gateway_upstream_latency_seconds_count") == 2
    assert total("gateway_logprob_tokens_from_ids_total") == 8
    assert "gateway_in_flight_requests" in text and "gateway_upstream_errors_total" in text
    assert "gateway_logprob_tokens_aligned_total" in text and "gateway_logprob_sentinels_mapped_total" in text
    assert "gateway_logprob_ambiguous_positions_total" in text and "gateway_logprob_collisions_resolved_total" in text
    assert total("gateway_requests_refused_unsupported_total") == 0  # 21 is a validation error, not a refusal


async def test_access_log_has_no_prompt_unless_bodies_are_turned_on(aiohttp_server, vocab, caplog):
    import logging

    sim = await aiohttp_server(create_simulator(vocab, MODEL))
    for log_bodies in (False, True):
        config = parse_config({"logging": {"log_bodies": log_bodies},
                               "upstreams": {"sim": {"urls": [_url(sim)], "health_interval": 0}},
                               "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
                               "store": {"backend": "memory"}}, base_dir=__import__("pathlib").Path("."))
        gateway = await aiohttp_server(create_app(config))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="responses_gateway.access"):
            await _post(str(gateway.make_url("/v1/responses")), {**BODY, "input": "secret prompt"},
                        {"Authorization": "Bearer sk-very-secret"})
        [line] = [json.loads(r.getMessage()) for r in caplog.records if r.name == "responses_gateway.access"]
        assert line["status"] == 200 and line["model"] == MODEL and line["output_tokens"] == 4
        assert "sk-very-secret" not in json.dumps(line)
        assert ("secret prompt" in json.dumps(line)) is log_bodies


async def test_a_timeout_while_the_gateways_own_loop_was_stalled_is_no_replica_fault(aiohttp_server, vocab, caplog):
    hung = await aiohttp_server(_broken_upstream("hang"))
    gateway = await _gateway(aiohttp_server, [_url(hung)], health_interval=0, timeouts={"first_token": 0.3})
    state = gateway.app[STATE]
    replica = state.routes[MODEL].replicas.replicas[0]
    caplog.set_level("INFO", logger="responses_gateway")
    status, _, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)
    assert status == 504 and replica.failures == 1  # an idle loop: the upstream's fault
    # Now the loop itself is blocked for longer than the whole wait (as a saturated gateway is).
    asyncio.get_running_loop().call_later(0.05, __import__("time").sleep, 0.4)
    status, _, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)
    assert status == 504 and replica.failures == 1  # not counted
    excused = [json.loads(r.message) for r in caplog.records if '"timeout_excused"' in r.message]
    assert len(excused) == 1 and excused[0]["loop_stalled_s"] >= 0.15 and excused[0]["kind"] == "timeout"


async def test_readiness_agrees_with_the_replica_state_the_router_uses(aiohttp_server, unused_tcp_port, vocab):
    good = await aiohttp_server(create_simulator(vocab, MODEL))
    dead = f"http://127.0.0.1:{unused_tcp_port}"
    gateway = await _gateway(aiohttp_server, [dead, _url(good)], health_interval=0, retries=1, eject_after=1)
    replicas = gateway.app[STATE].routes[MODEL].replicas.replicas
    replicas[1].in_flight = 1  # the dead one is the first choice
    status, _, _ = await _post(str(gateway.make_url("/v1/responses")), BODY)
    replicas[1].in_flight = 0
    assert status == 200
    async with aiohttp.ClientSession() as session, session.get(str(gateway.make_url("/readyz"))) as reply:
        ready = await reply.json()
    assert reply.status == 200 and ready["status"] == "ready"
    states = ready["upstreams"]["sim"]
    assert states[dead]["state"] == "ejected" and states[dead]["ejected_for_s"] > 0
    assert states[_url(good)] == {"state": "healthy", "consecutive_failures": 0}
