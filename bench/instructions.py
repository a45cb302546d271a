"""Instructions per request (callgrind, user space): the gateway against the bare relay, deterministic.

    .venv/bin/python -m bench.instructions                         # ~2 minutes under valgrind
    .venv/bin/python -m bench.instructions --gateway-src DIR       # another source tree's gateway too

On a shared VM whose host slows every core down (bench/speed.py) the wall-clock ratios of bench.store
move by more than the changes they judge; instruction counts do not. The relay and the gateway run
under `valgrind --tool=callgrind` (collection off until the measured window), the replay upstream and
the client as usual. Rows: non-streamed Responses, 100 tokens, k=5, concurrency 1, chat and completions
routes, with the default store (sqlite) and `store: none`; streamed chat. Per row: the relay's
instructions per request, the gateway's on its event-loop thread and on its other threads (the SQLite
writer), and the gateway's loop over the relay's. Each window's callgrind files stay in `<out>/dumps/`
(`callgrind_annotate --inclusive=yes <file>` says where the instructions went).

Not the issue's target itself: added p50 is wall time, and the kernel's share (syscalls, loopback TCP:
about the same for both, one upstream and one client exchange each) is not counted here, so the wall
ratio sits closer to 1 than this one. What this gives is a figure two commits can be compared on, and
the user-space part of the gap. Large copies weigh more here than on the CPU: callgrind counts each
iteration of glibc's `rep movsb` memcpy (one instruction a byte). Needs valgrind (Debian's `valgrind`);
callgrind slows a process ~50x.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.canned import Case, gateway_config, record_to_file
from bench.run import ROOT, Proc, _await_http, _await_ready, _check_source_tree, _free_port, _gateway_argv, _spawn, stop

ROWS = (Case("chat", False, 5, 100), Case("completions", False, 5, 100), Case("chat", True, 5, 100))
STORES = ("sqlite", "none")
SETTLE_SECONDS = 1.5
_TOTAL = re.compile(rb"^totals: (\d+)", re.MULTILINE)  # (a dump's `summary:` line can read 0)
_THREAD = re.compile(r"-(\d+)$")


@dataclass
class Counted:
    """A process under callgrind: its dumps are files `<base>.<n>-<thread>`."""

    proc: Proc
    base: Path

    def control(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["callgrind_control", *args, str(self.proc.pid)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def files(self) -> set[Path]:
        return set(self.base.parent.glob(self.base.name + ".*"))


def _valgrind(out: Path, name: str) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--instr-atstart=no",
            f"--callgrind-out-file={out / ('callgrind.' + name)}"]


async def _until_done(control: subprocess.Popen[bytes], poke: str, session: aiohttp.ClientSession) -> int:
    """callgrind reads a command only while the process runs: keep it busy with cheap requests until
    `callgrind_control` has its answer. The pokes made (their instructions land in the window)."""
    pokes = 0
    while control.poll() is None:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.get(poke, timeout=aiohttp.ClientTimeout(total=30)) as reply:
                await reply.read()
        pokes += 1
        await asyncio.sleep(0.25)  # callgrind_control looks for the answer about once a second
    return pokes


async def _drive(session: aiohttp.ClientSession, url: str, body: str, count: int) -> None:
    """`count` requests one after the other, each read to its end (the canned request bodies are JSON text)."""
    for _ in range(count):
        async with session.post(url, data=body.encode(), headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=300)) as reply:
            data = await reply.read()
            if reply.status != 200:
                raise RuntimeError(f"{url}: {reply.status} {data[:300]!r}")


async def _window(counted: Counted, url: str, body: str, warm: int, count: int, keep: Path) -> dict[str, Any]:
    """Instructions per request over `count` requests after `warm`, per thread (1: the event loop). The
    window's dumps are kept as `keep`-<thread>, for callgrind_annotate."""
    poke = url.rsplit("/v1/", 1)[0] + "/v1/models"
    async with aiohttp.ClientSession() as session:
        await _drive(session, url, body, warm)
        before = counted.files()
        pokes = await _until_done(counted.control("--zero"), poke, session)
        pokes += await _until_done(counted.control("--instr=on"), poke, session)
        await _drive(session, url, body, count)
        # The last answers' saves are committed by the store's writer after its 20 ms linger (longer under
        # valgrind): let it finish inside the window. The idle loop meanwhile costs next to nothing.
        await asyncio.sleep(SETTLE_SECONDS)
        pokes += await _until_done(counted.control("--instr=off"), poke, session)
        pokes += await _until_done(counted.control("--dump=window"), poke, session)
    deadline = time.monotonic() + 60
    while not (new := counted.files() - before) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    threads: dict[int, int] = {}
    for path in new:
        found = _TOTAL.search(path.read_bytes())
        thread = _THREAD.search(path.name)
        if found and thread:
            threads[int(thread.group(1))] = threads.get(int(thread.group(1)), 0) + int(found.group(1))
        path.replace(keep.with_name(f"{keep.name}-{thread.group(1) if thread else path.name}"))
    loop = threads.pop(1, 0)
    return {"loop_per_request": loop / count, "other_threads_per_request": sum(threads.values()) / count,
            "pokes": pokes, "requests": count}


def _start_counted(name: str, argv: list[str], out: Path, source: Path | None = None) -> Counted:
    base = out / f"callgrind.{name}"
    for stale in base.parent.glob(base.name + "*"):
        stale.unlink()
    proc = _spawn(name, [*_valgrind(out, name), *argv], None, out / f"{name}.log", source=source)
    return Counted(proc, base)


def run(out: Path, requests: int, stream_requests: int, gateway_srcs: list[Path | None], *,
        rows: tuple[Case, ...] = ROWS, stores: tuple[str, ...] = STORES, progress: bool = True) -> dict[str, Any]:
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: None)
    out.mkdir(parents=True, exist_ok=True)
    canned_path = out / "canned.json"
    dumps = out / "dumps"  # each window's callgrind files
    shutil.rmtree(dumps, ignore_errors=True)
    dumps.mkdir()
    say(f"recording {len(rows)} canned upstream answers with the simulator")
    canned = record_to_file(list(rows), canned_path)
    procs: list[Proc] = []
    report: dict[str, Any] = {"requests": requests, "stream_requests": stream_requests, "rows": []}
    try:
        upstream = _spawn("upstream", [sys.executable, "-m", "bench.upstream", "--canned", str(canned_path)], None,
                          out / "upstream.log")
        procs.append(upstream)
        _await_ready(upstream)
        upstream_url = f"http://127.0.0.1:{upstream.port}"
        say("starting the relay under callgrind")
        relay = _start_counted("relay", [sys.executable, "-m", "bench.relay", "--upstream", upstream_url], out)
        procs.append(relay.proc)
        _await_ready(relay.proc, timeout=600)
        relay_url = f"http://127.0.0.1:{relay.proc.port}"
        relay_counts: dict[str, dict[str, Any]] = {}
        for case in rows:
            recorded = canned["cases"][case.key]
            count = stream_requests if case.stream else requests
            say(f"relay: {case.key}, {count} requests")
            relay_counts[case.key] = asyncio.run(_window(relay, relay_url + recorded["path"],
                                                         recorded["upstream_request"], 5, count,
                                                         dumps / f"relay.{case.key.replace('/', '.')}"))
        for source in gateway_srcs:
            if source is not None:
                _check_source_tree(source)
            for store in stores:
                port = _free_port()
                config_path = out / f"gateway-{store}.yaml"
                config = gateway_config(upstream_url, canned["model"], canned["tokenizer"], port, store)
                if store == "sqlite":
                    database = out / "store.db"
                    for stale in out.glob("store.db*"):
                        stale.unlink()
                    config["store"]["path"] = str(database)
                config_path.write_text(orjson.dumps(config, option=orjson.OPT_INDENT_2).decode())
                label = f"{source or 'this tree'}, store {store}"
                say(f"starting the gateway under callgrind ({label})")
                gateway = _start_counted("gateway", _gateway_argv(config_path, source), out, source)
                procs.append(gateway.proc)
                gateway_url = f"http://127.0.0.1:{port}"
                _await_http(gateway_url + "/v1/models", gateway.proc, timeout=600)
                for case in rows:
                    recorded = canned["cases"][case.key]
                    count = stream_requests if case.stream else requests
                    say(f"gateway ({label}): {case.key}, {count} requests")
                    tag = f"gateway.{'src' if source else 'this'}.{store}.{case.key.replace('/', '.')}"
                    counts = asyncio.run(_window(gateway, gateway_url + "/v1/responses",
                                                 recorded["responses_request"], 5, count, dumps / tag))
                    relay_loop = relay_counts[case.key]["loop_per_request"]
                    report["rows"].append({
                        "gateway_src": str(source) if source else None, "store": store, "case": case.key,
                        "relay": relay_counts[case.key], "gateway": counts,
                        "gateway_loop_over_relay": counts["loop_per_request"] / relay_loop if relay_loop else None})
                stop([gateway.proc], timeout=60)
                procs.remove(gateway.proc)
    finally:
        stop(procs, timeout=60)
    return report


def _m(value: float) -> str:
    return f"{value / 1e6:.2f}M"


def table(report: dict[str, Any]) -> str:
    lines = ["| gateway | store | row | relay | gateway loop | gateway other threads | loop ÷ relay | pokes |",
             "|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        relay, gateway = row["relay"], row["gateway"]
        lines.append(f"| {row['gateway_src'] or 'this tree'} | {row['store']} | {row['case']} "
                     f"| {_m(relay['loop_per_request'])} | {_m(gateway['loop_per_request'])} "
                     f"| {_m(gateway['other_threads_per_request'])} | {row['gateway_loop_over_relay']:.2f}× "
                     f"| {relay['pokes']} / {gateway['pokes']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions",
                                     description="instructions per request, gateway vs relay (callgrind)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out-instructions")
    parser.add_argument("--requests", type=int, default=100, help="measured non-streamed requests per row")
    parser.add_argument("--stream-requests", type=int, default=30, help="measured streamed requests per row")
    parser.add_argument("--gateway-src", type=Path, help="also measure the gateway of this source tree (A/B)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench.instructions needs valgrind (callgrind_control): apt-get install valgrind", file=sys.stderr)
        return 2
    srcs: list[Path | None] = [None, *([args.gateway_src.resolve()] if args.gateway_src else [])]
    report = run(args.out.resolve(), args.requests, args.stream_requests, srcs)
    (args.out / "instructions.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
