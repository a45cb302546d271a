"""`check-config` proves each route end to end: one real 1-token generation per model, with logprobs and
top_logprobs at the route's cap, through the app `serve` runs. Each misconfiguration below is one a
loopback simulator reproduces as the real server would answer; every FAIL line names the model and the cause."""

import asyncio
import base64
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator import openai as openai_sim
from gateway.simulator import tgi as tgi_sim
from gateway.simulator import vllm as vllm_sim

EXE = str(Path(sys.executable).parent / "responses-gateway")
DEMO = {"builtin": "demo"}


def _tiktoken_file(path: Path, size: int) -> None:
    """A rank file of `size` tokens: the 256 bytes, then three-letter tokens unlike the demo vocabulary's."""
    rng = random.Random(size)
    tokens = [bytes([b]) for b in range(256)]
    seen = set(tokens)
    while len(tokens) < size:
        token = bytes(rng.randrange(97, 123) for _ in range(3))
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)))


@pytest.fixture
async def upstreams(aiohttp_server):
    vocab = build_demo_vocab()
    servers = {
        "vllm": await aiohttp_server(vllm_sim.create_app(vocab, "demo-model")),
        # vllm serve ... --max-logprobs 5
        "vllm_cap5": await aiohttp_server(vllm_sim.create_app(vocab, "demo-model", max_logprobs=5)),
        "openai": await aiohttp_server(openai_sim.create_app(vocab, "demo-model")),
        "tgi": await aiohttp_server(tgi_sim.create_app(vocab, "demo-model")),
    }
    return {name: {"urls": [str(server.make_url("")).rstrip("/")], "health_interval": 0}
            for name, server in servers.items()}


def _check(tmp_path: Path, upstreams: dict, models: dict, *flags: str) -> tuple[int, dict[str, str]]:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"upstreams": upstreams, "models": models}))
    result = subprocess.run([EXE, "check-config", str(config), "--timeout", "20", *flags], capture_output=True,
                            text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    rows = {}  # model -> its generation line, spaces squeezed: "FAIL model M generation (...) detail"
    for line in result.stdout.splitlines():
        words = line.split()
        if len(words) > 3 and words[1] == "model" and words[3] == "generation":
            rows[words[2]] = " ".join(words)
    return result.returncode, rows


async def test_a_working_route_passes_with_bytes_from_token_ids(tmp_path, upstreams):
    rc, rows = await asyncio.to_thread(_check, tmp_path, {"v": upstreams["vllm"]},
                                       {"demo-model": {"upstream": "v", "tokenizer": DEMO}})
    assert rc == 0, rows
    assert rows["demo-model"].startswith("ok ") and "top_logprobs 20" in rows["demo-model"]
    assert "20 alternatives, bytes from token ids" in rows["demo-model"]


async def test_each_misconfiguration_fails_naming_the_model_and_the_cause(tmp_path, upstreams):
    _tiktoken_file(tmp_path / "small.tiktoken", 256)  # ids the server sends lie above its 256 tokens
    _tiktoken_file(tmp_path / "other.tiktoken", 2000)  # ids in range, bytes that spell something else
    config_upstreams = {
        "v": upstreams["vllm"],
        "v5": upstreams["vllm_cap5"],
        # An OpenAI-compatible server configured as vLLM: it ignores return_tokens_as_token_ids.
        "not_vllm": upstreams["openai"],
        # TGI's /v1/completions, configured as a generic OpenAI-compatible server: it never returns logprobs.
        "tgi_as_openai": {**upstreams["tgi"], "dialect": "openai", "api": "completions", "max_top_logprobs": 5},
    }
    models = {
        "wrong-name": {"upstream": "v", "upstream_model": "Qwen/Qwen2-0.5B", "tokenizer": DEMO},
        "cap-too-high": {"upstream": "v5", "upstream_model": "demo-model", "tokenizer": DEMO},
        "no-ids": {"upstream": "not_vllm", "upstream_model": "demo-model", "tokenizer": DEMO},
        "no-logprobs": {"upstream": "tgi_as_openai", "upstream_model": "demo-model"},
        "small-vocab": {"upstream": "v", "upstream_model": "demo-model",
                        "tokenizer": {"tiktoken": "small.tiktoken", "pattern": "."}},
        "other-vocab": {"upstream": "v", "upstream_model": "demo-model",
                        "tokenizer": {"tiktoken": "other.tiktoken", "pattern": "."}},
        "fine": {"upstream": "v", "upstream_model": "demo-model", "tokenizer": DEMO},
    }
    rc, rows = await asyncio.to_thread(_check, tmp_path, config_upstreams, models)
    assert rc == 1
    assert set(rows) == set(models)
    assert rows["fine"].startswith("ok ")
    for name in set(models) - {"fine"}:
        assert rows[name].startswith(f"FAIL model {name} "), rows[name]
    assert "upstream 'v' does not serve 'Qwen/Qwen2-0.5B' (it serves 'demo-model')" in rows["wrong-name"]
    assert "models.wrong-name.upstream_model" in rows["wrong-name"]
    assert "refuses top_logprobs 20, the route's cap (the vllm default)" in rows["cap-too-high"]
    assert "set upstreams.v5.max_top_logprobs" in rows["cap-too-high"]
    assert "max allowed: 5" in rows["cap-too-high"]  # the server's own words
    assert "returned no token ids" in rows["no-ids"] and "upstreams.not_vllm.dialect" in rows["no-ids"]
    assert "returned no logprobs" in rows["no-logprobs"] and "upstreams.tgi_as_openai.dialect" in rows["no-logprobs"]
    for name in ("small-vocab", "other-vocab"):
        assert "the tokenizer does not match the server's token ids" in rows[name]
        assert f"models.{name}.tokenizer" in rows[name]
    assert "is not in the tokenizer" in rows["small-vocab"]
    assert "does not fit the text" in rows["other-vocab"]

    # --no-probe is the offline check: the config loads, tokenizers load, every upstream answers /health.
    rc, rows = await asyncio.to_thread(_check, tmp_path, {"v": upstreams["vllm"]},
                                       {"wrong-name": models["wrong-name"]}, "--no-probe")
    assert rc == 0 and rows == {}
