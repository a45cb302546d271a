"""What the response store costs: the default configuration (store on, SQLite) against `store: none`.

    .venv/bin/python -m bench.store                 # ~5 minutes: 4 interleaved rounds of each row
    .venv/bin/python -m bench.store --gateway-src DIR   # the same for another source tree (A/B)

Rows, each driven against the direct upstream, the relay and the gateway back to back (bench/run.py's
cells): non-streamed Responses, 100 tokens, k=5, concurrency 1, on a chat and on a completions route
(added p50, the gateway's against the relay's) and streamed, 100 tokens, k=5, concurrency 16 (streams/s).
The two stacks run side by side and each row alternates between them (A B, then B A, ...), so machine
noise hits both alike; the tables give medians over rounds, the store's overhead is the median of each
round's pair (two cells that ran next to each other), with every round's shown. Then the SQLite file:
its size after a WAL checkpoint over the responses it holds (bytes per stored response), and after
VACUUM. Targets (issue 19): the default store costs at most 15% over `store: none` on each row; a stored
100-token k=5 response takes at most 8 KB.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sqlite3
import sys
from pathlib import Path
from typing import Any

import orjson

from bench import speed
from bench.canned import Case, record_to_file
from bench.run import QUICK, ROOT, TARGETS, Plan, _median, _wait_quiet, machine, run_cell, start_stack

NONSTREAM_APIS = ("chat", "completions")
STREAM_CASE = Case("chat", True, 5, 100)
ROWS = (*((Case(api, False, 5, 100), 1) for api in NONSTREAM_APIS), (STREAM_CASE, 16))
CONFIGS = ("sqlite", "none")


def _file_figures(path: Path) -> dict[str, Any]:
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        count = db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        size = path.stat().st_size
        payload = db.execute("SELECT SUM(LENGTH(response) + LENGTH(input_items)) FROM responses").fetchone()[0]
        db.execute("VACUUM")
        vacuumed = path.stat().st_size
    finally:
        db.close()
    return {"responses": count, "file_bytes": size, "bytes_per_response": size / count if count else None,
            "vacuumed_bytes_per_response": vacuumed / count if count else None,
            "blob_bytes_per_response": payload / count if count else None}


def _cpu_ms(cell: dict[str, Any]) -> float:
    """The gateway process's own CPU (the writer thread included) per request, in ms."""
    return 1000 * cell["gateway"]["cpu_s"] / max(cell["gateway"]["sent"], 1)


def run(out: Path, rounds: int, duration: float, gateway_src: Path | None = None, *, pin: bool = True,
        demo_vocab: bool = False, progress: bool = True) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    canned_path = out / "canned.json"
    canned = record_to_file([case for case, _ in ROWS], canned_path, use_qwen2=False if demo_vocab else None)
    plan = Plan(**{**QUICK.__dict__, "duration": duration, "max_seconds": max(4 * duration, 2.0)})
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {c: {case.key: [] for case, _ in ROWS} for c in CONFIGS}
    db_path = out / "sqlite" / "responses.sqlite3"  # the generated config's default path, next to it
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    with contextlib.ExitStack() as running:
        # Both stacks run side by side (the idle one takes no CPU): each row alternates between them,
        # in the order A B B A ..., so a machine that speeds up or slows down over the run hits both alike.
        stacks = {}
        for config in CONFIGS:
            (out / config).mkdir(exist_ok=True)
            stacks[config] = running.enter_context(start_stack(canned, canned_path, out / config, burst=False,
                                                               pin=pin, store=config, gateway_src=gateway_src))
        for round_ in range(rounds):
            for case, conc in ROWS:
                for config in CONFIGS if round_ % 2 == 0 else CONFIGS[::-1]:
                    cell = run_cell(stacks[config], canned, case, conc, plan)
                    cells[config][case.key].append(cell)
                    g = cell["gateway"]
                    if progress:
                        print(f"round {round_ + 1} store={config} {case.key} c={conc}: gw p50 "
                              f"{g['p50_ms']:.2f} ms, {g['rps']:.1f}/s (relay {cell['relay']['rps']:.1f}/s), "
                              f"errors {g['errors']}", flush=True)
    figures = _file_figures(db_path)
    keys = {api: Case(api, False, 5, 100).key for api in NONSTREAM_APIS}
    summary: dict[str, Any] = {}
    for config in CONFIGS:
        stream = cells[config][STREAM_CASE.key]
        nonstream = {}
        for api, key in keys.items():
            full = cells[config][key]
            nonstream[api] = {
                "added_p50_ms": _median([c["added_p50_ms"]["gateway"] for c in full]),
                "relay_added_p50_ms": _median([c["added_p50_ms"]["relay"] for c in full]),
                "over_relay": _median([c["added_p50_ms"]["gateway_over_relay"] or 0 for c in full]),
                # The gateway process's own CPU (the writer thread included) per request: steadier than
                # latency on a machine other jobs keep busy.
                "cpu_ms": _median([_cpu_ms(c) for c in full]),
            }
        summary[config] = {
            "nonstream": nonstream,
            "streams_per_s": _median([c["gateway"]["rps"] for c in stream]),
            "relay_streams_per_s": _median([c["relay"]["rps"] for c in stream]),
            "stream_cpu_ms": _median([_cpu_ms(c) for c in stream]),
            "errors": sum(c["gateway"]["errors"] for by_row in cells[config].values() for c in by_row),
        }
    # Each round's two cells ran next to each other: the overhead is taken round by round (the store's cell
    # against its neighbour), then the median, so a machine that drifts over the run cancels out.
    pairs = {key: list(zip(cells["sqlite"][key], cells["none"][key], strict=True))
             for key in (*keys.values(), STREAM_CASE.key)}
    per_round: dict[str, list[float]] = {}
    for api, key in keys.items():
        per_round[f"nonstream_added_p50_{api}"] = [a["added_p50_ms"]["gateway"] / b["added_p50_ms"]["gateway"] - 1
                                                   for a, b in pairs[key]]
    per_round["streams_per_s"] = [1 - a["gateway"]["rps"] / b["gateway"]["rps"]  # the share lost
                                  for a, b in pairs[STREAM_CASE.key]]
    for api, key in keys.items():
        per_round[f"nonstream_cpu_{api}"] = [_cpu_ms(a) / _cpu_ms(b) - 1 for a, b in pairs[key]]
    per_round["stream_cpu"] = [_cpu_ms(a) / _cpu_ms(b) - 1 for a, b in pairs[STREAM_CASE.key]]
    overhead = {key: _median(values) for key, values in per_round.items() if "cpu" not in key}
    cpu = {key: _median(values) for key, values in per_round.items() if "cpu" in key}
    probes = speed.spread([cell[target]["probe_ms"] for by_row in cells.values() for row_cells in by_row.values()
                           for cell in row_cells for target in TARGETS])
    return {"machine": machine(), "rounds": rounds, "duration": duration, "summary": summary, "probe_ms": probes,
            "vocab": canned["vocab"], "overhead": overhead, "cpu_overhead": cpu, "per_round": per_round,
            "file": figures,
            "gateway_src": str(gateway_src) if gateway_src else None}


def markdown(report: dict[str, Any], command: str) -> str:
    s, o, f, cpu = report["summary"], report["overhead"], report["file"], report["cpu_overhead"]
    lines = [f"`{command}` ({report['rounds']} rounds, medians; vocab {report['vocab']})", "",
             "| store | " + " | ".join(f"non-streamed {api}: added p50 (gw / relay) | × relay"
                                      for api in NONSTREAM_APIS)
             + " | streams/s c=16 (gw / relay) | % relay | gw CPU ms/request (" + ", ".join(NONSTREAM_APIS)
             + ", streamed) | errors |",
             "|---|" + "---|---|" * len(NONSTREAM_APIS) + "---|---|---|---|"]
    for config, label in (("sqlite", "default (sqlite)"), ("none", "none")):
        row = s[config]
        share = 100 * row["streams_per_s"] / row["relay_streams_per_s"]
        nonstream = " | ".join(f"{n['added_p50_ms']:.2f} / {n['relay_added_p50_ms']:.2f} ms | {n['over_relay']:.2f}×"
                               for n in (row["nonstream"][api] for api in NONSTREAM_APIS))
        cpus = ", ".join(f"{row['nonstream'][api]['cpu_ms']:.2f}" for api in NONSTREAM_APIS)
        lines.append(f"| {label} | {nonstream} | {row['streams_per_s']:.1f} / {row['relay_streams_per_s']:.1f} "
                     f"| {share:.0f}% | {cpus}, {row['stream_cpu_ms']:.2f} | {row['errors']} |")
    ok = "met" if max(o.values()) <= 0.15 else "MISSED"
    rounds = report["per_round"]

    def each(key: str, sign: int = 1) -> str:
        return ", ".join(f"{sign * 100 * value:+.0f}%" for value in rounds[key])

    added = ", ".join(f"{api} {100 * o[f'nonstream_added_p50_{api}']:+.0f}% "
                      f"(rounds: {each(f'nonstream_added_p50_{api}')})" for api in NONSTREAM_APIS)
    cpus = ", ".join(f"{api} {100 * cpu[f'nonstream_cpu_{api}']:+.0f}% (rounds: {each(f'nonstream_cpu_{api}')})"
                     for api in NONSTREAM_APIS)
    lines += ["", f"Store overhead over `store: none`, the median of each round's pair (target ≤ 15%, {ok}): "
                  f"non-streamed added p50 {added}; streams/s {-100 * o['streams_per_s']:+.0f}% "
                  f"(rounds: {each('streams_per_s', -1)}).",
              f"Gateway CPU per request over `store: none`: non-streamed {cpus}; streamed "
              f"{100 * cpu['stream_cpu']:+.0f}% (rounds: {each('stream_cpu')}).",
              f"Bytes per stored response (target ≤ 8,192): {f['bytes_per_response']:,.0f} after checkpoint over "
              f"{f['responses']:,} responses ({f['vacuumed_bytes_per_response']:,.0f} after VACUUM; the rows' blobs "
              f"{f['blob_bytes_per_response']:,.0f}).", speed.sentence(report["probe_ms"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store", description="the default store vs store: none")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out-store")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measured window")
    parser.add_argument("--gateway-src", type=Path, help="run the gateway from this source tree (A/B runs)")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for other processes to leave the cores (shared machines)")
    args = parser.parse_args(argv)
    if args.wait_quiet > 0:
        _wait_quiet(args.wait_quiet)
    command = "python -m bench.store " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    report = run(args.out, args.rounds, args.duration, args.gateway_src)
    text = markdown(report, command.strip())
    (args.out / "results.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    (args.out / "results.md").write_text(text + "\n")
    print()
    print(text)
    return 0 if all(row["errors"] == 0 for row in report["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
