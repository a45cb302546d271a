"""The gateway on loopback in front of a real server (a `RealEngine` from the session fixtures).

    stack = await start_gateway(aiohttp_server, real_vllm, api="completions")
    response, events = await create_response(stack, stream=True, input="hi", top_logprobs=5,
                                              include=LOGPROBS)   # tests.e2e: SDK-validated

`stack.client` is an `AsyncOpenAI` with strict response validation; `stack.url(path)` the gateway's URL;
`stack.upstream(path)` the real server's (to ask it directly for the truth).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer
from openai import AsyncOpenAI

from gateway.app import create_app
from gateway.config import parse_config
from tests.real_engines.truth import Recorder


@dataclass
class RealStack:
    gateway: TestServer
    client: AsyncOpenAI
    model: str
    engine: Any  # the RealEngine
    recorder: Recorder | None = None  # the relay the gateway reaches the server through

    def url(self, path: str) -> str:
        return str(self.gateway.make_url(path))

    def upstream(self, path: str) -> str:
        return self.engine.base_url + path


async def start_gateway(aiohttp_server: Any, engine: Any, *, api: str = "chat",
                        tokenizer: dict[str, str] | None = None, model: str | None = None,
                        upstream_options: dict[str, Any] | None = None,
                        model_options: dict[str, Any] | None = None, record: bool = True,
                        store: dict[str, Any] | None = None) -> RealStack:
    """The gateway with one route, `model` (default: the served name), to `engine` over `api`.

    `tokenizer`: None means the engine's own (vLLM: the model folder's tokenizer files), {} none at all.
    A completions route gets the model folder's chat template (`chat_template.jinja`). `record`: the
    gateway reaches the server through a `Recorder` (stack.recorder), which keeps what the server sent.
    `store`: the config's `store:` section (default: the memory store)."""
    recorder = Recorder(engine.base_url) if record else None
    base_url = str((await aiohttp_server(recorder.app)).make_url("")).rstrip("/") if recorder else engine.base_url
    tokenizer = engine.tokenizer if tokenizer is None else tokenizer
    name = model or engine.model
    upstream: dict[str, Any] = {"urls": [base_url], "api": api, "dialect": engine.dialect,
                                **({"max_top_logprobs": engine.max_logprobs} if engine.max_logprobs else {}),
                                **(upstream_options or {})}
    model_config: dict[str, Any] = {"upstream": "real", "upstream_model": engine.model,
                                    **({"tokenizer": tokenizer} if tokenizer else {}), **(model_options or {})}
    template = Path(engine.model_dir) / "chat_template.jinja" if engine.model_dir else None
    if api == "completions" and template is not None and template.is_file():
        model_config.setdefault("chat_template", str(template))
    config = parse_config({"upstreams": {"real": upstream}, "models": {name: model_config},
                           "store": store or {"backend": "memory"}}, base_dir=Path("."))
    gateway = await aiohttp_server(create_app(config))
    client = AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key="test-key",
                         _strict_response_validation=True, max_retries=0)
    return RealStack(gateway, client, name, engine, recorder)
