"""The benchmark: gateway vs a bare relay vs the upstream itself, in one run, with logprobs on.

    .venv/bin/python -m bench --quick     # about 3 minutes
    .venv/bin/python -m bench             # the full matrix

One run records canned vLLM answers with the simulator (bench/canned.py), then starts, each as its
own process: the replay upstream (bench/upstream.py), the relay (bench/relay.py), the gateway
(`responses-gateway serve --config <generated>`) and the load generator (bench/loadgen.py). Every
cell of the matrix is driven against the three targets back to back (direct upstream, relay,
gateway), so machine noise hits them alike; the gateway's figures are also given as ratios to the
relay's and the upstream's from the same cell. On a machine with two or more cores the relay and
the gateway run pinned to one core, the upstream and the load generator to the others, so the
process under test gets one whole core and its CPU use is its own.

Everything listens on 127.0.0.1 only; nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import procstat, speed
from bench.canned import Case, front_door_request, gateway_config, record_to_file
from bench.loop import uvloop_available

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("direct", "relay", "gateway")


@dataclass(frozen=True)
class Plan:
    """What one run measures."""

    name: str
    apis: tuple[str, ...]
    streams: tuple[bool, ...]
    ks: tuple[int, ...]
    tokens: tuple[int, ...]
    concurrency: tuple[int, ...]
    duration: float  # seconds per measured window (at least 5 warm-up latencies)
    max_seconds: float  # hard cap per window
    many_streams: int  # the "many concurrent streams" check
    many_tokens: tuple[int, ...]
    target_repeats: int  # extra interleaved runs of the cells the targets are judged on
    core: bool
    cells_filter: tuple[tuple[int, int], ...] = ()  # (k, tokens) pairs allowed; empty = all
    cells_regex: str | None = None  # only cells whose key (api/mode/kK/nN/cC) matches

    def cells(self) -> list[tuple[Case, int]]:
        out = []
        for api in self.apis:
            for stream in self.streams:
                for tokens in self.tokens:
                    for k in self.ks:
                        if self.cells_filter and (k, tokens) not in self.cells_filter:
                            continue
                        for conc in self.concurrency:
                            case = Case(api, stream, k, tokens)
                            if self.cells_regex and not re.search(self.cells_regex, f"{case.key}/c{conc}"):
                                continue
                            out.append((case, conc))
        return out


FULL = Plan("full", ("chat", "completions"), (False, True), (0, 5, 20), (100, 1000), (1, 16, 64),
            duration=2.0, max_seconds=8.0, many_streams=256, many_tokens=(100, 1000), target_repeats=3, core=True)
QUICK = Plan("quick", ("chat", "completions"), (False, True), (0, 5, 20), (100,), (1, 16, 64),
             duration=0.3, max_seconds=1.5, many_streams=256, many_tokens=(100,), target_repeats=1, core=True)
SMOKE = Plan("smoke", ("chat", "completions"), (False, True), (5,), (12,), (2,),
             duration=0.05, max_seconds=1.0, many_streams=4, many_tokens=(12,), target_repeats=1, core=False)

# The cells the targets are judged on: (api, stream, k, tokens, concurrency).
TARGET_NONSTREAM = (False, 5, 100, 1)
TARGET_STREAM = (True, 5, 100, 16)


# --------------------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cpu_sets() -> tuple[set[int] | None, set[int] | None]:
    """(cores for the process under test, cores for the upstream and load generator)."""
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    port: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass
class Stack:
    upstream: Proc
    relay: Proc
    gateway: Proc
    loadgen: Proc
    procs: list[Proc] = field(default_factory=list)

    def url(self, target: str) -> str:
        port = {"direct": self.upstream.port, "relay": self.relay.port, "gateway": self.gateway.port}[target]
        return f"http://127.0.0.1:{port}"


def _spawn(name: str, argv: list[str], cpus: set[int] | None, log: Path, stdin: bool = False,
           source: Path | None = None) -> Proc:
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    path = [str(source)] if source else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # `python -m` puts the working directory first on sys.path: run from the source tree under test.
    popen = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=log.open("wb"), preexec_fn=pin, cwd=source or ROOT, env=env)
    return Proc(name, popen)


def _await_ready(proc: Proc, timeout: float = 60.0) -> None:
    assert proc.popen.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.popen.stdout.readline().decode().strip()
        if not line and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode} before it was ready")
        if line.startswith("READY"):
            parts = line.split()
            proc.port = int(parts[1]) if len(parts) > 1 else None
            return
    raise RuntimeError(f"{proc.name} not ready within {timeout:.0f}s")


def _await_http(url: str, proc: Proc, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}; see its log")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{proc.name} did not answer {url} within {timeout:.0f}s")


def _compiled_twins(tree: Path) -> list[str]:
    return sorted(path.name for path in (tree / "gateway" / "logprobs").glob("_fastpath*.so"))


def _check_source_tree(source: Path) -> None:
    """A before/after tree must run the same twin as this one: a checkout without the built extension
    silently runs the pure-Python twin and measures something else (seen: 282 MB instead of 165)."""
    missing = set(_compiled_twins(ROOT)) - set(_compiled_twins(source))
    if missing:
        raise SystemExit(f"--gateway-src {source} lacks the compiled core this tree has "
                         f"({', '.join(sorted(missing))}): it would run the pure-Python twin. "
                         f"Build it there (cd {source} && {sys.executable} setup.py build_ext --inplace) "
                         "or copy the file.")


def _gateway_argv(config: Path, source: Path | None = None) -> list[str]:
    script = Path(sys.executable).with_name("responses-gateway")
    if script.is_file() and source is None:
        return [str(script), "serve", "--config", str(config)]
    return [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]


@contextlib.contextmanager
def start_stack(canned: dict[str, Any], canned_path: Path, out: Path, *, burst: bool, pin: bool,
                store: str = "none", gateway_src: Path | None = None, workers: int = 1) -> Iterator[Stack]:
    """The upstream, relay, gateway and load generator; with `workers` > 1 the relay and the gateway
    each run that many processes (bench.workers)."""
    if gateway_src is not None:
        _check_source_tree(gateway_src)
    out = out.resolve()  # the gateway of another source tree runs there: a relative --out would miss its config
    under_test, environment = _cpu_sets() if pin else (None, None)
    procs: list[Proc] = []
    try:
        up_argv = [sys.executable, "-m", "bench.upstream", "--canned", str(canned_path)]
        up_argv += ["--burst"] if burst else []
        upstream = _spawn("upstream", up_argv, environment, out / "upstream.log")
        procs.append(upstream)
        _await_ready(upstream)
        upstream_url = f"http://127.0.0.1:{upstream.port}"
        more = ["--workers", str(workers)] if workers > 1 else []
        relay = _spawn("relay", [sys.executable, "-m", "bench.relay", "--upstream", upstream_url, *more], under_test,
                       out / "relay.log")
        procs.append(relay)
        _await_ready(relay)
        gw_port = _free_port()
        config_path = out / "gateway.yaml"
        config = gateway_config(upstream_url, canned["model"], canned["tokenizer"], gw_port, store)
        config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        gateway = _spawn("gateway", [*_gateway_argv(config_path, gateway_src), *more], under_test,
                         out / "gateway.log", source=gateway_src)
        gateway.port = gw_port
        procs.append(gateway)
        _await_http(f"http://127.0.0.1:{gw_port}/v1/models", gateway)
        loadgen = _spawn("loadgen", [sys.executable, "-m", "bench.loadgen"], environment, out / "loadgen.log",
                         stdin=True)
        procs.append(loadgen)
        _await_ready(loadgen)
        yield Stack(upstream, relay, gateway, loadgen, procs)
    finally:
        stop(procs)


def stop(procs: list[Proc], timeout: float = 10.0) -> None:
    """Terminate the processes (the last started first), then kill any still up after `timeout`."""
    for proc in reversed(procs):
        if proc.popen.poll() is None:
            proc.popen.terminate()
    for proc in reversed(procs):
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait()


# --------------------------------------------------------------------------------------- driving


def _job(stack: Stack, spec: dict[str, Any]) -> dict[str, Any]:
    stdin, stdout = stack.loadgen.popen.stdin, stack.loadgen.popen.stdout
    assert stdin is not None and stdout is not None
    stdin.write(orjson.dumps(spec) + b"\n")
    stdin.flush()
    line = stdout.readline()
    if not line:
        raise RuntimeError("the load generator died; see loadgen.log")
    return orjson.loads(line)


def measure(stack: Stack, canned: dict[str, Any], case: Case, target: str, concurrency: int, plan: Plan,
            front_door: str = "responses") -> dict[str, Any]:
    """Drive one target with one cell's load; add the CPU and memory of the process under test. The gateway
    is asked through `front_door`: /v1/responses, or its own API's door (`api`: chat or completions)."""
    recorded = canned["cases"][case.key]
    if target == "gateway" and front_door == "api":
        path, request = front_door_request(case)
        url, body, kind = stack.url(target) + path, json.dumps(request), case.api
    elif target == "gateway":
        url, body, kind = stack.url(target) + "/v1/responses", recorded["responses_request"], "responses"
    else:
        url, body, kind = stack.url(target) + recorded["path"], recorded["upstream_request"], case.api
    middle = {"relay": stack.relay, "gateway": stack.gateway}.get(target)
    cpu_pids = {"upstream": stack.upstream.pid, "loadgen": stack.loadgen.pid}
    if middle is not None:
        cpu_pids[target] = middle.pid
        procstat.reset_peak(middle.pid)
    probe_before = speed.probe_ms()  # before the counters: its own CPU is not the cell's
    # With workers (bench.workers) the process under test is a parent whose children do the work: their CPU
    # counts as its own, not as other load on the machine.
    before = {name: procstat.tree_cpu_seconds(pid) for name, pid in cpu_pids.items()}
    busy_before = procstat.machine_busy_seconds()
    steal_before = procstat.machine_steal_seconds()
    job_start = time.monotonic()
    result = _job(stack, {"url": url, "body": body, "stream": case.stream, "kind": kind, "tokens": case.tokens,
                          "concurrency": concurrency, "duration": plan.duration, "max_seconds": plan.max_seconds})
    busy = procstat.machine_busy_seconds() - busy_before
    steal = procstat.machine_steal_seconds() - steal_before
    job_wall = time.monotonic() - job_start
    after = {name: procstat.tree_cpu_seconds(pid) for name, pid in cpu_pids.items()}
    used = {name: after[name] - before[name] for name in cpu_pids}
    # How fast the machine ran around this job (bench/speed.py): the slower of the two probes.
    result["probe_ms"] = round(max(probe_before, speed.probe_ms()), 3)
    # Cores kept busy by processes outside the benchmark (other jobs on a shared machine): noise.
    result["other_load_cores"] = round(max(0.0, busy - sum(used.values())) / max(job_wall, 1e-9), 2)
    result["steal_cores"] = round(steal / max(job_wall, 1e-9), 3)  # the host's other tenants (in the above too)
    # Utilisation over the whole job (warm-up included): 1.0 = one core busy all the time.
    result["cpu_busy"] = {name: round(seconds / max(job_wall, 1e-9), 3) for name, seconds in used.items()}
    result["cpu_seconds"] = {name: round(seconds, 4) for name, seconds in used.items()}
    if middle is not None:
        sent_tokens = result["sent"] * case.tokens
        result["cpu_s"] = used[target]
        result["cpu_s_per_1k_tokens"] = 1000 * used[target] / sent_tokens if sent_tokens else None
        result["peak_rss_mb"] = procstat.peak_rss_mb(middle.pid)
        result["rss_mb"] = procstat.rss_mb(middle.pid)
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


RATIO_KEYS = ("p50_ms", "p99_ms", "rps", "tokens_per_s", "ttfe_p50_ms", "ttft_p50_ms")


def ratios(cell: dict[str, Any]) -> None:
    gw = cell["gateway"]
    for base in ("relay", "direct"):
        cell[f"gateway_vs_{base}"] = {key: _ratio(gw.get(key), cell[base].get(key)) for key in RATIO_KEYS}
    cell["gateway_vs_relay"]["cpu_s_per_1k_tokens"] = _ratio(gw.get("cpu_s_per_1k_tokens"),
                                                             cell["relay"].get("cpu_s_per_1k_tokens"))
    cell["gateway_vs_relay"]["peak_rss_mb"] = _ratio(gw.get("peak_rss_mb"), cell["relay"].get("peak_rss_mb"))
    direct = cell["direct"]["p50_ms"]
    relay_added = cell["relay"]["p50_ms"] - direct
    gw_added = gw["p50_ms"] - direct
    cell["added_p50_ms"] = {"relay": relay_added, "gateway": gw_added,
                            "gateway_over_relay": gw_added / relay_added if relay_added > 0 else None}


def run_cell(stack: Stack, canned: dict[str, Any], case: Case, conc: int, plan: Plan) -> dict[str, Any]:
    cell: dict[str, Any] = {"api": case.api, "stream": case.stream, "k": case.k, "tokens": case.tokens,
                            "concurrency": conc}
    for target in TARGETS:
        cell[target] = measure(stack, canned, case, target, conc, plan)
    ratios(cell)
    return cell


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# --------------------------------------------------------------------------------------- output


def _f(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


TABLE_HEAD = ("| api | mode | k | tokens | conc | p50 ms direct / relay / gw | p99 ms direct / relay / gw "
              "| req/s direct / relay / gw | gw tokens/s | TTFE ms direct / relay / gw "
              "| gw p50 ÷ relay, ÷ direct | gw req/s ÷ relay, ÷ direct | added p50 gw ÷ relay "
              "| CPU s/1k tok gw (relay) | gw peak RSS MB | errors |")
TABLE_RULE = "|" + "---|" * 16


def table_row(cell: dict[str, Any]) -> str:
    d, r, g = cell["direct"], cell["relay"], cell["gateway"]
    vr, vd = cell["gateway_vs_relay"], cell["gateway_vs_direct"]

    def three(key: str, digits: int = 2) -> str:
        return " / ".join(_f(x.get(key), digits) for x in (d, r, g))

    errors = d["errors"] + r["errors"] + g["errors"]
    return (f"| {cell['api']} | {'stream' if cell['stream'] else 'full'} | {cell['k']} | {cell['tokens']} "
            f"| {cell['concurrency']} | {three('p50_ms')} | {three('p99_ms')} | {three('rps', 1)} "
            f"| {_f(g['tokens_per_s'], 0)} | {three('ttfe_p50_ms') if cell['stream'] else '-'} "
            f"| {_f(vr['p50_ms'], 2)}, {_f(vd['p50_ms'], 2)} | {_f(vr['rps'], 2)}, {_f(vd['rps'], 2)} "
            f"| {_f(cell['added_p50_ms']['gateway_over_relay'], 2)} "
            f"| {_f(g.get('cpu_s_per_1k_tokens'), 3)} ({_f(r.get('cpu_s_per_1k_tokens'), 3)}) "
            f"| {_f(g.get('peak_rss_mb'), 0)} | {errors} |")


def many_row(entry: dict[str, Any]) -> str:
    g, r, d = entry["gateway"], entry["relay"], entry["direct"]
    errors = g["errors"] + r["errors"] + d["errors"]
    return (f"| {entry['api']} | {entry['k']} | {entry['tokens']} | {entry['concurrency']} "
            f"| {_f(d['rps'], 1)} / {_f(r['rps'], 1)} / {_f(g['rps'], 1)} "
            f"| {_f(g['p50_ms'], 1)} / {_f(g['p99_ms'], 1)} | {_f(entry['gateway_idle_rss_mb'], 0)} "
            f"| {_f(g['peak_rss_mb'], 0)} | {_f(r['peak_rss_mb'], 0)} | {g['errors']} | {errors} |")


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gb = None
    with contextlib.suppress(OSError, ValueError):
        mem_gb = round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024, 1)
    versions = {}
    for name in ("aiohttp", "orjson", "uvloop", "pydantic", "tokenizers"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[name] = version(name)
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        if subprocess.run(["git", "status", "--porcelain", "--", "gateway", "schemas"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip():
            commit += " + uncommitted changes"
    return {"cpu": model, "cores": os.cpu_count(), "memory_gb": mem_gb, "kernel": platform.release(),
            "python": platform.python_version(), "packages": versions, "commit": commit}


def targets(cells: list[dict[str, Any]], many: list[dict[str, Any]], core: dict[str, Any] | None,
            repeats: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for api in sorted({c["api"] for c in cells}):
        runs = repeats.get(f"nonstream/{api}", [])
        values = [c["added_p50_ms"]["gateway_over_relay"] for c in runs
                  if c["added_p50_ms"]["gateway_over_relay"] is not None]
        if values:
            value = _median(values)
            gw = _median([c["added_p50_ms"]["gateway"] for c in runs])
            rl = _median([c["added_p50_ms"]["relay"] for c in runs])
            out.append({"target": f"non-streaming {api}, 100 tokens, k=5, c=1: gateway's added p50 <= 2x relay's",
                        "value": value, "limit": 2.0, "met": value <= 2.0, "runs": len(values),
                        "detail": f"added p50 gateway {gw:.3f} ms vs relay {rl:.3f} ms (median of {len(values)})"})
        runs = repeats.get(f"stream/{api}", [])
        values = [c["gateway_vs_relay"]["rps"] for c in runs if c["gateway_vs_relay"]["rps"] is not None]
        if values:
            value = _median(values)
            out.append({"target": f"streaming {api}, 100 tokens, k=5, c=16: gateway streams/s >= 50% of relay's",
                        "value": value, "limit": 0.5, "met": value >= 0.5, "runs": len(values),
                        "detail": f"gateway {_median([c['gateway']['rps'] for c in runs]):.1f}/s vs relay "
                                  f"{_median([c['relay']['rps'] for c in runs]):.1f}/s (median of {len(values)})"})
    if core:
        by_direction = {r["direction"]: r["tokens_per_s"] for r in core["rows"] if r["k"] == 5}
        # The gateway sends JSON: the row that writes it is the target's; the dict row is shown beside it.
        dicts = by_direction.get("chat -> responses (token ids)")
        value = by_direction.get("chat -> responses JSON (token ids)", dicts)
        if value is not None:
            out.append({"target": "pure core, chat -> responses, exact bytes from ids, k=5: >= 200,000 tokens/s",
                        "value": value, "limit": 200_000, "met": value >= 200_000, "runs": 1,
                        "detail": f"to Responses JSON; to Python dicts {dicts:,} tokens/s" if dicts else ""})
    for entry in many:
        g = entry["gateway"]
        met = g["peak_rss_mb"] < 150 and g["errors"] == 0
        out.append({"target": f"{entry['concurrency']} concurrent streams ({entry['api']}, k={entry['k']}, "
                              f"{entry['tokens']} tokens): gateway RSS < 150 MB, no error",
                    "value": g["peak_rss_mb"], "limit": 150, "met": met, "runs": 1,
                    "detail": f"peak RSS {g['peak_rss_mb']:.0f} MB (idle before: "
                              f"{entry['gateway_idle_rss_mb']:.0f} MB), {g['errors']} errors, {g['sent']} streams"})
    return out


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"Command: `{report['command']}` ({report['plan']} plan), {report['started']}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, Linux {m['kernel']}, Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items()) + f"; gateway at {m['commit']}",
        "",
        f"Tokenizer {report['vocab']!r}; uvloop {'on' if report['uvloop'] else 'off'}; upstream writes "
        f"{report['upstream_writes']}; pinning: {report['pinning']}",
        "",
        f"Other processes on the machine kept {report['other_load_cores']['mean']:.2f} cores busy on average "
        f"(at most {report['other_load_cores']['max']:.2f} during a cell): the more, the noisier the figures. "
        f"Of that, the host took {report.get('steal_cores', {}).get('mean', 0.0):.3f} cores away from this "
        f"machine (steal time; at most {report.get('steal_cores', {}).get('max', 0.0):.3f}); a host busy in ways "
        "steal does not show (shared caches, memory bandwidth) only shows as slower figures all round.",
        "",
        speed.sentence(report["probe_ms"]),
        "",
        "## Targets",
        "",
        "| target | value | met |",
        "|---|---|---|",
    ]
    for t in report["targets"]:
        value = t["value"]
        shown = f"{value:,.0f}" if value >= 1000 else f"{value:.2f}"
        lines.append(f"| {t['target']} | {shown} {t['detail'] and '— ' + t['detail']} | "
                     f"{'yes' if t['met'] else '**no**'} |")
    lines += ["", "## Matrix", "", TABLE_HEAD, TABLE_RULE]
    lines += [table_row(cell) for cell in report["cells"]]
    if report["many_streams"]:
        lines += ["", "## Many concurrent streams", "",
                  "| api | k | tokens | streams | streams/s direct / relay / gw | gw p50 / p99 ms "
                  "| gw idle RSS MB | gw peak RSS MB | relay peak RSS MB | gw errors | all errors |",
                  "|" + "---|" * 11]
        lines += [many_row(entry) for entry in report["many_streams"]]
    if report.get("core"):
        lines += ["", f"## Pure core (tokens/s, one core, {report['core']['tokens_per_call']} tokens per call)", "",
                  "| direction | k=0 | k=5 | k=20 |", "|---|---|---|---|"]
        by_dir: dict[str, dict[int, int]] = {}
        for row in report["core"]["rows"]:
            by_dir.setdefault(row["direction"], {})[row["k"]] = row["tokens_per_s"]
        for direction, values in by_dir.items():
            lines.append(f"| {direction} | " + " | ".join(_f(values.get(k), 0) for k in (0, 5, 20)) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------- main


def run(plan: Plan, out: Path, *, burst: bool = False, pin: bool = True, demo_vocab: bool = False,
        command: str = "", progress: bool = True, store: str = "none", gateway_src: Path | None = None,
        reuse_canned: Path | None = None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    t_start = time.monotonic()

    def say(text: str) -> None:
        if progress:
            print(f"[{time.monotonic() - t_start:6.1f}s] {text}", flush=True)

    cells_plan = plan.cells()
    wanted = {case for case, _ in cells_plan} | {Case(plan.apis[0], True, 5, n) for n in plan.many_tokens}
    if plan.core:
        from bench import core as core_bench

        wanted |= {Case(api, stream, k, core_bench.TOKENS) for api in ("chat", "completions")
                   for stream in (False, True) for k in core_bench.KS}
    cases = sorted(wanted, key=lambda c: c.key)
    canned = None
    if reuse_canned is not None and reuse_canned.is_file():
        canned = orjson.loads(reuse_canned.read_bytes())
        if {case.key for case in cases} <= set(canned["cases"]):
            canned_path = reuse_canned
            say(f"reusing canned upstream answers from {reuse_canned}")
        else:
            canned = None
    if canned is None:
        canned_path = out / "canned.json"
        say(f"recording {len(cases)} canned upstream answers with the simulator")
        canned = record_to_file(cases, canned_path, use_qwen2=False if demo_vocab else None)
    core = None
    if plan.core:
        say("pure-core micro-benchmark")
        core_rows = core_bench.run_isolated(canned_path, quick=plan.name != "full")
        core = {"tokens_per_call": core_bench.TOKENS, "rows": core_rows}
    cells: list[dict[str, Any]] = []
    many: list[dict[str, Any]] = []
    repeats: dict[str, list[dict[str, Any]]] = {}
    say("starting upstream, relay, gateway and load generator")
    with start_stack(canned, canned_path, out, burst=burst, pin=pin, store=store, gateway_src=gateway_src) as stack:
        # Memory first, on a fresh gateway: later cells leave the heap larger than any stream needs.
        for tokens in plan.many_tokens:
            case = Case(plan.apis[0], True, 5, tokens)
            idle = procstat.rss_mb(stack.gateway.pid)
            entry: dict[str, Any] = {"api": case.api, "k": case.k, "tokens": tokens, "concurrency": plan.many_streams,
                                     "gateway_idle_rss_mb": idle}
            for target in TARGETS:
                entry[target] = measure(stack, canned, case, target, plan.many_streams,
                                        Plan(**{**plan.__dict__, "duration": max(plan.duration, 1.0)}))
            many.append(entry)
            say(f"{plan.many_streams} streams of {tokens} tokens: gateway peak RSS "
                f"{entry['gateway']['peak_rss_mb']:.0f} MB, errors {entry['gateway']['errors']}")
        for index, (case, conc) in enumerate(cells_plan, 1):
            cell = run_cell(stack, canned, case, conc, plan)
            cells.append(cell)
            shape = (case.stream, case.k, case.tokens, conc)
            if shape in (TARGET_NONSTREAM, TARGET_STREAM):
                repeats.setdefault(f"{'stream' if case.stream else 'nonstream'}/{case.api}", []).append(cell)
            g = cell["gateway"]
            say(f"{index}/{len(cells_plan)} {case.key} c={conc}: gw p50 {g['p50_ms']:.2f} ms, {g['rps']:.1f} req/s "
                f"(relay {cell['relay']['rps']:.1f}, direct {cell['direct']['rps']:.1f}); "
                f"errors {g['errors'] + cell['relay']['errors'] + cell['direct']['errors']}")
        for _ in range(plan.target_repeats - 1):
            for case, conc in cells_plan:
                shape = (case.stream, case.k, case.tokens, conc)
                if shape in (TARGET_NONSTREAM, TARGET_STREAM):
                    cell = run_cell(stack, canned, case, conc, plan)
                    repeats[f"{'stream' if case.stream else 'nonstream'}/{case.api}"].append(cell)
                    say(f"repeat {case.key} c={conc}")
    report = {
        "command": command, "plan": plan.name, "started": started, "machine": machine(),
        "vocab": canned["vocab"], "uvloop": uvloop_available(), "upstream_writes": "burst" if burst else "frames",
        "store": store, "gateway_src": str(gateway_src) if gateway_src else None,
        "pinning": "relay and gateway on one core, upstream and load generator on the rest" if pin and _cpu_sets()[0]
        else "none", "cells": cells, "many_streams": many, "core": core, "repeats": repeats,
    }
    report["targets"] = targets(cells, many, core, repeats)
    loads = [c[t]["other_load_cores"] for c in cells for t in TARGETS]
    report["other_load_cores"] = {"mean": round(sum(loads) / len(loads), 2) if loads else 0.0,
                                  "max": max(loads, default=0.0)}
    steals = [c[t].get("steal_cores", 0.0) for c in cells for t in TARGETS]
    report["steal_cores"] = {"mean": round(sum(steals) / len(steals), 3) if steals else 0.0,
                             "max": max(steals, default=0.0)}
    report["probe_ms"] = speed.spread([c[t]["probe_ms"] for c in cells for t in TARGETS])
    report["seconds"] = round(time.monotonic() - t_start, 1)
    (out / "results.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    (out / "results.md").write_text(markdown(report))
    return report


def _wait_quiet(limit: float, threshold: float = 0.25) -> None:
    """Wait (at most `limit` seconds) until other processes keep fewer than `threshold` cores busy."""
    deadline = time.monotonic() + limit
    while True:
        before = procstat.machine_busy_seconds()
        time.sleep(2.0)
        busy = (procstat.machine_busy_seconds() - before) / 2.0
        if busy < threshold or time.monotonic() > deadline:
            print(f"other processes keep {busy:.2f} cores busy; starting", flush=True)
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="gateway vs relay vs upstream, one run")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a smaller matrix, short windows (about 3 minutes)")
    mode.add_argument("--smoke", action="store_true", help="a tiny run that checks the machinery (seconds)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="where results.{json,md} go")
    parser.add_argument("--burst", action="store_true", help="the upstream writes each stream in one go")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--demo-vocab", action="store_true", help="the demo tokenizer even if Qwen2 is present")
    parser.add_argument("--no-core", action="store_true", help="skip the pure-core micro-benchmark")
    parser.add_argument("--canned", type=Path, help="reuse this canned.json (from an earlier run) if it has every case")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for other processes to leave the cores (shared machines)")
    parser.add_argument("--cells", help="only cells whose key (api/mode/kK/nN/cC) matches this regular expression")
    parser.add_argument("--store", default="sqlite", choices=["none", "memory", "sqlite"],
                        help="the gateway's response store (default sqlite, as a user gets it; `python -m "
                             "bench.store` puts it next to store: none)")
    parser.add_argument("--gateway-src", type=Path,
                        help="run the gateway from this source tree (holding gateway/ and schemas/): A/B runs")
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.no_core:
        plan = Plan(**{**plan.__dict__, "core": False})
    if args.cells:
        plan = Plan(**{**plan.__dict__, "cells_regex": args.cells})
    if args.wait_quiet > 0:
        _wait_quiet(args.wait_quiet)
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    report = run(plan, args.out, burst=args.burst, pin=not args.no_pin, demo_vocab=args.demo_vocab,
                 command=command.strip(), store=args.store, gateway_src=args.gateway_src,
                 reuse_canned=args.canned)
    print()
    print(markdown(report))
    print(f"written: {args.out / 'results.json'}, {args.out / 'results.md'} ({report['seconds']}s)")
    return 0 if all(not c[t]["errors"] for c in report["cells"] for t in TARGETS) else 1
