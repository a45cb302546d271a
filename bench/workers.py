"""How `serve --workers N` scales: streamed Responses with 1 and 2 workers, each next to a relay with as many
processes, in the default configuration (store on, SQLite).

    .venv/bin/python -m bench.workers               # ~3 minutes: 4 interleaved rounds of each row
    .venv/bin/python -m bench.workers --wrk --burst # the same with wrk and a bursting upstream (less load beside)

Row: streamed Responses, 100 tokens, k=5, concurrency 64, driven against the direct upstream, the relay
(`bench.relay --workers N`) and the gateway (`serve --workers N`) back to back (bench/run.py's cells).
The 1- and 2-worker stacks run side by side and the row alternates between them (A B, then B A, ...),
so machine noise hits both alike; medians over rounds. Nothing is pinned: with 2 workers the gateway
needs both cores, so the 1-worker row is unpinned too (the upstream and the load generator share the
cores with it).
Targets (issue 19): 2 workers >= 1.8x the streams/s of 1 worker, and >= 50% of a 2-worker relay's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from bench.canned import Case, record_to_file
from bench.run import QUICK, ROOT, Plan, _median, _wait_quiet, machine, run_cell, start_stack
from bench.wrk import available as wrk_available
from bench.wrk import wrk_cell

CASE, CONCURRENCY = Case("chat", True, 5, 100), 64
WORKERS = (1, 2)


def run(out: Path, rounds: int, duration: float, *, demo_vocab: bool = False, progress: bool = True,
        load: str = "aiohttp", burst: bool = False) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    canned_path = out / "canned.json"
    canned = record_to_file([CASE], canned_path, use_qwen2=False if demo_vocab else None)
    plan = Plan(**{**QUICK.__dict__, "duration": duration, "max_seconds": max(4 * duration, 2.0)})
    cells: dict[int, list[dict[str, Any]]] = {n: [] for n in WORKERS}
    with contextlib.ExitStack() as running:
        # Both stacks run side by side (the idle one takes no CPU), alternating A B, then B A, ...: a machine
        # that speeds up or slows down over the run hits both alike.
        stacks = {}
        for workers in WORKERS:
            where = out / f"workers-{workers}"
            where.mkdir(exist_ok=True)
            stacks[workers] = (running.enter_context(start_stack(canned, canned_path, where, burst=burst, pin=False,
                                                                 store="sqlite", workers=workers)), where)
        for round_ in range(rounds):
            for workers in WORKERS if round_ % 2 == 0 else WORKERS[::-1]:
                stack, where = stacks[workers]
                if load == "wrk":
                    cell = wrk_cell(stack, canned, CASE, CONCURRENCY, duration, where)
                else:
                    cell = run_cell(stack, canned, CASE, CONCURRENCY, plan)
                cells[workers].append(cell)
                if progress:
                    g, r = cell["gateway"], cell["relay"]
                    print(f"round {round_ + 1} workers={workers}: gateway {g['rps']:.1f} streams/s, relay "
                          f"{r['rps']:.1f}/s, direct {cell['direct']['rps']:.1f}/s, errors {g['errors']}",
                          flush=True)
    summary = {n: {"streams_per_s": _median([c["gateway"]["rps"] for c in cells[n]]),
                   "relay_streams_per_s": _median([c["relay"]["rps"] for c in cells[n]]),
                   "direct_streams_per_s": _median([c["direct"]["rps"] for c in cells[n]]),
                   "other_load_cores": (None if load == "wrk"  # not measured with wrk
                                        else _median([c["gateway"].get("other_load_cores") or 0 for c in cells[n]])),
                   "errors": sum(c["gateway"]["errors"] + c["relay"]["errors"] for c in cells[n])}
               for n in WORKERS}
    for n in WORKERS if load != "wrk" else ():  # (wrk's cells measure no CPU)
        summary[n]["cpu_ms_per_stream"] = {
            target: {name: _median([1000 * c[target]["cpu_seconds"][name] / max(c[target]["sent"], 1)
                                    for c in cells[n]])
                     for name in cells[n][0][target]["cpu_seconds"]}
            for target in ("gateway", "relay")}
        summary[n]["bound_streams_per_s"] = {
            target: machine_bound(summary[n]["cpu_ms_per_stream"][target], target, n, len(os.sched_getaffinity(0)))
            for target in ("gateway", "relay")}
    one, two = summary[1], summary[2]
    return {"machine": machine(), "cpus": len(os.sched_getaffinity(0)), "rounds": rounds, "duration": duration,
            "vocab": canned["vocab"], "summary": summary, "load": load, "burst": burst,
            "scaling": two["streams_per_s"] / one["streams_per_s"],
            "relay_scaling": two["relay_streams_per_s"] / one["relay_streams_per_s"],
            "share_of_relay": two["streams_per_s"] / two["relay_streams_per_s"],
            "scaling_bound": (two["bound_streams_per_s"]["gateway"] / one["bound_streams_per_s"]["gateway"]
                              if load != "wrk" else None)}


def machine_bound(cpu_ms: dict[str, float], target: str, workers: int, cores: int) -> float:
    """The most streams/s the measured CPU per stream allows on `cores`: each single process (the replay
    upstream, the load generator) uses at most one core, the target's `workers` processes at most one each,
    and all of them together at most `cores`. On a 2-core machine the upstream and the load generator take
    their share of the cores a second worker would need: that, not the gateway, is what caps the scaling."""
    caps = [1000 * cores / max(sum(cpu_ms.values()), 1e-9)]
    for name, ms in cpu_ms.items():
        caps.append(1000 * (workers if name == target else 1) / max(ms, 1e-9))
    return min(caps)


def markdown(report: dict[str, Any], command: str) -> str:
    s = report["summary"]
    lines = [f"`{command}` ({report['rounds']} rounds, medians; vocab {report['vocab']}; {report['cpus']} CPUs; "
             f"streamed Responses, {CASE.tokens} tokens, k={CASE.k}, c={CONCURRENCY}, store sqlite, unpinned; "
             f"load generator {report['load']}{', upstream in bursts' if report['burst'] else ''})", "",
             "| workers | gateway streams/s | relay streams/s (same processes) | gateway % of relay | direct upstream "
             "| other load (cores) | errors |",
             "|---|---|---|---|---|---|---|"]
    for n in WORKERS:
        row = s[n]
        other = "-" if row["other_load_cores"] is None else f"{row['other_load_cores']:.2f}"
        lines.append(f"| {n} | {row['streams_per_s']:.1f} | {row['relay_streams_per_s']:.1f} | "
                     f"{100 * row['streams_per_s'] / row['relay_streams_per_s']:.0f}% | "
                     f"{row['direct_streams_per_s']:.1f} | {other} | {row['errors']} |")
    if report["scaling_bound"] is not None:
        lines += _bound_lines(report)
    scaling, share = report["scaling"], report["share_of_relay"]
    met = "met" if scaling >= 1.8 else "MISSED"
    lines += ["", f"Scaling, 2 workers over 1: {scaling:.2f}x (target >= 1.8x: {met}); "
                  f"the relay's own: {report['relay_scaling']:.2f}x. 2-worker gateway = {100 * share:.0f}% of the "
                  f"2-worker relay (target >= 50%: {'met' if share >= 0.5 else 'MISSED'})."]
    return "\n".join(lines)


def _bound_lines(report: dict[str, Any]) -> list[str]:
    """Each row's CPU per stream, by process, and the streams/s it allows on this machine's cores."""
    lines = ["", f"CPU per stream (ms, warm-up included) and the most streams/s it allows on {report['cpus']} cores "
             "(`machine_bound`):", "",
             "| workers | gateway | its upstream | its load generator | bound | relay | its upstream "
             "| its load generator | bound |", "|---|---|---|---|---|---|---|---|---|"]
    for n in WORKERS:
        row = report["summary"][n]
        cpu, bound = row["cpu_ms_per_stream"], row["bound_streams_per_s"]
        g, r = cpu["gateway"], cpu["relay"]
        lines.append(f"| {n} | {g['gateway']:.2f} | {g['upstream']:.2f} | {g['loadgen']:.2f} | "
                     f"{bound['gateway']:.0f}/s | {r['relay']:.2f} | {r['upstream']:.2f} | {r['loadgen']:.2f} | "
                     f"{bound['relay']:.0f}/s |")
    lines += ["", f"With this CPU per stream the machine allows at most {report['scaling_bound']:.2f}x "
                  "from the second worker."]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description="serve --workers 1 vs 2")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out-workers")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measured window")
    parser.add_argument("--demo-vocab", action="store_true", help="the demo tokenizer even if Qwen2 is present")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for other processes to leave the cores (shared machines)")
    parser.add_argument("--wrk", action="store_true",
                        help="drive the targets with wrk (Debian's package; C, far cheaper on shared cores) instead "
                             "of the aiohttp load generator")
    parser.add_argument("--burst", action="store_true",
                        help="the replay upstream writes each stream in one go (cheaper for it on shared cores)")
    args = parser.parse_args(argv)
    if args.wrk and not wrk_available():
        parser.error("--wrk: no `wrk` on PATH (Debian: apt-get install wrk)")
    if args.wait_quiet > 0:
        _wait_quiet(args.wait_quiet)
    given = argv if argv is not None else sys.argv[1:]
    command = "python -m bench.workers " + " ".join(shlex.quote(a) for a in given)
    report = run(args.out, args.rounds, args.duration, demo_vocab=args.demo_vocab,
                 load="wrk" if args.wrk else "aiohttp", burst=args.burst)
    print()
    print(markdown(report, command.strip()))
    return 0 if all(row["errors"] == 0 for row in report["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
