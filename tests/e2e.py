"""Shared helpers for end-to-end tests: a simulator upstream and the gateway on loopback."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer
from openai import AsyncOpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.app import create_app
from gateway.config import parse_config

LOGPROBS = ["message.output_text.logprobs"]


@dataclass
class Stack:
    simulator: TestServer
    gateway: TestServer
    client: AsyncOpenAI
    model: str
    simulator_key: Any = None

    @property
    def stats(self) -> Any:
        return self.simulator.app[self.simulator_key].stats

    def url(self, path: str) -> str:
        return str(self.gateway.make_url(path))


async def start_stack(aiohttp_server, vocab, *, api: str = "chat", model: str = "demo-model",
                      timeouts: dict[str, float] | None = None, tokenizer: dict[str, str] | None = None,
                      upstream_url: str | None = None, upstream_options: dict[str, Any] | None = None,
                      chat_template: str | None = None, store: dict[str, Any] | None = None,
                      dialect: str = "vllm", auth: dict[str, Any] | None = None, api_key: str = "test-key",
                      compaction: dict[str, Any] | None = None,
                      limits: dict[str, Any] | None = None, model_options: dict[str, Any] | None = None,
                      outermost: Any = None, **simulator_options: Any) -> Stack:
    """A simulator of `dialect` (vllm, tgi, sglang, llamacpp, openai) and the gateway in front of it.
    `outermost`: an aiohttp middleware put around all of the gateway's own (to look at a request as its
    handler returns)."""
    module = importlib.import_module(f"gateway.simulator.{dialect}")
    simulator = await aiohttp_server(module.create_app(vocab, model, **simulator_options))
    upstream: dict[str, Any] = {"urls": [upstream_url or str(simulator.make_url("")).rstrip("/")], "api": api,
                                "dialect": dialect}
    if timeouts:
        upstream["timeouts"] = timeouts
    upstream.update(upstream_options or {})
    model_config: dict[str, Any] = {"upstream": "sim", **_tokenizer(tokenizer), **(model_options or {})}
    if chat_template is not None:
        model_config["chat_template"] = chat_template
    # Tests keep responses in memory unless they test a store (no file in the working folder).
    config = parse_config({"upstreams": {"sim": upstream},
                           "models": {model: model_config},
                           "store": store or {"backend": "memory"},
                           **({"auth": auth} if auth else {}), **({"limits": limits} if limits else {}),
                           **({"compaction": compaction} if compaction else {})},
                          base_dir=Path("."))
    app = create_app(config)
    if outermost is not None:
        app.middlewares.insert(0, outermost)
    gateway = await aiohttp_server(app)
    client = AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key=api_key,
                         _strict_response_validation=True, max_retries=0)
    return Stack(simulator, gateway, client, model, module.SIMULATOR_KEY)


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chatml_template(folder: Path) -> str:
    """A ChatML chat template file (Qwen2 style) for completions upstreams."""
    path = folder / "chatml.jinja"
    path.write_text(CHATML)
    return str(path)


def _tokenizer(spec: dict[str, str] | None) -> dict[str, Any]:
    """None: the demo tokenizer; {}: no tokenizer at all."""
    if spec is None:
        return {"tokenizer": {"builtin": "demo"}}
    return {"tokenizer": spec} if spec else {}


def assert_exact_logprobs(part: Any, k: int, *, expect_entries: bool = True) -> None:
    """The invariants every output_text with logprobs must hold."""
    entries = part.logprobs
    if not expect_entries:
        assert entries == []
        return
    assert_bytes_spell(b"".join(bytes(e.bytes) for e in entries), part.text)
    for entry in entries:
        assert entry.token == bytes(entry.bytes).decode("utf-8", errors="backslashreplace")
        assert len(entry.top_logprobs) <= k
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert all(math.isfinite(v) for v in [entry.logprob, *values])
        assert len({bytes(t.bytes) for t in entry.top_logprobs}) == len(entry.top_logprobs)
    if k:
        assert any(len(e.top_logprobs) == k for e in entries)


def assert_bytes_spell(joined: bytes, text: str) -> None:
    """The invariant: the tokens' bytes are the text's UTF-8, or, where some are invalid UTF-8 (a
    character the model started and never finished), their replace-decoding is the text, which has
    U+FFFD there as the upstream wrote it."""
    if joined != text.encode():
        assert "\ufffd" in text and joined.decode("utf-8", errors="replace") == text, (joined, text)


STREAM_EVENT = TypeAdapter(ResponseStreamEvent)


async def create_response(stack, stream: bool, **params):
    """A Response, streamed (through `responses.stream`, checking every event) or not."""
    if not stream:
        return await stack.client.responses.create(model=stack.model, **params), []
    async with stack.client.responses.stream(model=stack.model, **params) as events:
        raw = [event.model_dump(mode="json", exclude_unset=True, by_alias=True) async for event in events]
        final = await events.get_final_response()
    for frame in raw:
        STREAM_EVENT.validate_python(frame)
    assert [frame["sequence_number"] for frame in raw] == list(range(len(raw)))
    return final, raw


TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


async def stream_response(stack, **params):
    """A streamed Response read event by event (each validated, sequence numbers checked), ending in
    whichever terminal event came (completed, incomplete or failed: the SDK's stream helper only
    accepts `response.completed`): (the terminal event's Response, the raw events)."""
    raw = []
    async for event in await stack.client.responses.create(model=stack.model, stream=True, **params):
        raw.append(event.model_dump(mode="json", exclude_unset=True, by_alias=True))
    for frame in raw:
        STREAM_EVENT.validate_python(frame)
    assert [frame["sequence_number"] for frame in raw] == list(range(len(raw)))
    assert raw and raw[-1]["type"] in TERMINAL_EVENTS, [frame["type"] for frame in raw[-3:]]
    assert sum(frame["type"] in TERMINAL_EVENTS for frame in raw) == 1
    return STREAM_EVENT.validate_python(raw[-1]).response, raw


def last_upstream_body(stack) -> dict:
    """The JSON body of the last request the stack's simulator received."""
    return list(stack.stats.recent)[-1]["body"]
