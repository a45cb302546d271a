"""The gateway's CPU per streamed Responses request, A/B against another source tree.

    .venv/bin/python -m bench.stream_cpu                          # this tree, 3 rounds
    .venv/bin/python -m bench.stream_cpu --gateway-src DIR        # DIR and this tree, interleaved
    .venv/bin/python -m bench.stream_cpu --profile out.txt        # py-spy on this tree's gateway
    .venv/bin/python -m bench.stream_cpu --non-streamed           # the same for whole (non-streamed) answers
    .venv/bin/python -m bench.stream_cpu --non-streamed --front-door api   # through /v1/chat/completions and
                                                                  # /v1/completions instead of /v1/responses

Rows: streamed Responses, 100 tokens, k=5, concurrency 16, on the chat route and on the completions
route, with the default store (sqlite). Only the gateway is driven (bench/run.py's stack: the replay
upstream writes one frame per loop turn, as vLLM does). The figure is the gateway process's CPU time
(every thread, from /proc) over the requests it served, warm-up included: on a 2-core machine shared
with other jobs this holds far steadier than streams/s. With `--gateway-src` the two trees run one
after the other in every round, so machine noise hits both alike; medians over rounds.

`--non-streamed`: the same rows answered whole, one request at a time (the non-streamed latency target's
cell). There the gateway's added latency is about its CPU per request (measured: the added p50 follows
the process's CPU per request within ~10%), so this figure decides a change to that path on a noisy host.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.canned import Case, record_to_file
from bench.run import QUICK, ROOT, Plan, _median, measure, start_stack

CASES = (Case("chat", True, 5, 100), Case("completions", True, 5, 100))
WHOLE_CASES = (Case("chat", False, 5, 100), Case("completions", False, 5, 100))


def _cpu_ms(result: dict[str, Any]) -> float:
    return 1000 * result["cpu_s"] / max(result["sent"], 1)


def run(out: Path, rounds: int, duration: float, concurrency: int, sources: list[Path | None], store: str,
        profile: Path | None = None, relay: bool = False, cases: tuple[Case, ...] = CASES,
        front_door: str = "responses") -> dict[str, list[float]]:
    out.mkdir(parents=True, exist_ok=True)
    canned_path = out / "canned.json"
    canned = record_to_file(list(cases), canned_path)
    plan = Plan(**{**QUICK.__dict__, "duration": duration, "max_seconds": max(2 * duration, 2.0)})
    figures: dict[str, list[float]] = {}
    for round_ in range(rounds):
        for source in sources:
            label = str(source) if source else "this tree"
            with start_stack(canned, canned_path, out, burst=False, pin=True, store=store,
                             gateway_src=source) as stack:
                spy = None
                if profile is not None:
                    spy = subprocess.Popen([shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
                                            "record", "--pid", str(stack.gateway.pid), "--native", "--format", "raw",
                                            "--rate", "500", "--output", str(profile)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1.0)
                for case in cases:
                    result = measure(stack, canned, case, "gateway", concurrency, plan, front_door)
                    key = f"{label} {case.api}"
                    figures.setdefault(key, []).append(_cpu_ms(result))
                    print(f"round {round_ + 1} {key}: {_cpu_ms(result):.3f} ms CPU/request, {result['rps']:.1f} "
                          f"requests/s, p50 {result['p50_ms']:.3f} ms, {result['sent']} requests, errors "
                          f"{result['errors']}, other load {result['other_load_cores']} cores", flush=True)
                if relay and source is sources[-1]:
                    for case in cases:
                        result = measure(stack, canned, case, "relay", concurrency, plan)
                        key = f"relay {case.api}"
                        figures.setdefault(key, []).append(_cpu_ms(result))
                        print(f"round {round_ + 1} {key}: {_cpu_ms(result):.3f} ms CPU/request, "
                              f"{result['rps']:.1f} requests/s, p50 {result['p50_ms']:.3f} ms", flush=True)
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(timeout=30)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "stream-cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measured window")
    parser.add_argument("--concurrency", type=int, help="requests at a time (default 16; 1 with --non-streamed)")
    parser.add_argument("--non-streamed", action="store_true", help="whole answers instead of streams")
    parser.add_argument("--front-door", choices=["responses", "api"], default="responses",
                        help="ask the gateway on /v1/responses (default) or on each row's own API's door")
    parser.add_argument("--store", default="sqlite", choices=["none", "memory", "sqlite"])
    parser.add_argument("--gateway-src", type=Path, help="also run the gateway from this source tree (before)")
    parser.add_argument("--relay", action="store_true", help="also the bare relay's CPU per request (chat/completions)")
    parser.add_argument("--profile", type=Path, help="py-spy raw (collapsed) stacks of this tree's gateway here")
    args = parser.parse_args(argv)
    sources: list[Path | None] = [args.gateway_src, None] if args.gateway_src else [None]
    concurrency = args.concurrency or (1 if args.non_streamed else 16)
    cases = WHOLE_CASES if args.non_streamed else CASES
    figures = run(args.out, 1 if args.profile else args.rounds, args.duration, concurrency, sources,
                  args.store, args.profile, args.relay, cases, args.front_door)
    print()
    for key, values in figures.items():
        each = ", ".join(f"{v:.2f}" for v in values)
        kind = "whole" if args.non_streamed else "streamed"
        print(f"{key}: median {_median(values):.3f} ms CPU per {kind} request ({each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
