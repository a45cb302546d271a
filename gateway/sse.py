"""Server-sent events, both ways: encode our frames, split an upstream's byte stream into data (a read of
whole `data:` events by the compiled twin, `fastpath.sse_events`; every other read line by line here)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any

import orjson

from gateway.canonical.step import UpstreamFormatError
from gateway.logprobs.compiled import fastpath

# The bytes an upstream stream may send without ending an event (what the reader holds for it meanwhile):
# ~1,000x the largest event a server sends (a chunk of several tokens with 20 alternatives each is ~60 KB;
# TGI's last event repeats the whole text). Past it the stream is broken, not slow: an upstream that never
# ends a line would otherwise grow the gateway's memory for every client until the total timeout.
MAX_EVENT_BYTES = 64 * 1024 * 1024


def sse_headers(request_id: str) -> dict[str, str]:
    """The headers of every event stream the gateway sends."""
    return {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
            "X-Request-Id": request_id}


def encode_event(event: dict[str, Any]) -> bytes:
    """One Responses frame: `event: <type>` and a single `data:` line, closed by a blank line."""
    return encode_events((event,))


def encode_events(events: Iterable[dict[str, Any] | bytes]) -> bytes:
    """Frames one after another, as `encode_event` makes each, joined in one copy. An event already
    written as its frame (bytes: see ResponsesStream.text_frame) is copied as it is."""
    parts: list[bytes] = []
    dumps = orjson.dumps
    for event in events:
        if type(event) is bytes:
            parts.append(event)
            continue
        kind = event["type"]
        if kind in _REPEATING:
            event = _with_shared_logprobs(event)
            if kind in _TERMINAL:
                _memo.clear()  # the message is complete: nothing later repeats its list
        parts += (_head(kind), dumps(event), b"\n\n")
    return b"".join(parts)


def frame_json(frame: bytes) -> bytes:
    """An SSE frame's data: the event's JSON (a frame as `encode_events` writes it, one data line)."""
    return frame[frame.index(b"\ndata: ") + 7:-2]


def encode_pieces(events: Iterable[dict[str, Any] | bytes]) -> list[bytes]:
    """The bytes of `encode_events(events)` as pieces to write one after another, where a long
    `logprobs` list (its JSON at least `SPLIT_AT` bytes) is a piece of its own, one bytes object
    that every frame repeating the list refers to: the four frames closing a 1,000-token message
    hold its ~0.4 MB of JSON once, not four times over and joined again. Small frames stay joined."""
    pieces: list[bytes] = []
    run: list[bytes] = []  # small pieces waiting to be joined into one
    dumps = orjson.dumps
    known: dict[int, tuple[Any, bytes]] = {}  # id of a list or Fragment seen in this call -> (it, its JSON)
    for event in events:
        if type(event) is bytes:  # a frame already written (see encode_events)
            run.append(event)
            continue
        kind = event["type"]
        if kind not in _REPEATING:
            run += (_head(kind), dumps(event), b"\n\n")
            continue
        shared: list[bytes] = []
        text = dumps(_marked(event, shared, known))
        split = text.split(_MARK_BYTE) if shared else [text]
        if len(split) != len(shared) + 1:  # a NUL byte that is not our mark (never from orjson): no split
            split, shared = [dumps(_marked(event, None, known))], []
        run += (_head(kind), split[0])
        for piece, rest in zip(shared, split[1:], strict=True):
            pieces.append(b"".join(run))
            pieces.append(piece)
            run = [rest]
        run.append(b"\n\n")
    if run:
        pieces.append(b"".join(run))
    return pieces


def _head(kind: str) -> bytes:
    head = _HEADS.get(kind)
    if head is None:
        head = b"".join((b"event: ", kind.encode(), b"\ndata: "))
        if len(_HEADS) < 256:  # event types are a small fixed set; never grow without bound
            _HEADS[kind] = head
    return head


_HEADS: dict[str, bytes] = {}  # event type -> b"event: <type>\ndata: "


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

SPLIT_AT = 64 * 1024  # a list's JSON from this size on is its own piece in `encode_pieces`
_MARK_BYTE = b"\x00"  # orjson never writes a NUL byte (it escapes control characters in strings)
_MARK = orjson.Fragment(_MARK_BYTE)


def _with_shared_logprobs(value: Any) -> Any:
    """`value` (not changed) copied along the paths to long `logprobs` lists, which become Fragments."""
    return _rewritten(value, lambda item: _fragment(item) if type(item) is list and len(item) >= _SHARE_AT else item)


def _marked(value: Any, shared: list[bytes] | None, known: dict[int, tuple[Any, bytes]]) -> Any:
    """`value` (not changed) with each long `logprobs` list, or Fragment of one, replaced by `_MARK`
    and its JSON appended to `shared`, in the order orjson writes them (dict order); shorter lists
    become Fragments of their JSON (serialized once per call). `shared` None: no marks."""
    def replace(item: Any) -> Any:
        if type(item) is list and len(item) < _SHARE_AT:
            return item
        seen = known.get(id(item))
        if seen is None:
            seen = known[id(item)] = (item, orjson.dumps(item))  # a Fragment's dumps: its bytes
        json = seen[1]
        if shared is not None and len(json) >= SPLIT_AT:
            shared.append(json)
            return _MARK
        return item if type(item) is orjson.Fragment else orjson.Fragment(json)
    return _rewritten(value, replace)


def _rewritten(value: Any, replace: Any) -> Any:
    """`value` (not changed) copied along the paths to `logprobs` lists and Fragments, each one
    `replace(it)` instead."""
    if type(value) is dict:
        copy = None
        for key, item in value.items():
            if key == "logprobs" and (type(item) is list or type(item) is orjson.Fragment):
                new = replace(item)
            elif type(item) is dict or type(item) is list:
                new = _rewritten(item, replace)
            else:
                continue
            if new is not item:
                if copy is None:
                    copy = dict(value)
                copy[key] = new
        return value if copy is None else copy
    if type(value) is list:
        items = [_rewritten(item, replace) if type(item) is dict else item for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def _fragment(entries: list[Any]) -> orjson.Fragment:
    if _memo and _memo[0] is entries and _memo[1] == len(entries):
        return _memo[2]
    fragment = orjson.Fragment(orjson.dumps(entries))
    _memo[:] = [entries, len(entries), fragment]
    return fragment


# Byte values, not one-byte strings: `b"\n" in chunk` first tries the operand as an int and builds (then
# drops) a TypeError, ~8x the cost of `10 in chunk` (a memchr); twice per network read of every stream.
_LF, _CR = ord("\n"), ord("\r")


async def data_payloads(lines: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yield each event's data (multi-line data joined by newlines), stopping at `[DONE]`.

    `lines` yields lines (aiohttp's StreamReader does, and has `iter_any`: then whatever has
    arrived is split here, one await per network read instead of one per line).
    """
    async with aclosing(data_batches(lines)) as batches:
        async for batch in batches:
            for data in batch:
                yield data


async def data_batches(lines: AsyncIterable[bytes]) -> AsyncIterator[list[bytes]]:
    """`data_payloads`, a list at a time: the events completed by one read come together (never
    an empty list), so a caller can answer a whole network read with one write. Reads (`iter_any`)
    of more than MAX_EVENT_BYTES that complete no event raise UpstreamFormatError."""
    buffer: list[bytes] = []  # the data lines of an event whose blank line has not arrived
    if hasattr(lines, "iter_any"):
        pending: list[bytes] = []  # the start of a line whose end has not arrived
        # Bytes read since a read last completed an event: pending and buffer hold no more than these and the
        # rest of that read.
        unfinished = 0
        whole_events = fastpath.sse_events if fastpath is not None else None
        async for chunk in lines.iter_any():
            unfinished += len(chunk)
            if unfinished > MAX_EVENT_BYTES:
                raise UpstreamFormatError(f"the upstream sent over {MAX_EVENT_BYTES >> 20} MiB without ending an event")
            if _LF not in chunk:
                pending.append(chunk)
                continue
            if pending:
                pending.append(chunk)
                chunk = b"".join(pending)
                pending = []
            if whole_events is not None and not buffer:
                read = whole_events(chunk)  # whole `data:` events and a line's start, in C; None: anything else
                if read is not None:
                    payloads, done, cut = read
                    if cut < len(chunk):
                        pending.append(chunk[cut:])
                    if payloads:
                        unfinished = 0
                        yield payloads
                    if done:
                        return
                    continue
            split = chunk.split(b"\n")
            rest = split.pop()
            if rest:
                pending.append(rest)
            if _CR in chunk:
                split = [line.rstrip(b"\r") for line in split]
            payloads, done = _events(split, buffer)
            if payloads:
                unfinished = 0
                yield payloads
            if done:
                return
        if pending:
            payloads, done = _events([b"".join(pending).rstrip(b"\r\n")], buffer)
            if payloads:
                yield payloads
            if done:
                return
    else:
        async with aclosing(_stripped(lines)) as source:
            async for line in source:
                payloads, done = _events((line,), buffer)
                if payloads:
                    yield payloads
                if done:
                    return
    if buffer:
        data = b"\n".join(buffer)
        if data.strip() != b"[DONE]":
            yield [data]


def split_events(raw: bytes) -> list[bytes]:
    """A whole event stream's bytes (read to its end) -> the data of each event, up to `[DONE]`."""
    buffer: list[bytes] = []
    payloads, _ = _events([line.rstrip(b"\r") for line in raw.split(b"\n")] + [b""], buffer)
    return payloads


def _events(lines: Iterable[bytes], buffer: list[bytes]) -> tuple[list[bytes], bool]:
    """The data of each event these lines (line ends removed) complete, and whether `[DONE]` came.

    `buffer` holds the data lines of the event in progress, from one call to the next."""
    payloads: list[bytes] = []
    for line in lines:
        if not line:
            if buffer:
                data = b"\n".join(buffer) if len(buffer) > 1 else buffer[0]
                buffer.clear()
                if data.strip() == b"[DONE]":
                    return payloads, True
                payloads.append(data)
            continue
        if line.startswith(b"data:"):
            buffer.append(line[6:] if line.startswith(b"data: ") else line[5:])
        elif line.startswith(b"error:"):
            # llama.cpp (tools/server: `server_sent_event(sink, "error", ...)`) reports a failure inside
            # a stream as an `error: {code, message, type}` line: handed on as the `{"error": ...}`
            # object other servers put in a data frame.
            payloads.append(b'{"error":' + line[6:].strip() + b"}")
        # `event:`, `id:`, `retry:` and comments carry nothing we need from a chat/completions server.
    return payloads, False


async def _stripped(lines: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for raw in lines:
        yield raw.rstrip(b"\r\n")
