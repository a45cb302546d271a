"""Server-sent events, both ways: encode our frames, split an upstream's byte stream into data."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import orjson


def encode_event(event: dict[str, Any]) -> bytes:
    """One Responses frame: `event: <type>` and a single `data:` line, closed by a blank line."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def data_payloads(lines: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yield each event's data (multi-line data joined by newlines), stopping at `[DONE]`."""
    buffer: list[bytes] = []
    async for raw in lines:
        line = raw.rstrip(b"\r\n")
        if not line:
            if buffer:
                data = b"\n".join(buffer)
                buffer = []
                if data.strip() == b"[DONE]":
                    return
                yield data
            continue
        if line.startswith(b"data:"):
            buffer.append(line[5:].removeprefix(b" "))
        # `event:`, `id:`, `retry:` and comments carry nothing we need from a chat/completions server.
    if buffer:
        data = b"\n".join(buffer)
        if data.strip() != b"[DONE]":
            yield data
