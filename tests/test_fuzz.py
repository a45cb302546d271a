"""Hostile input: generated bodies for every endpoint get a 4xx OpenAI error (never a 5xx, never a
hang); malformed upstream output becomes a clear 502 or `response.failed`, never a crash."""

import json

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.app import create_app
from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import start_stack

MODEL = "demo-model"
# JSON values of every shape, including the awkward ones: deep nesting, huge numbers, odd strings.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=25,
)
FIELDS = {
    "/v1/responses": ["model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "include",
                      "top_logprobs", "stream", "metadata", "user", "text", "tools", "tool_choice", "store",
                      "previous_response_id", "reasoning"],
    "/v1/chat/completions": ["model", "messages", "max_tokens", "temperature", "top_p", "logprobs", "top_logprobs",
                             "stream", "stop", "n", "tools", "response_format"],
    "/v1/completions": ["model", "prompt", "max_tokens", "temperature", "logprobs", "echo", "stream", "stop", "n"],
}
# Values close to valid ones, so the fuzzer gets past the first check and reaches deeper ones.
near_valid = {
    "model": st.sampled_from([MODEL, "", "nope", 5]),
    "input": st.one_of(st.text(max_size=20), st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"]),
         "content": st.one_of(st.text(max_size=10), json_values)}), max_size=3), json_values),
    "messages": st.one_of(st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "x"]),
         "content": st.one_of(st.text(max_size=10), json_values)}), max_size=3), json_values),
    "prompt": st.one_of(st.text(max_size=20), st.lists(st.text(max_size=5), max_size=2), json_values),
    "top_logprobs": st.one_of(st.integers(-5, 30), json_values),
    "logprobs": st.one_of(st.integers(-2, 25), st.booleans(), json_values),
    "max_output_tokens": st.one_of(st.integers(-3, 5), json_values),
    "max_tokens": st.one_of(st.integers(-3, 5), json_values),
    "include": st.one_of(st.just(["message.output_text.logprobs"]), json_values),
    "stream": st.one_of(st.booleans(), json_values),
}


def _generate(strategy, count: int) -> list:
    """Draw `count` examples with hypothesis' engine (the requests run afterwards, in the event loop)."""
    drawn: list = []

    @settings(max_examples=count, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(strategy)
    def collect(example):
        drawn.append(example)

    collect()
    return drawn


def bodies(path: str):
    fields = FIELDS[path]
    return st.dictionaries(st.sampled_from(fields), st.nothing(), max_size=0).flatmap(
        lambda _: st.fixed_dictionaries({}, optional={f: near_valid.get(f, json_values) for f in fields}))


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


@pytest.mark.parametrize("path", list(FIELDS))
async def test_generated_bodies_never_get_a_5xx(aiohttp_server, vocab, path):
    stack = await start_stack(aiohttp_server, vocab, default_reply="ok 👍", upstream_options={"health_interval": 0})
    url = stack.url(path)
    seen: dict[int, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

        for body in _generate(bodies(path), 3000):
            async with session.post(url, data=json.dumps(body)) as reply:
                raw = await reply.read()
            seen[reply.status] = seen.get(reply.status, 0) + 1
            assert reply.status < 500, (body, raw[:300])
            if reply.status >= 400:
                error = json.loads(raw)["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert sum(seen.values()) >= 3000
    assert any(400 <= status < 500 for status in seen)


async def test_undecodable_bodies_are_a_clear_400(aiohttp_server, vocab):
    """Invalid UTF-8 and non-JSON bytes straight at the parser: a 400, never an exception."""
    stack = await start_stack(aiohttp_server, vocab, upstream_options={"health_interval": 0})
    raws = [*_generate(st.binary(max_size=200), 300), b"\xff\xfe", b"[1,2", b"NaN",
            b'{"model": "demo-model", "input": "\\ud800"}']
    async with aiohttp.ClientSession() as session:
        for raw in raws:
            async with session.post(stack.url("/v1/responses"), data=raw) as reply:
                assert reply.status in (400, 404), raw
                json.loads(await reply.read())


def _bad_upstream(kind: str) -> web.Application:
    """A real loopback server answering chat requests with malformed output of one kind."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        good = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop",
                             "logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105],
                                                       "top_logprobs": []}]}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
        if kind == "invalid_json":
            payload = b'{"choices": [}'
        elif kind == "nan_literals":
            payload = json.dumps(good).replace("-0.1", "NaN").encode()
        elif kind == "missing_fields":
            payload = b'{"id": "x"}'
        elif kind == "short_logprobs":
            good["choices"][0]["message"]["content"] = "Hi there, more text than tokens"
            if body.get("stream"):  # a chunk: the delta holds more text than its logprobs spell
                good["choices"][0]["delta"] = good["choices"][0].pop("message")
            payload = json.dumps(good).encode()
        elif kind == "wrong_types":
            good["choices"][0]["logprobs"]["content"][0]["logprob"] = "high"
            payload = json.dumps(good).encode()
        else:
            payload = json.dumps(good).encode()
        if not body.get("stream"):
            return web.Response(body=payload, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if kind == "truncated_sse":
            await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, "logp')
            return response
        await response.write(b"data: " + payload + b"\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


@pytest.mark.parametrize("kind", ["invalid_json", "nan_literals", "missing_fields", "short_logprobs",
                                  "wrong_types", "truncated_sse"])
@pytest.mark.parametrize("stream", [False, True])
async def test_malformed_upstream_output_becomes_a_clear_error(aiohttp_server, kind, stream):
    upstream = await aiohttp_server(_bad_upstream(kind))
    config = parse_config({"upstreams": {"bad": {"urls": [str(upstream.make_url("")).rstrip("/")],
                                                 "health_interval": 0, "dialect": "openai"}},
                           "models": {MODEL: {"upstream": "bad"}}, "store": {"backend": "memory"}},
                          base_dir=__import__("pathlib").Path("."))
    gateway = await aiohttp_server(create_app(config))
    body = {"model": MODEL, "input": "hi", "stream": stream, "include": ["message.output_text.logprobs"]}
    async with aiohttp.ClientSession() as session, session.post(str(gateway.make_url("/v1/responses")),
                                                                json=body) as reply:
        raw = await reply.read()
    if not stream:
        if kind == "truncated_sse":
            assert reply.status == 200  # not a streaming fault when not streaming
            return
        assert reply.status == 502, raw
        assert json.loads(raw)["error"]["code"] == "upstream_error"
        return
    frames = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert frames, (reply.status, raw[:400])
    terminal = frames[-1]
    for frame in frames:  # every frame is valid JSON with finite numbers
        json.dumps(frame, allow_nan=False)
    # NaN/Infinity literals are not JSON: like every other malformation, the stream fails cleanly.
    assert terminal["type"] == "response.failed" and terminal["response"]["error"]["code"] == "server_error"
    assert sum(frame["type"].startswith("response.") and frame["type"] in
               ("response.completed", "response.failed", "response.incomplete") for frame in frames) == 1
