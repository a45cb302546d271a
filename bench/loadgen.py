"""Closed-loop load generator (aiohttp client), run as its own process by `bench.run`.

Reads one job per line (JSON) on stdin and answers each with one line of results on stdout, so
the process, its connection pool and its event loop are started once for the whole run.

A job: `concurrency` workers each send the same request back to back. One round of warm-up
requests opens the connections and estimates the latency; then the measured window runs for
`duration` seconds (at least 5 warm-up latencies, at most `max_seconds`); workers start no request
after it. Throughput counts each request by the share of it that falls inside the window; latency
percentiles are over every request of the window (warm-up excluded). Every
response is checked cheaply (status, the terminal event); the first of each worker is checked
fully (every token's logprob entry is there, the bytes spell the text).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.loop import install_uvloop

_TERMINAL = {
    "responses": (b"event: response.completed", b"event: response.incomplete"),
    "chat": (b"data: [DONE]",),
    "completions": (b"data: [DONE]",),
}
_FIRST_TOKEN = {
    "responses": b"response.output_text.delta",
    "chat": b'"delta":{"content":',
    "completions": b'"text":',
}


@dataclass(slots=True)
class Sample:
    start: float
    end: float
    first_event: float | None
    first_token: float | None
    ok: bool
    error: str | None = None


@dataclass(slots=True)
class Job:
    url: str
    body: bytes
    stream: bool
    kind: str  # responses | chat | completions: what to check
    tokens: int
    concurrency: int
    duration: float
    max_seconds: float
    samples: list[Sample] = field(default_factory=list)


def _check_full_stream(kind: str, raw: bytes, tokens: int) -> str | None:
    frames = [block for block in raw.split(b"\n\n") if block]
    if kind == "responses":
        last = frames[-1].split(b"\n", 1)[1].removeprefix(b"data: ")
        response = orjson.loads(last)["response"]
        return _check_response(response, tokens)
    count = 0
    for frame in frames:
        data = frame.removeprefix(b"data: ")
        if data == b"[DONE]":
            continue
        choices = orjson.loads(data).get("choices") or []
        if choices and choices[0].get("logprobs"):
            logprobs = choices[0]["logprobs"]
            count += len(logprobs["content"] if kind == "chat" else logprobs["tokens"])
    return None if count == tokens else f"{count} logprob entries in the stream, expected {tokens}"


def _check_response(response: dict[str, Any], tokens: int) -> str | None:
    if response["status"] not in ("completed", "incomplete"):
        return f"response status {response['status']}"
    part = response["output"][0]["content"][0]
    entries = part["logprobs"]
    if len(entries) != tokens:
        return f"{len(entries)} logprob entries, expected {tokens}"
    joined = b"".join(bytes(entry["bytes"]) for entry in entries)
    if not joined.startswith(part["text"].encode()):
        return "the tokens' bytes do not spell the text"
    return None


def _check_full_body(kind: str, raw: bytes, tokens: int) -> str | None:
    body = orjson.loads(raw)
    if kind == "responses":
        return _check_response(body, tokens)
    logprobs = body["choices"][0]["logprobs"]
    count = len(logprobs["content"] if kind == "chat" else logprobs["tokens"])
    return None if count == tokens else f"{count} logprob entries, expected {tokens}"


async def _one(session: aiohttp.ClientSession, job: Job, full_check: bool) -> Sample:
    start = time.perf_counter()
    first_event = first_token = None
    try:
        async with session.post(job.url, data=job.body, headers={"Content-Type": "application/json"}) as reply:
            if reply.status != 200:
                text = (await reply.read())[:200]
                return Sample(start, time.perf_counter(), None, None, False, f"HTTP {reply.status}: {text!r}")
            if not job.stream:
                raw = await reply.read()
                end = time.perf_counter()
                error = _check_full_body(job.kind, raw, job.tokens) if full_check else None
                if not raw:
                    error = "empty body"
                return Sample(start, end, None, None, error is None, error)
            marker = _FIRST_TOKEN[job.kind]
            terminal = _TERMINAL[job.kind]
            kept: list[bytes] = []
            seen_terminal = False
            tail = b""
            async for chunk in reply.content.iter_any():
                now = time.perf_counter()
                if first_event is None:
                    first_event = now
                seam = tail + chunk[:64]  # a marker split across two reads
                if first_token is None and (marker in chunk or marker in seam):
                    first_token = now
                if not seen_terminal and any(t in chunk or t in seam for t in terminal):
                    seen_terminal = True
                tail = chunk[-64:]
                if full_check:
                    kept.append(chunk)
            end = time.perf_counter()
            error = None if seen_terminal else "no terminal event"
            if error is None and full_check:
                error = _check_full_stream(job.kind, b"".join(kept), job.tokens)
            return Sample(start, end, first_event, first_token, error is None, error)
    except Exception as exc:
        return Sample(start, time.perf_counter(), first_event, first_token, False, f"{type(exc).__name__}: {exc}")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def run_job(session: aiohttp.ClientSession, spec: dict[str, Any]) -> dict[str, Any]:
    job = Job(spec["url"], spec["body"].encode(), spec["stream"], spec["kind"], spec["tokens"],
              spec["concurrency"], spec["duration"], spec["max_seconds"])
    # Warm-up: one round at full concurrency (opens the pool's connections), fully checked.
    warm = await asyncio.gather(*(_one(session, job, True) for _ in range(job.concurrency)))
    errors = [s.error for s in warm if not s.ok]
    warm_latency = max(s.end - s.start for s in warm)
    window = min(max(job.duration, 5 * warm_latency), job.max_seconds)
    t0 = time.perf_counter()
    deadline = t0 + window

    async def worker() -> list[Sample]:
        mine: list[Sample] = []
        first = True
        while time.perf_counter() < deadline:
            mine.append(await _one(session, job, first))
            first = False
        return mine

    results = await asyncio.gather(*(worker() for _ in range(job.concurrency)))
    t_end = time.perf_counter()
    samples = [s for group in results for s in group]
    errors += [s.error for s in samples if not s.ok]
    done = [s for s in samples if s.ok]
    # Throughput: each request counts for the share of its duration that falls inside the window,
    # so requests in flight at the deadline are neither dropped nor counted whole (unbiased in a
    # steady state, also when a request takes longer than the window).
    served = sum((min(s.end, deadline) - max(s.start, t0)) / (s.end - s.start)
                 for s in done if s.end > s.start and s.start < deadline)
    latencies = [s.end - s.start for s in done]
    first_events = [s.first_event - s.start for s in done if s.first_event is not None]
    first_tokens = [s.first_token - s.start for s in done if s.first_token is not None]
    ms = 1000.0
    return {
        "requests": len(done),
        "sent": len(samples) + len(warm),
        "errors": len(errors),
        "error_examples": sorted(set(e for e in errors if e))[:3],
        "window_s": window,
        "wall_s": t_end - t0,
        "rps": served / window,
        "tokens_per_s": served * job.tokens / window,
        "p50_ms": (_percentile(latencies, 0.50) or 0) * ms,
        "p99_ms": (_percentile(latencies, 0.99) or 0) * ms,
        "ttfe_p50_ms": None if not first_events else _percentile(first_events, 0.5) * ms,  # type: ignore[operator]
        "ttft_p50_ms": None if not first_tokens else _percentile(first_tokens, 0.5) * ms,  # type: ignore[operator]
    }


async def serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        print("READY", flush=True)
        while line := await reader.readline():
            spec = orjson.loads(line)
            result = await run_job(session, spec)
            print(orjson.dumps(result).decode(), flush=True)


def main() -> int:
    install_uvloop()
    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
