"""Helpers for tests that talk to a simulator: strict SSE and JSON reading, a once-per-process real tokenizer."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import orjson
from aiohttp import ClientResponse

from gateway.logprobs.vocab import HFVocab, load_bpe_files


def parse_sse(raw: str) -> list[tuple[str, Any]]:
    """Every frame of an SSE body as (field, payload): JSON parsed, `[DONE]` kept as the string."""
    assert raw.endswith("\n\n"), "an SSE body ends with a blank line"
    frames: list[tuple[str, Any]] = []
    for frame in raw.split("\n\n")[:-1]:
        name, sep, payload = frame.partition(": ")
        assert sep, f"not an SSE field: {frame!r}"
        frames.append((name, payload if payload == "[DONE]" else orjson.loads(payload)))
    return frames


async def read_sse(resp: ClientResponse) -> list[Any]:
    """The `data:` payloads of a 200 event stream, in order."""
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    frames = parse_sse(await resp.text())
    assert all(name == "data" for name, _ in frames), frames
    return [payload for _, payload in frames]


async def post_json(client: Any, path: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """POST `body` with a test client; the 200 answer's JSON (`kw`: more request options, e.g. headers)."""
    resp = await client.post(path, json=body, **kw)
    assert resp.status == 200, await resp.text()
    return await resp.json()


def is_descending(values: list[float]) -> bool:
    return all(a >= b for a, b in itertools.pairwise(values))


@functools.cache
def shared_bpe_vocab(vocab_json: Path, merges_txt: Path) -> HFVocab:
    """`load_bpe_files`, loaded once per process: a 150k-token vocabulary takes seconds to build."""
    return load_bpe_files(vocab_json, merges_txt)
