"""Handing freed C-heap memory back to the OS (glibc only; a no-op on musl, macOS, Windows).

glibc keeps pages that Python freed mapped for reuse, so after a burst of streams a gateway's RSS
stays at the burst's high-water mark although its live data is back to the idle size (measured: 256
concurrent streams leave ~175 MB resident; `malloc_trim(0)` brings it to ~130 MB). `serve` trims
once after loading and then whenever it is idle again after its RSS grew (`IdleTrimmer`). Trimming
under load would only make the next requests fault the pages back in, so it waits for idleness.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web

READ_BUFSIZE_ENV = "RESPONSES_GATEWAY_UPSTREAM_READ_BUFSIZE"
RECEIVE_BUFFER_ENV = "RESPONSES_GATEWAY_LONG_STREAM_RECEIVE_BUFFER"
# Each upstream response buffers up to twice its read size before reading pauses; a gateway that is
# CPU-bound behind a fast upstream holds that much per stream (measured, 256 concurrent 1,000-token
# k=5 streams: peak RSS ~312 MB with 65536, ~234-261 with 16384, ~220 with 8192; streams/s on 1,000-token
# streams at c=64: -8% with 16384, -20% with 8192, more reads of fewer frames each). So a stream that
# may run long (no token cap, or one above LONG_STREAM_TOKENS) reads 16 KB at a time: its memory stays
# bounded however long it runs. A short answer's whole body (~60 KB at 100 tokens, k=5) is freed within
# moments, and a smaller read would only cost it CPU (-10% streams/s at 100 tokens, c=64), so it and
# every non-streamed body keep aiohttp's 64 KB. Behind an upstream slower than the gateway (a GPU
# server under load) each read holds what has arrived, a frame or two, whatever the size. The
# environment variable sets one size for every upstream response instead.
# A paused reader does not bound the heap by itself: the event loop reads up to 256 KB per recv and
# aiohttp's parser keeps the rest of a read its paused reader did not take, so each stream could hold
# ~256 KB (heaptrack: the parser's kept tails were the top of bench.memory's peak). Long streams
# therefore connect through their own pool whose sockets ask for a 32 KB receive buffer (Linux
# doubles it): the kernel queues at most that, and the upstream feels the backpressure through TCP
# instead of the gateway's heap taking it. Its cost: one stream moves at most one window (~32-64 KB,
# what the kernel advertises of that buffer) per round trip: 30+ MB/s at 1 ms, 0.3-0.6 MB/s at 100 ms,
# where a GPU server streams ~0.1 MB/s at 100 tokens/s with k=5 logprobs (~800 B a token).
# RECEIVE_BUFFER_ENV sets another size (0: the kernel's autotuned window) for an upstream far away.
# Autotuning stays on for every other upstream connection (their own pool), so large non-streamed
# bodies are not slowed.
DEFAULT_READ_BUFSIZE = 1 << 16
LONG_STREAM_READ_BUFSIZE = 1 << 14
LONG_STREAM_RECEIVE_BUFFER = 1 << 15
LONG_STREAM_TOKENS = 256
IDLE_TRIM_ENV = "RESPONSES_GATEWAY_IDLE_TRIM_SECONDS"
DEFAULT_IDLE_TRIM_SECONDS = 1.0
# Trim only after the RSS grew this much since the last trim: an idle gateway does not trim in a loop.
TRIM_SLACK_BYTES = 8 << 20


def glibc() -> ctypes.CDLL | None:
    """The C library if it is glibc (the only one with `malloc_trim`), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return None
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - raises AttributeError where it is missing
    except (ValueError, OSError, AttributeError):  # no such confstr name (musl), no libc.so.6, no malloc_trim
        return None
    return libc


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the OS: glibc's `malloc_trim(0)`. False if not glibc.

    Loading a tokenizer frees tens of MB of transients (file contents, intermediate dicts) that glibc
    keeps mapped for reuse, so a gateway's RSS would stay that much above what it uses. Elsewhere
    (macOS, musl, Windows) nothing is called.
    """
    libc = glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def idle_trim_seconds(environ: Mapping[str, str]) -> float:
    """How often an idle gateway checks whether to trim (`RESPONSES_GATEWAY_IDLE_TRIM_SECONDS`); 0 = never."""
    raw = environ.get(IDLE_TRIM_ENV, "").strip()
    if not raw:
        return DEFAULT_IDLE_TRIM_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):  # also NaN
        raise ValueError(f"{IDLE_TRIM_ENV} must be a number of seconds >= 0 (0 turns idle trimming off), "
                         f"not {raw!r}")
    return seconds


def upstream_read_bufsize(environ: Mapping[str, str]) -> int:
    """aiohttp's `read_bufsize` for upstream responses (`RESPONSES_GATEWAY_UPSTREAM_READ_BUFSIZE`, bytes)."""
    return configured_read_bufsize(environ) or DEFAULT_READ_BUFSIZE


def configured_read_bufsize(environ: Mapping[str, str]) -> int | None:
    """`RESPONSES_GATEWAY_UPSTREAM_READ_BUFSIZE` in bytes if it is set (checked), else None."""
    return _byte_size(environ, READ_BUFSIZE_ENV, 1024, "")


def _byte_size(environ: Mapping[str, str], name: str, smallest: int, zero_means: str) -> int | None:
    """Environment variable `name` as a whole number of bytes from `smallest` to 16 MB (or 0, when
    `zero_means` says what 0 does); None when it is not set. ValueError names the variable."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        size = int(raw)
    except ValueError:
        size = -1
    if (size == 0 and zero_means) or smallest <= size <= 1 << 24:
        return size
    zero = f"0 ({zero_means}) or " if zero_means else ""
    raise ValueError(f"{name} must be {zero}a whole number of bytes from {smallest} to 16777216, not {raw!r}")


def is_long_stream(max_tokens: int | None, configured: int | None) -> bool:
    """Whether a streamed upstream response goes through the long-stream pool (16 KB reads, a small
    receive window): one with no token cap or one above LONG_STREAM_TOKENS, unless the operator
    configured one read size for all (`configured`)."""
    return configured is None and (max_tokens is None or max_tokens > LONG_STREAM_TOKENS)


def long_stream_receive_buffer(environ: Mapping[str, str]) -> int:
    """The kernel receive buffer a long stream's socket asks for (`RESPONSES_GATEWAY_LONG_STREAM_RECEIVE_BUFFER`,
    bytes; 0: the kernel's own, autotuned), checked."""
    size = _byte_size(environ, RECEIVE_BUFFER_ENV, 4096, "the kernel's window")
    return LONG_STREAM_RECEIVE_BUFFER if size is None else size


def check_environment(environ: Mapping[str, str]) -> None:
    """Read every upstream buffer setting once, so a bad one is refused before anything loads (ValueError)."""
    upstream_read_bufsize(environ)
    long_stream_receive_buffer(environ)


def receive_buffer_socket_factory(receive_buffer: int) -> Callable[[tuple[Any, ...]], socket.socket] | None:
    """A `socket_factory` for aiohttp's connector whose sockets fix their kernel receive buffer at
    `receive_buffer` before they connect, so the window they advertise is small from the first byte
    (None for 0: aiohttp's plain sockets). Why: the comment above DEFAULT_READ_BUFSIZE."""
    if receive_buffer == 0:
        return None

    def small_window_socket(addr_info: tuple[Any, ...]) -> socket.socket:
        family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
        sock = socket.socket(family=family, type=kind, proto=proto)
        with contextlib.suppress(OSError):  # a platform without the option: the stream works, with the OS's window
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        return sock

    return small_window_socket


def resident_bytes() -> int:
    """This process's RSS from /proc/self/statm (Linux, where glibc is); 0 if unreadable."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class IdleTrimmer:
    """Trims when no request is in flight and the RSS grew by `slack` bytes since the last trim."""

    def __init__(self, busy: Callable[[], bool], trim: Callable[[], object],
                 rss: Callable[[], int] = resident_bytes, slack: int = TRIM_SLACK_BYTES) -> None:
        self.busy = busy
        self.trim = trim
        self.rss = rss
        self.slack = slack
        self.floor = rss()  # the RSS right after the last trim (or at start)
        self.trims = 0

    def tick(self) -> bool:
        """One check; True if it trimmed."""
        if self.busy():
            return False
        if self.rss() - self.floor < self.slack:
            return False
        self.trim()
        self.floor = self.rss()
        self.trims += 1
        return True

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.tick()


def install_idle_trim(app: web.Application, busy: Callable[[], bool], interval: float) -> IdleTrimmer | None:
    """Run an `IdleTrimmer` every `interval` seconds while `app` serves; None (nothing runs) if
    `interval` is 0 or the C library is not glibc."""
    libc = glibc()
    if interval <= 0 or libc is None:
        return None
    trimmer = IdleTrimmer(busy, lambda: libc.malloc_trim(0))

    async def trimming(app: web.Application) -> AsyncIterator[None]:
        trimmer.floor = trimmer.rss()  # start-up is loaded and trimmed by now
        task = asyncio.get_running_loop().create_task(trimmer.run(interval))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(trimming)
    return trimmer
