"""How fast this machine runs right now: a fixed piece of work, timed.

A shared VM's host can slow every core down with no steal time showing (shared caches, memory
bandwidth, clock). On the AMD machine on 2026-12-03 a CPU-bound one-liner ran at half its usual speed
for minutes, and the bare relay fell from 704 to 442 streams/s in a quick plan whose report showed 0.001
cores of steal. Every benchmark cell times this probe just before and just after its load
(`bench.run.measure`), and the reports say how far the probe moved over the run: figures taken while it
was slow are not comparable with figures taken while it was fast, and ratios only within one cell.

The work is what the gateway does most: JSON read and written (orjson, a list of logprob-like entries),
plus plain interpreter arithmetic. It runs in the benchmark's own process, which no cell loads.
"""

from __future__ import annotations

import statistics
import time

import orjson

# ~100 KB of JSON: 300 entries shaped like a Responses logprob with 5 alternatives.
_DOCUMENT = [{"token": f"tok{i}", "logprob": -0.001 * i, "bytes": [116, 111, 107, 48 + i % 10],
              "top_logprobs": [{"token": f"alt{j}", "logprob": -1.5 - j / 7, "bytes": [97, 108, 116, 48 + j]}
                               for j in range(5)]} for i in range(300)]


def _work() -> int:
    total = 0
    for _ in range(3):
        total += len(orjson.loads(orjson.dumps(_DOCUMENT)))
    return total + sum(i * i for i in range(10_000))


def probe_ms(rounds: int = 5) -> float:
    """Milliseconds the fixed work takes: the fastest of `rounds` (a quiet machine, ~1-2 ms in all)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        _work()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def spread(values: list[float]) -> dict[str, float]:
    """min, median and max of the probe over a run; `slowdown` is max / min (1.0: the machine held its speed)."""
    if not values:
        return {"min": 0.0, "median": 0.0, "max": 0.0, "slowdown": 1.0}
    low, high = min(values), max(values)
    return {"min": round(low, 3), "median": round(statistics.median(values), 3), "max": round(high, 3),
            "slowdown": round(high / low, 2) if low > 0 else 1.0}


def sentence(figures: dict[str, float]) -> str:
    """What a report says about the probe (bench/speed.py)."""
    text = (f"Machine speed: a fixed probe (bench/speed.py) took {figures['min']:.2f}–{figures['max']:.2f} ms "
            f"around the cells (median {figures['median']:.2f})")
    if figures["slowdown"] > 1.15:
        return text + (f": {figures['slowdown']:.2f}× between its fastest and slowest, so the host slowed this "
                       "machine down during the run; compare figures within a cell, not across cells or runs.")
    return text + ": the machine held its speed."
