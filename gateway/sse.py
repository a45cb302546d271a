"""Server-sent events, both ways: encode our frames, split an upstream's byte stream into data."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from contextlib import aclosing
from typing import Any

import orjson


def encode_event(event: dict[str, Any]) -> bytes:
    """One Responses frame: `event: <type>` and a single `data:` line, closed by a blank line."""
    # One copy of the (possibly large) JSON, not one per `+`.
    return b"".join((b"event: ", event["type"].encode(), b"\ndata: ", orjson.dumps(event), b"\n\n"))


async def data_payloads(lines: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yield each event's data (multi-line data joined by newlines), stopping at `[DONE]`.

    `lines` yields lines (aiohttp's StreamReader does, and has `iter_any`: then whatever has
    arrived is split here, one await per network read instead of one per line).
    """
    buffer: list[bytes] = []
    source = _lines_of(lines) if hasattr(lines, "iter_any") else _stripped(lines)
    async with aclosing(source):
        async for batch in source:
            for line in batch:
                if not line:
                    if buffer:
                        data = b"\n".join(buffer) if len(buffer) > 1 else buffer[0]
                        buffer = []
                        if data.strip() == b"[DONE]":
                            return
                        yield data
                    continue
                if line.startswith(b"data:"):
                    buffer.append(line[6:] if line.startswith(b"data: ") else line[5:])
                # `event:`, `id:`, `retry:` and comments carry nothing we need from a chat/completions server.
    if buffer:
        data = b"\n".join(buffer)
        if data.strip() != b"[DONE]":
            yield data


async def _stripped(lines: AsyncIterable[bytes]) -> AsyncIterator[list[bytes]]:
    async for raw in lines:
        yield [raw.rstrip(b"\r\n")]


async def _lines_of(reader: Any) -> AsyncIterator[list[bytes]]:
    """Batches of complete lines (line ends removed) from a reader's `iter_any` chunks."""
    pending: list[bytes] = []  # the start of a line whose end has not arrived
    async for chunk in reader.iter_any():
        if b"\n" not in chunk:
            pending.append(chunk)
            continue
        if pending:
            pending.append(chunk)
            chunk = b"".join(pending)
            pending = []
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if rest:
            pending.append(rest)
        yield [line.rstrip(b"\r") for line in lines]
    if pending:
        yield [b"".join(pending).rstrip(b"\r\n")]
