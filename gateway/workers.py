"""`serve --workers N`: a supervisor process and N forked worker processes, one port.

The supervisor loads the config, every tokenizer table and template, and builds the app before it
forks, so the tables are shared copy-on-write (`gc.freeze` keeps the collector from writing to
them). It then binds the port: with SO_REUSEPORT (Linux, the BSDs) one listening socket per worker,
which the kernel balances connections over; without it one socket all workers accept on. A worker
runs the ordinary single-process server (gateway.server) on its socket, with its own event loop,
upstream connection pool, store connection (opened at its start-up, after the fork), health checks
and replica ejection state.

Signals go to the supervisor: SIGTERM/SIGINT are passed to every worker, each drains as one process
does (in-flight requests finish within shutdown.grace_seconds), and the supervisor exits once all
have. SIGHUP is passed to every worker, each reloads; a worker started later (a restart) reloads
before it accepts. A worker that dies is logged and started again on the same socket (connections
queued on it wait for the new one); when workers keep dying before they listen (a store that
cannot open, say), the supervisor stops the rest and exits 1 rather than loop.

What the workers share is what lives outside a process or was made before the fork: the listening
port, the response store (SQLite WAL on one host, Redis; the memory store is refused), the metrics
files (gateway.metrics: a scrape of any worker reports the sum), and the compaction key made at
start when compaction.key_env is unset. What each keeps to itself: background runs
(gateway.background: polling and replay work from any worker, through the store; following live
events and cancel only on the worker running it), replica health and ejection, and /readyz.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.config import Config, ConfigError

log = logging.getLogger("responses_gateway")

#: Workers in a row that die before they listen: then the supervisor gives up (exit 1).
START_FAILURES_LIMIT = 5
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup"), proc_self: Path = Path("/proc/self")) -> int:
    """The CPUs this process may use: its affinity mask, bounded by a cgroup CPU quota (a container's
    `resources.limits.cpu`, cgroup v2 `cpu.max` or v1 `cpu.cfs_quota_us`), rounded up; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root, proc_self)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _cgroup_quota(root: Path, proc_self: Path) -> float | None:
    """The tightest CPU quota (in CPUs) over this process's cgroup and its ancestors, None without one."""
    quotas: list[float] = []
    try:
        lines = (proc_self / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2: one unified tree
            node = root / path.lstrip("/")
            while True:
                quotas += _v2_quota(node)
                if node == root or root not in node.parents:
                    break
                node = node.parent
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's own tree
            for base in (root / "cpu,cpuacct", root / "cpu"):
                for node in (base / path.lstrip("/"), base):
                    quotas += _v1_quota(node)
    if not lines:
        quotas += _v2_quota(root)
    return min(quotas) if quotas else None


def _v2_quota(node: Path) -> list[float]:
    try:
        quota, period = (node / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return []
    return [] if quota == "max" else [int(quota) / int(period)]


def _v1_quota(node: Path) -> list[float]:
    try:
        quota = int((node / "cpu.cfs_quota_us").read_text())
        period = int((node / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return []
    return [quota / period] if quota > 0 and period > 0 else []


def resolve_workers(config: Config, override: str | None = None) -> int:
    """How many worker processes: `--workers` (a number or auto) over the config's `workers`.
    ConfigError when the configuration cannot be served by that many (the memory store)."""
    key = "--workers" if override is not None else "workers"
    value: int | str = config.workers if override is None else override
    if value != "auto":
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"{key}: {value!r} is neither a number of processes nor auto") from None
        if value < 1:
            raise ConfigError(f"{key}: {value} worker processes; at least 1")
    count = available_cpus() if value == "auto" else int(value)
    if count > 1 and config.store.backend == "memory":
        raise ConfigError(f"{key}: {count} worker processes cannot share store.backend: memory (each would keep "
                          "its own responses, so a previous_response_id made on one would be unknown to the "
                          "next); use store.backend: sqlite or redis, or workers: 1")
    return count


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` sockets listening on host:port with SO_REUSEPORT where the OS has it, else one socket.
    Port 0 picks a free port (the first socket's; the others join it). Raises server.ListenError."""
    from gateway.server import ListenError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    reuse_port = hasattr(socket, "SO_REUSEPORT")
    sockets: list[socket.socket] = []
    try:
        for _ in range(count if reuse_port else 1):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            address = sock.getsockname()  # port 0: the rest bind the port the first got
            sock.listen(socket.SOMAXCONN)
            sock.set_inheritable(True)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.EADDRINUSE:
            reason += " (another process listens there: stop it, or pick another port with --port)"
        raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
    return sockets


@dataclass
class _Worker:
    index: int
    pid: int
    ready_fd: int  # the worker writes one byte here once it accepts; EOF when it dies
    started: float
    generation: int  # the supervisor's reload count when it was forked
    ready: bool = False


def log_event(event: str, **fields: object) -> None:
    log.info(json.dumps({"event": event, **fields}))


class Supervisor:
    """Forks, watches and restarts the workers; passes signals on. `run_worker(index, sock,
    reload_first, notify_ready)` is what a forked worker runs; its return value is the exit code."""

    def __init__(self, count: int, sockets: list[socket.socket], grace_seconds: float,
                 run_worker: Callable[[int, socket.socket, bool, Callable[[], None]], int],
                 metrics_dir: str | None = None) -> None:
        self.count = count
        self.sockets = sockets
        self.grace_seconds = grace_seconds
        self.run_worker = run_worker
        self.metrics_dir = metrics_dir
        self.workers: dict[int, _Worker] = {}  # by index
        self.generation = 0  # SIGHUPs passed on
        self.pending: list[int] = []  # signals received, handled by the loop
        self.restarts: dict[int, float] = {}  # index -> when to start it again
        self.start_failures = 0  # workers in a row that died before they listened
        self.stopping: float | None = None  # the deadline to SIGKILL stragglers once stopping
        self.exit_code = 0
        self.supervisor_pid = os.getpid()

    # --- the supervisor loop ----------------------------------------------------------------------

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self._wake = (wake_r, wake_w)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        old_handlers = {signum: signal.signal(signum, self._on_signal) for signum in _SIGNALS}
        try:
            for index in range(self.count):
                self._spawn(index)
            while self.workers or (self.stopping is None and self.restarts):
                self._step(wake_r)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in old_handlers.items():
                signal.signal(signum, handler)
            for fd in (wake_r, wake_w):
                os.close(fd)
            for sock in self.sockets:
                sock.close()
            if self.metrics_dir is not None:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return self.exit_code

    def _on_signal(self, signum: int, frame: object) -> None:
        self.pending.append(signum)

    def _step(self, wake_r: int) -> None:
        now = time.monotonic()
        deadlines = [*self.restarts.values(), *([self.stopping] if self.stopping is not None else [])]
        timeout = max(0.0, min(deadlines) - now) if deadlines else 1.0
        fds = [wake_r, *(worker.ready_fd for worker in self.workers.values() if not worker.ready)]
        try:
            readable, _, _ = select.select(fds, [], [], min(timeout, 1.0))
        except InterruptedError:
            readable = []
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        for worker in list(self.workers.values()):
            if not worker.ready and worker.ready_fd in readable:
                self._on_ready(worker)
        signals, self.pending = self.pending, []
        for signum in signals:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.stop(f"{signal.Signals(signum).name} received")
            elif signum == signal.SIGHUP and self.stopping is None:
                self.generation += 1
                for worker in self.workers.values():
                    if worker.ready:  # one still starting is told once it listens (_on_ready)
                        self._signal(worker, signal.SIGHUP)
        self._reap()
        now = time.monotonic()
        if self.stopping is None:
            for index, when in list(self.restarts.items()):
                if when <= now:
                    del self.restarts[index]
                    self._spawn(index)
        elif now >= self.stopping:
            for worker in self.workers.values():
                log_event("worker_killed", worker=worker.index, pid=worker.pid,
                          reason="still running after the drain deadline")
                self._signal(worker, signal.SIGKILL)
            self.stopping = now + 5

    def stop(self, reason: str, exit_code: int = 0) -> None:
        """Drain every worker (SIGTERM), then exit; the supervisor stops accepting at once."""
        self.exit_code = max(self.exit_code, exit_code)
        if self.stopping is not None:
            return
        log_event("stopping_workers", reason=reason, workers=len(self.workers))
        self.restarts.clear()
        self.stopping = time.monotonic() + self.grace_seconds + 10
        for worker in self.workers.values():
            self._signal(worker, signal.SIGTERM)
        for sock in self.sockets:  # the workers hold their own copies while they drain
            sock.close()

    def _signal(self, worker: _Worker, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signum)

    def _on_ready(self, worker: _Worker) -> None:
        try:
            data = os.read(worker.ready_fd, 1)
        except OSError:
            data = b""
        if not data:
            return  # EOF: it died; _reap tells why
        worker.ready = True
        self.start_failures = 0
        log_event("worker_listening", worker=worker.index, pid=worker.pid)
        if worker.generation != self.generation:  # a SIGHUP came while it started
            self._signal(worker, signal.SIGHUP)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = next((w for w in self.workers.values() if w.pid == pid), None)
            if worker is None:
                continue
            del self.workers[worker.index]
            os.close(worker.ready_fd)
            if self.metrics_dir is not None:
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(pid, self.metrics_dir)  # its live gauges go; counters stay
            self._on_exit(worker, status)

    def _on_exit(self, worker: _Worker, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        how = {"exit_code": code} if code >= 0 else {"signal": signal.Signals(-code).name}
        if self.stopping is not None:
            log_event("worker_stopped", worker=worker.index, pid=worker.pid, **how)
            return
        lived = round(time.monotonic() - worker.started, 3)
        if not worker.ready:
            self.start_failures += 1
            if self.start_failures >= START_FAILURES_LIMIT:
                log.error(json.dumps({"event": "workers_cannot_start", "worker": worker.index, "pid": worker.pid,
                                      **how, "failures_in_a_row": self.start_failures,
                                      "detail": "workers keep dying before they listen: see the lines above"}))
                self.stop("workers cannot start", exit_code=1)
                return
        delay = 0.0 if worker.ready else min(5.0, 0.25 * 2 ** (self.start_failures - 1))
        log.error(json.dumps({"event": "worker_exited", "worker": worker.index, "pid": worker.pid, **how,
                              "seconds_alive": lived, "was_listening": worker.ready, "restart_in_seconds": delay}))
        self.restarts[worker.index] = time.monotonic() + delay

    # --- forking ----------------------------------------------------------------------------------

    def _spawn(self, index: int) -> None:
        ready_r, ready_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 70
            try:
                os.close(ready_r)
                code = self._in_worker(index, ready_w)
            except BaseException as exc:  # whatever it was, this process must end here
                with contextlib.suppress(Exception):
                    log.error(json.dumps({"event": "worker_failed", "worker": index, "pid": os.getpid(),
                                          "error": f"{type(exc).__name__}: {exc}"}))
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        os.close(ready_w)
        self.workers[index] = _Worker(index, pid, ready_r, time.monotonic(), self.generation)
        log_event("worker_started", worker=index, pid=pid)

    def _in_worker(self, index: int, ready_w: int) -> int:
        _end_with_parent(self.supervisor_pid)
        signal.set_wakeup_fd(-1)
        for signum in _SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until its loop reloads on it (the supervisor re-sends)
        for fd in (*self._wake, *(w.ready_fd for w in self.workers.values())):
            os.close(fd)
        mine = self.sockets[index % len(self.sockets)]
        for sock in self.sockets:
            if sock is not mine:
                sock.close()
        from gateway.middleware import ACCESS_FIELDS

        ACCESS_FIELDS.update(worker=index, pid=os.getpid())

        def notify_ready() -> None:
            os.write(ready_w, b"1")
            os.close(ready_w)

        return self.run_worker(index, mine, self.generation > 0, notify_ready)


def _end_with_parent(supervisor_pid: int) -> None:
    """Linux: when the supervisor dies (even by SIGKILL) the kernel sends this worker SIGTERM, so it drains
    and exits instead of serving on as an orphan nobody restarts or stops."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != supervisor_pid:  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def multiprocess_metrics_dir() -> str:
    """A fresh folder for the workers' metrics files (on a RAM disk where there is one)."""
    shm = Path("/dev/shm")
    return tempfile.mkdtemp(prefix="responses-gateway-metrics-", dir=shm if shm.is_dir() else None)
