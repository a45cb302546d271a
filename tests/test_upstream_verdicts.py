"""The upstream's verdict on a request reaches the client as that verdict: status, message, param.

Real loopback servers throughout: the dialect simulators (whose refusals are the servers' own
wording, cited there), and small aiohttp apps where a server's behaviour needs no simulator (a
429 with Retry-After, a 401, vLLM's in-band error frame in a 200 stream)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from gateway.app import STATE, create_app
from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.upstreams.verdicts import UpstreamFault
from tests.e2e import LOGPROBS, start_stack

LONG_INPUT = "hello " * 120  # well past the small contexts below


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


async def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers or {}) as reply:
        return reply.status, await reply.json(content_type=None), dict(reply.headers)


def _counted():
    """A loopback server that counts its requests and answers with `answer(n)` (n from 1)."""
    seen: list[dict] = []

    def wrap(answer):
        async def handler(request: web.Request) -> web.StreamResponse:
            seen.append(await request.json())
            return await answer(request, len(seen))

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        return app

    return seen, wrap


async def _gateway(aiohttp_server, urls: list[str], **upstream):
    config = parse_config({"upstreams": {"up": {"urls": urls, "health_interval": 0, **upstream}},
                           "models": {"m": {"upstream": "up", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "memory"}}, base_dir=Path("."))
    return await aiohttp_server(create_app(config))


def _base(server) -> str:
    return str(server.make_url("")).rstrip("/")


# --- context length, per server ----------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "options", "status", "wording"), [
    ("vllm", {"max_model_len": 64}, 400, "maximum context length is 64 tokens"),
    ("tgi", {"max_total_tokens": 64}, 422, "`inputs` tokens + `max_new_tokens` must be <= 64"),  # TGI's status
    ("sglang", {"context_length": 64}, 400, "is longer than the model's context length (64 tokens)"),
    ("llamacpp", {"n_ctx": 64}, 400, "exceeds the available context size"),
])
async def test_each_servers_context_length_refusal_keeps_its_status_with_context_length_exceeded(
        aiohttp_server, vocab, dialect, options, status, wording):
    stack = await start_stack(aiohttp_server, vocab, dialect=dialect, **options)
    got, payload, _ = await _post(stack.url("/v1/responses"),
                                  {"model": stack.model, "input": LONG_INPUT, "max_output_tokens": 16})
    error = payload["error"]
    assert got == status, payload
    assert wording in error["message"]  # the server's own words, not the gateway's
    assert (error["type"], error["code"]) == ("invalid_request_error", "context_length_exceeded")
    assert error["param"] in ("input", "max_output_tokens")  # the client's names, never the upstream's
    assert stack.stats.started == 1


async def test_the_openai_sdk_raises_bad_request_after_one_upstream_request(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, max_model_len=64)
    client = openai.AsyncOpenAI(base_url=stack.url("/v1"), api_key="k")  # the SDK's default retries (2)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=stack.model, input=LONG_INPUT, max_output_tokens=16, stream=stream)
        assert caught.value.code == "context_length_exceeded"
        assert "maximum context length is 64 tokens" in caught.value.message
    assert stack.stats.started == 2  # one upstream request per call: nothing was retried


@pytest.mark.parametrize(("status", "code"), [(404, "model_not_found"), (413, None), (422, None)])
async def test_other_upstream_4xx_keep_their_status_and_message(aiohttp_server, vocab, status, code):
    stack = await start_stack(aiohttp_server, vocab)
    got, payload, _ = await _post(stack.url("/v1/responses"),
                                  {"model": stack.model, "input": "hi", "x_sim_fault": f"http{status}"})
    assert got == status
    assert payload["error"]["message"] == f"simulated failure (x-sim-fault: http{status})"
    assert payload["error"]["code"] == code
    assert stack.stats.started == 1


async def test_vllm_names_the_param_and_the_client_hears_its_own_name(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, max_logprobs=3)
    for path, body, param in [
        ("/v1/responses", {"input": "hi", "include": LOGPROBS, "top_logprobs": 5}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                                  "top_logprobs": 5}, "top_logprobs"),
    ]:
        status, payload, _ = await _post(stack.url(path), {"model": stack.model, **body})
        assert status == 400 and payload["error"]["param"] == param
        assert "greater than max allowed: 3" in payload["error"]["message"]


# --- 429, 401/403 ------------------------------------------------------------------------------


async def _rate_limited(request: web.Request, n: int) -> web.Response:
    return web.json_response({"error": {"message": "too many requests in flight", "type": "rate_limit",
                                        "code": 429}}, status=429, headers={"Retry-After": "7"})


async def test_a_429_tries_another_replica_then_passes_retry_after(aiohttp_server, vocab):
    from gateway.simulator.vllm import create_app as vllm_app

    seen, wrap = _counted()
    busy = await aiohttp_server(wrap(_rate_limited))
    free = await aiohttp_server(vllm_app(vocab, "m"))
    gateway = await _gateway(aiohttp_server, [_base(busy), _base(free)], retries=1)
    replicas = gateway.app[STATE].routes["m"].replicas.replicas
    replicas[1].in_flight = 1  # the busy one is the first choice
    status, payload, _ = await _post(str(gateway.make_url("/v1/responses")), {"model": "m", "input": "hi",
                                                                            "max_output_tokens": 4})
    replicas[1].in_flight = 0
    assert status == 200 and len(seen) == 1  # served by the free replica
    assert replicas[0].failures == 0  # a 429 is no fault of the replica

    only_busy = await _gateway(aiohttp_server, [_base(busy)])
    status, payload, headers = await _post(str(only_busy.make_url("/v1/responses")), {"model": "m", "input": "hi"})
    assert status == 429 and headers["Retry-After"] == "7"
    assert payload["error"] == {"message": "too many requests in flight", "type": "requests", "param": None,
                                "code": "rate_limit_exceeded"}


@pytest.mark.parametrize("upstream_status", [401, 403])
async def test_an_upstream_401_or_403_is_the_gateways_credential_not_the_client(aiohttp_server, vocab,
                                                                             upstream_status):
    async def refuse(request: web.Request, n: int) -> web.Response:
        return web.json_response({"error": {"message": "Invalid API key", "type": "invalid_request_error"}},
                                 status=upstream_status)

    seen, wrap = _counted()
    upstream = await aiohttp_server(wrap(refuse))
    gateway = await _gateway(aiohttp_server, [_base(upstream)])
    status, payload, _ = await _post(str(gateway.make_url("/v1/responses")), {"model": "m", "input": "hi"})
    assert status == 502 and payload["error"]["code"] == "upstream_auth_failed"
    assert "gateway's own credential" in payload["error"]["message"] and "api_key_env" in payload["error"]["message"]
    assert gateway.app[STATE].routes["m"].replicas.replicas[0].failures == 0
    assert len(seen) == 1  # not retried: every replica holds the same credential


# --- in-band error frames (vLLM: HTTP 200, `data: {"error": {..., "code": 400}}`, `data: [DONE]`) --------


def _in_band(after_chunks: int, code: int = 400, go_on: asyncio.Event | None = None):
    """A chat stream that sends `after_chunks` content chunks, then (once `go_on` is set, when
    given) vLLM's in-band error frame (vllm/entrypoints/openai/serving_chat.py:
    `create_streaming_error_response`, then `[DONE]`)."""

    async def answer(request: web.Request, n: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(after_chunks):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "logprobs": None,
                                  "finish_reason": None}]}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if go_on is not None:
            await go_on.wait()
        error = {"error": {"message": "token_id(s) [99999] in logit_bias contain out-of-vocab token ids. "
                                      "Vocabulary size: 1233", "type": "BadRequestError", "param": None,
                           "code": code}}
        await response.write(b"data: " + orjson.dumps(error) + b"\n\n" + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return answer


async def test_an_in_band_error_before_any_byte_is_a_plain_400_and_no_replica_fault(aiohttp_server, vocab):
    seen, wrap = _counted()
    upstream = await aiohttp_server(wrap(_in_band(0)))
    gateway = await _gateway(aiohttp_server, [_base(upstream)])
    client = openai.AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key="k")
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="m", input="hi", stream=True)
    assert "out-of-vocab token ids" in caught.value.message
    assert len(seen) == 1
    replica = gateway.app[STATE].routes["m"].replicas.replicas[0]
    assert replica.failures == 0


async def test_an_in_band_error_mid_stream_fails_the_response_and_is_no_replica_fault(aiohttp_server, vocab, caplog):
    seen, wrap = _counted()
    go_on = asyncio.Event()
    upstream = await aiohttp_server(wrap(_in_band(2, go_on=go_on)))
    gateway = await _gateway(aiohttp_server, [_base(upstream)])
    caplog.set_level("INFO", logger="responses_gateway")
    async with aiohttp.ClientSession() as session, session.post(
            str(gateway.make_url("/v1/responses")), json={"model": "m", "input": "hi", "stream": True}) as reply:
        assert reply.status == 200
        lines = [await reply.content.readline()]  # the stream began: only now does the error frame come
        go_on.set()
        lines += (await reply.content.read()).splitlines()
        frames = [json.loads(line[6:]) for line in lines if line.startswith(b"data: ")]
    failed = frames[-1]
    assert failed["type"] == "response.failed" and len(seen) == 1
    assert failed["response"]["error"]["code"] == "invalid_prompt"
    assert "out-of-vocab" in failed["response"]["error"]["message"]
    assert gateway.app[STATE].routes["m"].replicas.replicas[0].failures == 0
    access = [json.loads(r.message) for r in caplog.records if r.name == "responses_gateway.access"]
    assert access[-1]["status"] == 200 and access[-1]["outcome"] == "failed"
    assert access[-1]["failure"] == "in_band_400"


async def test_an_in_band_5xx_before_any_byte_is_retried_on_another_replica(aiohttp_server, vocab):
    from gateway.simulator.vllm import create_app as vllm_app

    seen, wrap = _counted()
    broken = await aiohttp_server(wrap(_in_band(0, code=500)))
    good = await aiohttp_server(vllm_app(vocab, "m"))
    gateway = await _gateway(aiohttp_server, [_base(broken), _base(good)], retries=1)
    replicas = gateway.app[STATE].routes["m"].replicas.replicas
    replicas[1].in_flight = 1
    status = None
    async with aiohttp.ClientSession() as session, session.post(
            str(gateway.make_url("/v1/responses")),
            json={"model": "m", "input": "hi", "stream": True, "max_output_tokens": 4}) as reply:
        status = reply.status
        text = await reply.text()
    replicas[1].in_flight = 0
    assert status == 200 and "response.incomplete" in text and len(seen) == 1
    assert replicas[0].failures == 1  # a server error in band is the server's fault


def test_in_band_status_comes_from_the_frame():
    from gateway.upstreams.verdicts import read_fault

    assert read_fault({"error": {"message": "x", "code": 400}}, 200).status == 400
    assert read_fault({"error": "Input validation error: bad", "error_type": "validation"}, 200).status == 422
    assert read_fault({"error": {"message": "engine dead"}}, 200).status == 500
    assert read_fault({"error": {"message": "the request exceeds the available context size, try increasing it",
                                 "type": "exceed_context_size_error"}}, 200).status == 400
    assert UpstreamFault(400, "This model's maximum context length is 512 tokens. However, you requested 900 "
                              "tokens").context_length


@pytest.mark.parametrize(("options", "extra"), [
    ({"max_logprobs": 3}, {"include": LOGPROBS, "top_logprobs": 5}),  # the server's cap is below the gateway's
    ({}, {"extra_body": {"logit_bias": {"99999": 5}}}),  # a vendor field, forwarded as it is
])
async def test_vllms_in_band_refusal_of_a_stream_is_a_bad_request_after_one_upstream_request(
        aiohttp_server, vocab, options, extra):
    stack = await start_stack(aiohttp_server, vocab, **options)
    client = openai.AsyncOpenAI(base_url=stack.url("/v1"), api_key="k")  # default retries
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model=stack.model, input="hi", stream=True, **extra)
    assert stack.stats.started == 1
    replica = stack.gateway.app[STATE].routes[stack.model].replicas.replicas[0]
    assert replica.failures == 0
    ok = await client.responses.create(model=stack.model, input="hi", max_output_tokens=4)  # at once: served
    assert ok.status == "incomplete"


async def test_llamacpps_error_line_in_a_stream_is_read_as_its_verdict(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, dialect="llamacpp")
    async with aiohttp.ClientSession() as session, session.post(
            stack.url("/v1/responses"), json={"model": stack.model, "input": "hi", "stream": True,
                                               "x_sim_fault": "error_mid_stream", "x_sim_die_after": 3}) as reply:
        text = await reply.text()
    frames = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    if reply.status == 200:  # the error came after the stream began
        assert frames[-1]["type"] == "response.failed"
        assert "simulated failure (x-sim-fault: error_mid_stream)" in frames[-1]["response"]["error"]["message"]
    else:  # or within the first events: a plain error, llama.cpp's 500 as the gateway's 502
        assert reply.status == 502 and "simulated failure" in json.loads(text)["error"]["message"]
    replica = stack.gateway.app[STATE].routes[stack.model].replicas.replicas[0]
    assert replica.failures == 1  # a server error: the replica's fault


async def test_an_error_object_in_a_200_answer_is_the_upstreams_verdict(aiohttp_server, vocab):
    async def answer(request: web.Request, n: int) -> web.Response:
        return web.json_response({"error": {"message": "token_id(s) [99999] in logit_bias contain out-of-vocab "
                                                       "token ids. Vocabulary size: 1233", "type": "BadRequestError",
                                            "param": "logit_bias", "code": 400}})

    seen, wrap = _counted()
    upstream = await aiohttp_server(wrap(answer))
    gateway = await _gateway(aiohttp_server, [_base(upstream)])
    status, payload, _ = await _post(str(gateway.make_url("/v1/chat/completions")),
                                     {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and payload["error"]["param"] == "logit_bias" and len(seen) == 1
    assert gateway.app[STATE].routes["m"].replicas.replicas[0].failures == 0


async def test_the_chat_front_door_ends_a_stream_with_the_upstreams_error_object(aiohttp_server, vocab):
    seen, wrap = _counted()
    go_on = asyncio.Event()
    upstream = await aiohttp_server(wrap(_in_band(2, go_on=go_on)))
    gateway = await _gateway(aiohttp_server, [_base(upstream)])
    async with aiohttp.ClientSession() as session, session.post(
            str(gateway.make_url("/v1/chat/completions")),
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}) as reply:
        lines = [await reply.content.readline()]
        go_on.set()
        lines += (await reply.content.read()).splitlines()
    frames = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
    assert frames[-1]["error"]["type"] == "invalid_request_error"
    assert "out-of-vocab" in frames[-1]["error"]["message"] and len(seen) == 1
    assert b"data: [DONE]" not in b"".join(lines)  # a failed stream ends without [DONE], as OpenAI's do
