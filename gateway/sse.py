"""Server-sent events, both ways: encode our frames, split an upstream's byte stream into data."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from contextlib import aclosing
from typing import Any

import orjson


def encode_event(event: dict[str, Any]) -> bytes:
    """One Responses frame: `event: <type>` and a single `data:` line, closed by a blank line."""
    kind = event["type"]
    if kind in _REPEATING:
        event = _with_shared_logprobs(event)
        if kind in _TERMINAL:
            _memo.clear()  # the message is complete: nothing later repeats its list
    # One copy of the (possibly large) JSON, not one per `+`.
    return b"".join((b"event: ", kind.encode(), b"\ndata: ", orjson.dumps(event), b"\n\n"))


# The frames that close a message each repeat its whole `logprobs` list (the text's `.done`, the
# part's, the item's, then the final Response): serialize that list once and splice the same JSON
# into all four. It is the same list object in each, unchanged in between (the frames are built
# and encoded in one go); the memo keeps one list, is checked by identity and length, and is
# cleared by the terminal frame.
_REPEATING = frozenset({"response.output_text.done", "response.content_part.done", "response.output_item.done",
                        "response.completed", "response.incomplete", "response.failed"})
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_SHARE_AT = 16  # shorter lists cost less to serialize again than to look up
_memo: list[Any] = []  # [list object, its length, its JSON as an orjson.Fragment]


def _with_shared_logprobs(value: Any) -> Any:
    """`value` (not changed) copied along the paths to long `logprobs` lists, which become Fragments."""
    if type(value) is dict:
        copy = None
        for key, item in value.items():
            if key == "logprobs" and type(item) is list:
                new = _fragment(item) if len(item) >= _SHARE_AT else item
            elif type(item) is dict or type(item) is list:
                new = _with_shared_logprobs(item)
            else:
                continue
            if new is not item:
                if copy is None:
                    copy = dict(value)
                copy[key] = new
        return value if copy is None else copy
    if type(value) is list:
        items = [_with_shared_logprobs(item) if type(item) is dict else item for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def _fragment(entries: list[Any]) -> orjson.Fragment:
    if _memo and _memo[0] is entries and _memo[1] == len(entries):
        return _memo[2]
    fragment = orjson.Fragment(orjson.dumps(entries))
    _memo[:] = [entries, len(entries), fragment]
    return fragment


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
