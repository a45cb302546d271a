"""Soak: N concurrent streams through the gateway for a bounded time; errors, latency, memory.

    python -m bench.soak --streams 200 --seconds 600 [--json out.json]

Starts, on loopback only, a vLLM-dialect simulator (the project's demo tokenizer, so emoji and CJK
split into byte tokens) and the gateway (`responses-gateway serve`) as separate processes, then
keeps `--streams` streamed Responses requests with logprobs in flight until the time is up. Every
stream is checked end to end (terminal event, exact bytes == text). Prints one summary and the
gateway's RSS over time; `--json` writes the same figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.procstat import rss_mb

MODEL = "demo-model"
REQUEST = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 48, "ignore_eos": True,
           "include": ["message.output_text.logprobs"], "top_logprobs": 5}


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    first_events: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    tokens: int = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, process: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process {process.args[0]} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


def _check_stream(raw: bytes) -> tuple[str | None, int]:
    """None if the stream is complete and exact; else what is wrong."""
    frames = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    if not frames:
        return "no_frames", 0
    terminal = frames[-1]
    if terminal.get("type") not in ("response.completed", "response.incomplete"):
        return f"terminal:{terminal.get('type')}", 0
    part = terminal["response"]["output"][0]["content"][0]
    joined = b"".join(bytes(entry["bytes"]) for entry in part["logprobs"])
    text = part["text"].encode()
    # A length cap may stop inside a character: its bytes dangle after the text.
    if not joined.startswith(text) or len(joined) - len(text) > 3:
        return "bytes_mismatch", 0
    return None, len(part["logprobs"])


async def _worker(session: aiohttp.ClientSession, url: str, deadline: float, tally: Tally) -> None:
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            async with session.post(url, json=REQUEST) as reply:
                if reply.status != 200:
                    tally.error(f"http_{reply.status}")
                    await reply.read()
                    continue
                first = await reply.content.readline()
                tally.first_events.append(time.perf_counter() - started)
                raw = first + await reply.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.error(type(exc).__name__)
            continue
        problem, tokens = _check_stream(raw)
        if problem:
            tally.error(problem)
            continue
        tally.latencies.append(time.perf_counter() - started)
        tally.tokens += tokens


async def _drive(url: str, streams: int, seconds: float, gateway_pid: int, samples: list[tuple[float, float]]
                 ) -> Tally:
    tally = Tally()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=streams)
    timeout = aiohttp.ClientTimeout(total=120)
    start = time.monotonic()

    async def sample_memory() -> None:
        while time.monotonic() < deadline:
            samples.append((round(time.monotonic() - start, 1), round(rss_mb(gateway_pid), 1)))
            await asyncio.sleep(max(1.0, seconds / 30))

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        sampler = asyncio.create_task(sample_memory())
        await asyncio.gather(*(_worker(session, url, deadline, tally) for _ in range(streams)))
        sampler.cancel()
    return tally


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def soak(streams: int, seconds: float) -> dict[str, Any]:
    """Run one soak and return its figures (processes are started and stopped here)."""
    sim_port, gw_port = _free_port(), _free_port()
    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    config = folder / "config.yaml"
    config.write_text(json.dumps({
        "upstreams": {"sim": {"urls": [f"http://127.0.0.1:{sim_port}"], "health_interval": 0,
                              "timeouts": {"total": 120}}},
        "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
        "store": {"backend": "none"}, "logging": {"level": "warning"}}))
    python = sys.executable
    exe = str(Path(python).parent / "responses-gateway")
    sim = subprocess.Popen([python, "-m", "gateway.simulator.vllm", "--demo-tokenizer", "--model", MODEL,
                            "--port", str(sim_port), "--tokens-per-step", "vary"],
                           stdout=subprocess.DEVNULL, stderr=open(folder / "sim.log", "w"))  # noqa: SIM115
    gateway = subprocess.Popen([exe, "serve", "--config", str(config), "--port", str(gw_port)],
                               stdout=subprocess.DEVNULL, stderr=open(folder / "gateway.log", "w"))  # noqa: SIM115
    try:
        _wait_port(sim_port, sim)
        _wait_port(gw_port, gateway)
        samples: list[tuple[float, float]] = []
        rss_start = rss_mb(gateway.pid)
        wall = time.monotonic()
        tally = asyncio.run(_drive(f"http://127.0.0.1:{gw_port}/v1/responses", streams, seconds, gateway.pid,
                                   samples))
        wall = time.monotonic() - wall
        rss_end = rss_mb(gateway.pid)
    finally:
        for process in (gateway, sim):
            process.send_signal(signal.SIGTERM)
        for process in (gateway, sim):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    # Memory after warm-up (the first tenth) against the end: a leak shows as steady growth.
    warm = [mb for t, mb in samples if t >= seconds / 10] or [rss_start]
    return {
        "streams": streams, "seconds": round(wall, 1), "requests": len(tally.latencies),
        "errors": sum(tally.errors.values()), "error_kinds": tally.errors,
        "tokens": tally.tokens, "requests_per_s": round(len(tally.latencies) / wall, 1),
        "p50_ms": round(statistics.median(tally.latencies) * 1000, 1) if tally.latencies else None,
        "p99_ms": round((_percentile(tally.latencies, 0.99) or 0) * 1000, 1),
        "first_event_p50_ms": round((_percentile(tally.first_events, 0.5) or 0) * 1000, 1),
        "rss_start_mb": round(rss_start, 1), "rss_after_warmup_mb": round(warm[0], 1),
        "rss_end_mb": round(rss_end, 1), "rss_peak_mb": max(mb for _, mb in samples) if samples else rss_end,
        "rss_growth_after_warmup_mb": round(rss_end - warm[0], 1), "rss_samples": samples,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    figures = soak(args.streams, args.seconds)
    shown = {k: v for k, v in figures.items() if k != "rss_samples"}
    print(json.dumps(shown, indent=2))
    print("gateway RSS (s, MB):", " ".join(f"{t:g}:{mb:g}" for t, mb in figures["rss_samples"]))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if figures["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
