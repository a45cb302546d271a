"""Canned upstream output: recorded once from the vLLM simulator, replayed byte for byte.

The simulator is exact but slow (~10k tokens/s), so it cannot be the benchmark's upstream. We
send each benchmark request through an in-process gateway in front of it, read back the upstream
body the gateway sent (the simulator keeps recent request bodies), send that body to the
simulator ourselves and keep the raw answer. The replay server (`bench/upstream.py`) then answers
the same request with the same bytes at no cost: vLLM's wire format with `token_id:N`
placeholders and sampled-first top lists, exactly as the gateway meets it in production.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

QWEN2_DIR = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "qwen2"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
PROMPT = "Tell me about the plan."
APIS = ("chat", "completions")


@dataclass(frozen=True, slots=True)
class Case:
    """One benchmark request shape."""

    api: str  # the gateway's upstream API: chat or completions
    stream: bool
    k: int  # the client's top_logprobs
    tokens: int  # output tokens (ignore_eos: always exactly this many)

    @property
    def key(self) -> str:
        return f"{self.api}/{'stream' if self.stream else 'full'}/k{self.k}/n{self.tokens}"


def tokenizer_spec(use_qwen2: bool | None = None) -> tuple[str, dict[str, str]]:
    """(model name, gateway tokenizer config): Qwen2's real files when present, else the demo BPE."""
    if use_qwen2 is None:
        use_qwen2 = (QWEN2_DIR / "vocab.json").is_file()
    if use_qwen2:
        return "Qwen/Qwen2-0.5B", {"vocab": str(QWEN2_DIR / "vocab.json"), "merges": str(QWEN2_DIR / "merges.txt")}
    return "demo-model", {"builtin": "demo"}


def load_vocab_for(spec: dict[str, str]) -> Any:
    from gateway.logprobs.demo_vocab import build_demo_vocab
    from gateway.logprobs.vocab import load_bpe_files

    if spec == {"builtin": "demo"}:
        return build_demo_vocab()
    return load_bpe_files(spec["vocab"], spec["merges"])


def gateway_config(upstream_url: str, upstream_model: str, tokenizer: dict[str, str],
                   port: int | None = None, store: str = "none") -> dict[str, Any]:
    """The gateway config the benchmark serves: one public model per upstream API."""
    config: dict[str, Any] = {
        # One local upstream that is never down: no health probes, no cooldown after a slow answer,
        # and room to connect while the gateway is deliberately overloaded (c=64 x 1,000-token
        # streams on two cores delay the event loop by seconds; with the default 5 s connect timeout
        # and 10 s cooldown one late connect turns into 10 s of 503s).
        "upstreams": {api: {"urls": [upstream_url], "api": api, "max_top_logprobs": 20,
                            "health_interval": 0, "cooldown": 0, "retries": 0,
                            "timeouts": {"connect": 60, "first_token": 120, "idle": 120, "total": 900}}
                      for api in APIS},
        "models": {f"bench-{api}": {"upstream": api, "upstream_model": upstream_model, "tokenizer": tokenizer}
                   for api in APIS},
        # `python -m bench` runs with the default store (sqlite); bench.store compares it with none.
        "store": {"backend": store},
    }
    if port is not None:
        config["listen"] = {"host": "127.0.0.1", "port": port}
    return config


def responses_request(case: Case) -> dict[str, Any]:
    """What the load generator sends to the gateway for `case`."""
    return {"model": f"bench-{case.api}", "input": PROMPT, "max_output_tokens": case.tokens,
            "include": [LOGPROBS_INCLUDE], "top_logprobs": case.k, "stream": case.stream, "ignore_eos": True}


def front_door_request(case: Case) -> tuple[str, dict[str, Any]]:
    """What a client of the gateway's own `case.api` door sends for `case` (the OpenAI SDKs' chat door, the
    legacy completions door), with the path: the same upstream request as `responses_request`'s (the same
    replay key), so the gateway's answer is built from the same recorded body."""
    common = {"model": f"bench-{case.api}", "max_tokens": case.tokens, "stream": case.stream, "ignore_eos": True}
    if case.api == "chat":
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": PROMPT}],
                                        "logprobs": case.k > 0, "top_logprobs": case.k}
    return "/v1/completions", {**common, "prompt": PROMPT, "logprobs": case.k}


def replay_key(path: str, body: dict[str, Any]) -> str:
    """How the replay server finds the answer to an upstream request (both APIs, both modes)."""
    k = body.get("top_logprobs") if path.endswith("/chat/completions") else body.get("logprobs")
    return f"{path}|{bool(body.get('stream'))}|{k}|{body.get('max_tokens')}"


@dataclass(slots=True)
class Recorded:
    """One case: the upstream request the gateway sends and the simulator's raw answer."""

    case: dict[str, Any]
    path: str  # /v1/chat/completions or /v1/completions
    replay_key: str
    responses_request: str  # JSON text the client sends to the gateway
    upstream_request: str  # JSON text the gateway sends upstream (the client sends it to relay/direct)
    body: str  # non-streamed JSON body, or "" for a stream
    frames: list[str]  # streamed: each SSE frame ("data: ...\n\n"), [DONE] included


async def _start(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def record(cases: list[Case], use_qwen2: bool | None = None) -> dict[str, Any]:
    """Record every case (see the module docstring). Returns the canned document."""
    from gateway.app import create_app
    from gateway.config import parse_config
    from gateway.simulator.vllm import SIMULATOR_KEY
    from gateway.simulator.vllm import create_app as create_simulator

    model, tokenizer = tokenizer_spec(use_qwen2)
    vocab = load_vocab_for(tokenizer)
    sim_app = create_simulator(vocab, model, max_logprobs=20)
    sim_runner, sim_port = await _start(sim_app)
    sim_url = f"http://127.0.0.1:{sim_port}"
    config = parse_config(gateway_config(sim_url, model, tokenizer), Path.cwd())
    gw_runner, gw_port = await _start(create_app(config))
    recorded: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for case in cases:
                stats = sim_app[SIMULATOR_KEY].stats
                stats.reset()
                request = responses_request(case)
                async with session.post(f"http://127.0.0.1:{gw_port}/v1/responses", json=request) as reply:
                    text = await reply.text()
                    if reply.status != 200 or "response.failed" in text:
                        raise RuntimeError(f"recording {case.key}: gateway answered {reply.status}: {text[:300]}")
                [seen] = list(stats.recent)
                upstream_body = seen["body"]
                path = seen["path"]
                async with session.post(sim_url + path, data=orjson.dumps(upstream_body),
                                        headers={"Content-Type": "application/json"}) as reply:
                    raw = await reply.read()
                    if reply.status != 200:
                        raise RuntimeError(f"recording {case.key}: simulator answered {reply.status}")
                frames: list[str] = []
                body = ""
                if case.stream:
                    frames = [block + "\n\n" for block in raw.decode().split("\n\n") if block]
                else:
                    body = raw.decode()
                recorded[case.key] = asdict(Recorded(
                    case=asdict(case), path=path, replay_key=replay_key(path, upstream_body),
                    responses_request=orjson.dumps(request).decode(),
                    upstream_request=orjson.dumps(upstream_body).decode(), body=body, frames=frames))
    finally:
        await gw_runner.cleanup()
        await sim_runner.cleanup()
    return {"model": model, "tokenizer": tokenizer, "vocab": vocab.name, "cases": recorded}


def record_to_file(cases: list[Case], path: Path, use_qwen2: bool | None = None) -> dict[str, Any]:
    document = asyncio.run(record(cases, use_qwen2))
    path.write_bytes(orjson.dumps(document))
    return document
