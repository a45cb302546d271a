"""Long streams in bounded memory: peak RSS of one gateway worker under 256 concurrent 1,000-token
streams (k=5, Responses, logprobs included), with the DEFAULT configuration (store on, SQLite).

    .venv/bin/python -m bench.memory [--streams 256] [--tokens 1000] [--store sqlite|none|memory] [--gateway-src DIR]

Prints the gateway's idle and peak RSS, the errors and the target (issue 19: < 200 MB, 0 errors),
using the same stack as `python -m bench` (replay upstream, relay, gateway, load generator).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench import procstat
from bench.canned import Case, record_to_file
from bench.run import Plan, measure, start_stack

TARGET_MB = 200.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--store", default="sqlite", choices=["none", "memory", "sqlite"],
                        help="the gateway's response store (default sqlite: what a user gets by default)")
    parser.add_argument("--gateway-src", type=Path, help="run the gateway from this source tree (before/after runs)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    args = parser.parse_args(argv)
    case = Case("chat", True, 5, args.tokens)
    plan = Plan("memory", ("chat",), (True,), (5,), (args.tokens,), (args.streams,), duration=1.0, max_seconds=30.0,
                many_streams=args.streams, many_tokens=(args.tokens,), target_repeats=1, core=False)
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        out = Path(tmp)
        canned = record_to_file([case], out / "canned.json")
        with start_stack(canned, out / "canned.json", out, burst=False, pin=not args.no_pin,
                         store=args.store, gateway_src=args.gateway_src) as stack:
            idle = procstat.rss_mb(stack.gateway.pid)
            result = measure(stack, canned, case, "gateway", args.streams, plan)
    peak, errors = result["peak_rss_mb"], result["errors"]
    met = peak < TARGET_MB and errors == 0
    print(f"{args.streams} concurrent {args.tokens}-token streams, k=5, store {args.store}: gateway idle "
          f"{idle:.0f} MB, peak RSS {peak:.0f} MB (target < {TARGET_MB:.0f} MB), {result['sent']} streams, "
          f"{errors} errors: {'met' if met else 'MISSED'} (gateway CPU {_cpu_ms_per_1k_tokens(result)} per 1k tokens, "
          f"speed probe {result['probe_ms']:.2f} ms, bench/speed.py)")
    for example in result.get("error_examples", []):
        print(f"  error: {example}")
    return 0 if met else 1


def _cpu_ms_per_1k_tokens(result: dict) -> str:
    """The gateway's CPU per 1k tokens streamed: a change's cost in throughput, beside the streams the run completed."""
    per_1k = result.get("cpu_s_per_1k_tokens")
    return "n/a" if per_1k is None else f"{per_1k * 1000:.1f} ms"


if __name__ == "__main__":
    raise SystemExit(main())
