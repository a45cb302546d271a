"""The benchmark's upstream: replays canned vLLM bodies at (almost) no cost.

A raw asyncio HTTP/1.1 server, not aiohttp, so that it stays far cheaper than anything it is
compared through. Every answer is prebuilt at start: headers, body or chunk-encoded SSE frames.
A streamed answer is written one frame per event-loop turn, as vLLM's engine emits one chunk per
step (`--burst` writes the whole stream at once instead). Requests are matched on the fields that
shape the answer (path, stream, k, max_tokens; see `bench.canned.replay_key`).

    python -m bench.upstream --canned canned.json [--port 0] [--burst]
    (prints `READY <port>` when it listens)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

import orjson

from bench.canned import replay_key
from bench.loop import run

_NOT_FOUND = (b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n"
              + b'{"error":{"message":"no canned answer","type":"NotFound"}}'.ljust(60))


_HEALTHY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Answers:
    """Prebuilt responses by replay key: (whole response) or (head, [chunk-encoded frames])."""

    def __init__(self, canned: dict) -> None:
        self.full: dict[str, bytes] = {}
        self.streams: dict[str, tuple[bytes, list[bytes]]] = {}
        for case in canned["cases"].values():
            key = case["replay_key"]
            if case["frames"]:
                head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                        b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")
                frames = [_chunk(frame.encode()) for frame in case["frames"]]
                frames.append(b"0\r\n\r\n")
                self.streams[key] = (head, frames)
            else:
                body = case["body"].encode()
                self.full[key] = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n" % len(body)) + body


class ReplayProtocol(asyncio.Protocol):
    """Keep-alive HTTP/1.1 with Content-Length request bodies (what aiohttp's client sends)."""

    def __init__(self, answers: Answers, burst: bool) -> None:
        self.answers = answers
        self.burst = burst
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a stream is being written; later requests wait in the buffer
        self.can_write = asyncio.Event()
        self.can_write.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.can_write.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._serve_buffered()

    def _serve_buffered(self) -> None:
        while self.transport is not None and not self.busy:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            method, path = head.split(" ", 2)[:2]
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            if method == "POST":
                self._answer(path, body)
            else:  # health probes and the like: the upstream is always well
                self.transport.write(_HEALTHY)

    def _answer(self, path: str, body: bytes) -> None:
        assert self.transport is not None
        try:
            key = replay_key(path, orjson.loads(body))
        except orjson.JSONDecodeError:
            key = ""
        full = self.answers.full.get(key)
        if full is not None:
            self.transport.write(full)
            return
        stream = self.answers.streams.get(key)
        if stream is None:
            self.transport.write(_NOT_FOUND)
            return
        head, frames = stream
        if self.burst:
            self.transport.write(head + b"".join(frames))
            return
        self.busy = True
        asyncio.get_running_loop().create_task(self._write_stream(head, frames))

    async def _write_stream(self, head: bytes, frames: list[bytes]) -> None:
        transport = self.transport
        if transport is None:
            return
        transport.write(head)
        for frame in frames:
            await asyncio.sleep(0)  # one engine step per loop turn, interleaved with other streams
            if not self.can_write.is_set():
                await self.can_write.wait()
            if self.transport is None:
                return
            transport.write(frame)
        self.busy = False
        self._serve_buffered()


async def serve(canned_path: Path, host: str, port: int, burst: bool) -> None:
    answers = Answers(orjson.loads(canned_path.read_bytes()))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ReplayProtocol(answers, burst), host, port, backlog=1024)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream")
    parser.add_argument("--canned", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--burst", action="store_true", help="write each stream in one go")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        run(serve(args.canned, args.host, args.port, args.burst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
