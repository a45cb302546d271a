"""Real TGI /generate responses (../shared/captures) replayed by a loopback server through the gateway's
TGI dialect: the client gets valid Responses output with exact bytes for every capture."""

import json
from pathlib import Path

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from tests.e2e import LOGPROBS

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures"
PATHS = sorted(CAPTURES.glob("tgi-generate-*.json")) if CAPTURES.is_dir() else []


def _replay(body: dict) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        await request.json()
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/generate", generate)
    return app


@pytest.mark.skipif(not PATHS, reason=f"TGI captures not found at {CAPTURES}")
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
async def test_capture_through_the_gateway_gives_valid_exact_output(aiohttp_server, path):
    from openai import AsyncOpenAI

    capture = json.loads(path.read_text())
    upstream = await aiohttp_server(_replay(capture))
    config = parse_config({"upstreams": {"tgi": {"urls": [str(upstream.make_url("")).rstrip("/")], "dialect": "tgi",
                                                 "api": "generate", "health_interval": 0}},
                           "models": {"captured": {"upstream": "tgi"}}, "store": {"backend": "none"}}, Path("."))
    gateway = await aiohttp_server(create_app(config))
    client = AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key="x", _strict_response_validation=True,
                         max_retries=0)
    response = await client.responses.create(model="captured", input="prompt", include=LOGPROBS)
    part = response.output[0].content[0]
    assert b"".join(bytes(e.bytes) for e in part.logprobs) == part.text.encode()
    specials = sum(1 for t in capture["details"]["tokens"] if t["special"])
    assert len(part.logprobs) == len(capture["details"]["tokens"]) - specials
    expected = "incomplete" if capture["details"]["finish_reason"] == "length" else "completed"
    assert response.status == expected
