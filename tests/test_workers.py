"""`responses-gateway serve --workers N`: real processes on one port, against a loopback simulator.

Which worker answered is read from the access log (every line names its worker's pid). Connections
are opened fresh per request (SO_REUSEPORT balances connections, not requests), so a handful of
requests reaches both workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.vllm import create_app as create_simulator
from gateway.workers import available_cpus, resolve_workers

EXE = str(Path(sys.executable).parent / "responses-gateway")
BODY = {"model": "demo-model", "input": "hi", "max_output_tokens": 8, "ignore_eos": True}


def _config(path: Path, upstream_url: str, **extra: Any) -> Path:
    data = {"upstreams": {"sim": {"urls": [upstream_url], "health_interval": 0}},
            "models": {"demo-model": {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
            "store": {"backend": "sqlite", "path": str(path.parent / "responses.sqlite3")}, **extra}
    path.write_text(json.dumps(data))
    return path


class Gateway:
    """A `serve` subprocess; its stderr lines (JSON log records) collected as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.records: list[dict[str, Any]] = []
        self.stdout: list[str] = []
        self._readers = [asyncio.create_task(self._read(process.stderr, self._record)),
                         asyncio.create_task(self._read(process.stdout, self.stdout.append))]

    @classmethod
    async def start(cls, config: Path, *args: str) -> Gateway:
        process = await asyncio.create_subprocess_exec(EXE, "serve", "--config", str(config), "--port", "0", *args,
                                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return cls(process)

    def _record(self, line: str) -> None:
        try:
            self.records.append(json.loads(line))
        except ValueError:
            self.records.append({"text": line})

    async def _read(self, stream: asyncio.StreamReader, keep: Any) -> None:
        while line := await stream.readline():
            keep(line.decode())

    async def wait_for(self, predicate: Any, what: str, timeout: float = 60) -> Any:
        """The first record (or stdout line) `predicate` holds for, waiting for it to come."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for item in [*self.records, *self.stdout]:
                if predicate(item):
                    return item
            if all(reader.done() for reader in self._readers):
                raise AssertionError(f"{what} never came (the gateway has exited); stderr: {self.records}")
            if loop.time() > deadline:
                raise AssertionError(f"{what} never came within {timeout} s; stderr: {self.records}")
            await asyncio.sleep(0.05)

    async def base_url(self) -> str:
        line = await self.wait_for(lambda item: isinstance(item, str) and "responses-gateway on http://" in item,
                                   "the listening line")
        return line.split()[2]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("event") == name]

    async def ready_workers(self, count: int) -> list[int]:
        """Wait until `count` workers have listened (restarts included); their pids."""
        await self.wait_for(lambda r: isinstance(r, dict) and len(self.events("worker_listening")) >= count,
                            f"{count} workers listening")
        return [r["pid"] for r in self.events("worker_listening")]

    async def worker_of(self, request_id: str) -> int:
        line = await self.wait_for(lambda r: isinstance(r, dict) and r.get("request_id") == request_id,
                                   f"the access line of {request_id}")
        return line["pid"]

    async def close(self) -> None:
        """Stop it if a test did not: SIGKILL to the supervisor (its workers follow it, PR_SET_PDEATHSIG)."""
        if self.process.returncode is None:
            self.process.kill()
            await asyncio.wait_for(self.process.wait(), 60)
        for reader in self._readers:
            reader.cancel()


def fresh_session() -> aiohttp.ClientSession:
    """A new connection per request: each is balanced over the workers on its own."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
    async with session.post(url, json=body, headers={"X-Request-Id": request_id}) as reply:
        assert reply.status == 200, await reply.text()
        return await reply.json()


def _total(exposition: str, prefix: str, having: str = "") -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines()
               if line.startswith(prefix) and having in line)


async def test_two_workers_share_the_port_the_metrics_and_the_sqlite_store(aiohttp_server, tmp_path):
    sim = await aiohttp_server(create_simulator(build_demo_vocab(), "demo-model"))
    config = _config(tmp_path / "config.yaml", str(sim.make_url("")).rstrip("/"))
    gateway = await Gateway.start(config, "--workers", "2")
    try:
        base = await gateway.base_url()
        assert "2 workers" in gateway.stdout[-1]
        pids = await gateway.ready_workers(2)
        async with fresh_session() as session:
            answered_by: dict[str, int] = {}
            sent = 0
            while len(set(answered_by.values())) < 2:
                assert sent < 60, f"60 connections all reached one worker: {answered_by}"
                request_id = f"spread-{sent}"
                await _post(session, f"{base}/v1/responses", {**BODY, "store": False}, request_id)
                answered_by[request_id] = await gateway.worker_of(request_id)
                sent += 1
            assert set(answered_by.values()) == set(pids)

            # One scrape (whichever worker answers it) counts every worker's requests.
            async with session.get(f"{base}/metrics") as reply:
                exposition = await reply.text()
            assert _total(exposition, 'gateway_requests_total{model="demo-model",route="responses"') == sent
            assert _total(exposition, "gateway_request_duration_seconds_count{") == sent
            assert _total(exposition, "gateway_tokens_total{", 'direction="out"') == 8 * sent

            # A stored response made on one worker continues on the other (SQLite, WAL).
            first = await _post(session, f"{base}/v1/responses", BODY, "stored-0")
            maker = await gateway.worker_of("stored-0")
            for attempt in range(60):
                request_id = f"follow-up-{attempt}"
                follow = {**BODY, "previous_response_id": first["id"], "input": "and then?"}
                second = await _post(session, f"{base}/v1/responses", follow, request_id)
                assert second["previous_response_id"] == first["id"]
                if await gateway.worker_of(request_id) != maker:
                    break
            else:
                raise AssertionError("60 follow-ups all reached the worker that made the response")
            # The 200s above mean the id was found: an unknown one is refused.
            unknown = {**BODY, "previous_response_id": "resp_" + "0" * 48}
            async with session.post(f"{base}/v1/responses", json=unknown) as reply:
                assert reply.status == 400 and "not found" in (await reply.json())["error"]["message"]
        gateway.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(gateway.process.wait(), 60) == 0
        stopped = {r["pid"] for r in gateway.events("worker_stopped")}
        assert stopped == set(pids)
    finally:
        await gateway.close()


async def test_sigterm_drains_every_worker_and_an_in_flight_stream_finishes(aiohttp_server, tmp_path):
    sim = await aiohttp_server(create_simulator(build_demo_vocab(), "demo-model", step_delay_ms=30))
    config = _config(tmp_path / "config.yaml", str(sim.make_url("")).rstrip("/"))
    gateway = await Gateway.start(config, "--workers", "2")
    try:
        base = await gateway.base_url()
        await gateway.ready_workers(2)
        async with fresh_session() as session:
            body = {**BODY, "max_output_tokens": 60, "stream": True}
            async with session.post(f"{base}/v1/responses", json=body) as stream:
                assert stream.status == 200
                await stream.content.readline()  # it has begun
                gateway.process.send_signal(signal.SIGTERM)
                rest = (await stream.read()).decode()
        assert '"type":"response.incomplete"' in rest and '"output_tokens":60' in rest  # ran to max_output_tokens
        assert await asyncio.wait_for(gateway.process.wait(), 60) == 0
        assert sorted(r["worker"] for r in gateway.events("draining")) == [0, 1]  # each worker drained, named
        assert [r["in_flight"] for r in gateway.events("draining")].count(1) == 1
    finally:
        await gateway.close()


async def test_a_killed_worker_is_restarted_logged_and_serves(aiohttp_server, tmp_path):
    sim = await aiohttp_server(create_simulator(build_demo_vocab(), "demo-model"))
    config = _config(tmp_path / "config.yaml", str(sim.make_url("")).rstrip("/"), workers=2)
    gateway = await Gateway.start(config)
    try:
        base = await gateway.base_url()
        first, second = await gateway.ready_workers(2)
        os.kill(first, signal.SIGKILL)
        exited = await gateway.wait_for(lambda r: isinstance(r, dict) and r.get("event") == "worker_exited",
                                        "the worker_exited line")
        # If another worker is the one that exited, the records say why (a string: pytest shortens a repr).
        assert exited["pid"] == first and exited["signal"] == "SIGKILL" and exited["was_listening"] is True, \
            f"killed {first}, the other {second}; records: {json.dumps(gateway.records)}"
        pids = await gateway.ready_workers(3)
        replacement = pids[2]
        assert replacement not in (first, second)
        async with fresh_session() as session:
            for attempt in range(60):
                request_id = f"after-restart-{attempt}"
                await _post(session, f"{base}/v1/responses", {**BODY, "store": False}, request_id)
                if await gateway.worker_of(request_id) == replacement:
                    break
            else:
                raise AssertionError("the restarted worker never answered")
        gateway.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(gateway.process.wait(), 60) == 0
    finally:
        await gateway.close()


async def test_workers_that_keep_dying_at_start_stop_the_supervisor_with_exit_1(aiohttp_server, tmp_path):
    (tmp_path / "a-file").write_text("")  # the store's folder is a file: every worker fails to open it
    config = _config(tmp_path / "config.yaml", "http://127.0.0.1:9",
                     store={"backend": "sqlite", "path": str(tmp_path / "a-file" / "responses.sqlite3")})
    gateway = await Gateway.start(config, "--workers", "2")
    try:
        assert await asyncio.wait_for(gateway.process.wait(), 120) == 1
        await asyncio.gather(*gateway._readers)
        failed = gateway.events("worker_failed")
        assert failed and "store.path: cannot use SQLite file" in failed[0]["error"]
        gave_up = gateway.events("workers_cannot_start")
        assert len(gave_up) == 1 and gave_up[0]["failures_in_a_row"] == 5
        assert all(not r["was_listening"] for r in gateway.events("worker_exited"))
    finally:
        await gateway.close()


@pytest.mark.parametrize(("extra", "args", "key"), [({"workers": 2}, (), "workers"),
                                                     ({}, ("--workers", "2"), "--workers")])
def test_the_memory_store_refuses_more_than_one_worker_naming_the_key(tmp_path, extra, args, key):
    config = _config(tmp_path / "config.yaml", "http://127.0.0.1:9", store={"backend": "memory"}, **extra)
    result = subprocess.run([EXE, "serve", "--config", str(config), "--port", "0", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"config error: {key}: 2 worker processes cannot share store.backend: memory")


def test_workers_auto_is_the_cpus_this_process_may_use():
    config = parse_config({"upstreams": {"u": {"urls": ["http://x"]}}, "models": {}, "workers": "auto"}, Path("."))
    assert resolve_workers(config) == available_cpus() <= len(os.sched_getaffinity(0))
    assert resolve_workers(config, "3") == 3


def test_a_cgroup_cpu_quota_bounds_auto(tmp_path):
    """cgroup v2 (a container with `limits.cpu: 1500m` has cpu.max "150000 100000") and v1."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/kubepods/pod1/gateway\n")
    leaf = tmp_path / "v2" / "kubepods" / "pod1" / "gateway"
    leaf.mkdir(parents=True)
    (leaf / "cpu.max").write_text("max 100000\n")
    (leaf.parent / "cpu.max").write_text("150000 100000\n")
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(tmp_path / "v2", proc) == min(affinity, 2)
    (leaf.parent / "cpu.max").write_text("max 100000\n")
    assert available_cpus(tmp_path / "v2", proc) == affinity

    (proc / "cgroup").write_text("4:cpu,cpuacct:/docker/abc\n1:memory:/docker/abc\n")
    v1 = tmp_path / "v1" / "cpu,cpuacct" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(tmp_path / "v1", proc) == 1


async def test_sighup_reaches_every_worker_and_a_restarted_worker_reloads_before_it_serves(aiohttp_server, tmp_path):
    vocab = build_demo_vocab()
    old = await aiohttp_server(create_simulator(vocab, "demo-model", default_reply="old upstream"))
    new = await aiohttp_server(create_simulator(vocab, "demo-model", default_reply="new upstream"))
    config = _config(tmp_path / "config.yaml", str(old.make_url("")).rstrip("/"))
    gateway = await Gateway.start(config, "--workers", "2")
    try:
        base = await gateway.base_url()
        first, _ = await gateway.ready_workers(2)
        _config(config, str(new.make_url("")).rstrip("/"))
        gateway.process.send_signal(signal.SIGHUP)
        await gateway.wait_for(lambda r: isinstance(r, dict) and len(gateway.events("reloaded")) >= 2,
                               "a reloaded line from each worker")
        os.kill(first, signal.SIGKILL)  # its replacement is forked from the supervisor's original config
        replacement = (await gateway.ready_workers(3))[2]
        assert len(gateway.events("reloaded")) == 3  # it reloaded before it listened
        assert [r["pid"] for r in gateway.events("reloaded")][2] == replacement  # each line names its worker
        assert {r["worker"] for r in gateway.events("reloaded")} == {0, 1}
        async with fresh_session() as session:
            seen: set[int] = set()
            for attempt in range(60):
                request_id = f"after-reload-{attempt}"
                answer = await _post(session, f"{base}/v1/responses", {**BODY, "store": False}, request_id)
                assert answer["output"][0]["content"][0]["text"].startswith("new upstr")
                seen.add(await gateway.worker_of(request_id))
                if replacement in seen and len(seen) == 2:
                    break
            else:
                raise AssertionError(f"both workers never answered: {seen}")
        gateway.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(gateway.process.wait(), 60) == 0
    finally:
        await gateway.close()
