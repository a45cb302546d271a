"""An upstream's replicas: least-in-flight choice, outlier ejection, active health checks.

Health follows Envoy's outlier detection: only gateway-side faults count against a replica (a
refused connection, no first byte in time, a 5xx, a malformed body), and only `eject_after`
consecutive ones eject it. An ejection lasts `cooldown` seconds times the number of times the
replica was ejected in a row (capped at `max_cooldown`); a success resets both counts. An upstream's
verdict on a request (a 4xx, in band or not) is no host failure: it proves the replica is serving.

Request traffic never ejects the last healthy replica, and when none is healthy the choice panics:
it tries the ejected ones anyway, least recently failed first, rather than refusing everyone (one
client's bad requests must not take the model away from the others). Only a replica that fails
its active health check is skipped for sure; `NoReplicaAvailable` means every replica was tried
now or is known down by those checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson

log = logging.getLogger("responses_gateway.replicas")


@dataclass(slots=True)
class Replica:
    url: str
    in_flight: int = 0
    probe_ok: bool | None = None  # None until the first active check answers
    failures: int = 0  # consecutive gateway-side failures
    ejected_until: float = 0.0  # ejected while the clock is before this
    ejections: int = 0  # consecutive ejections (the next one lasts longer); a success resets it
    last_failure_at: float = -math.inf
    ejected: bool = False  # set on ejection, cleared (and logged) when it returns
    ejected_at: float = 0.0

    def healthy(self, now: float) -> bool:
        return now >= self.ejected_until and self.probe_ok is not False


class NoReplicaAvailable(Exception):
    """Every replica of the upstream was tried for this request or fails its active health check."""

    def __init__(self, retry_after: float) -> None:
        super().__init__("no replica available")
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Outlier:
    """When a replica is ejected and for how long (the config's `upstreams.<name>` keys)."""

    eject_after: int = 5  # consecutive gateway-side failures
    cooldown: float = 10.0  # seconds of the first ejection; each repeat adds as much again
    max_cooldown: float = 300.0
    max_ejection_percent: float = 100.0  # at most this share of the replicas ejected at once
    probe_interval: float = 0.0  # active checks' period (the Retry-After of a refusal they caused)


class ReplicaSet:
    def __init__(self, urls: list[str], *, name: str = "", outlier: Outlier = Outlier(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.replicas = [Replica(url) for url in urls]
        self.outlier = outlier
        self._clock = clock
        self._cursor = 0

    def choose(self, exclude: set[str] | frozenset[str] = frozenset()) -> Replica:
        """The healthy replica with the fewest requests in flight (ties rotate); with none healthy,
        an ejected one, least recently failed first (panic). Never one that fails its health check."""
        now = self._clock()
        self._return_expired(now)
        untried = [r for r in self.replicas if r.url not in exclude]
        candidates = [r for r in untried if r.healthy(now)]
        if candidates:
            self._cursor += 1
            start = self._cursor % len(candidates)
            rotated = candidates[start:] + candidates[:start]
            return min(rotated, key=lambda r: r.in_flight)
        if not any(r.healthy(now) for r in self.replicas):
            panic = [r for r in untried if r.probe_ok is not False]
            if panic:
                return min(panic, key=lambda r: r.last_failure_at)
        raise NoReplicaAvailable(self._retry_after(now))

    def ready(self, probed: bool) -> bool:
        """Whether a request would find a replica to try: one not known down by the health checks
        (with checks on, one that passed). Ejection does not matter: the choice panics instead."""
        if probed:
            return any(r.probe_ok is True for r in self.replicas)
        return any(r.probe_ok is not False for r in self.replicas)

    def failed(self, replica: Replica, reason: str) -> bool:
        """A gateway-side fault of `replica`: the `eject_after`-th in a row ejects it, unless it is
        the last healthy one (or ejecting it would pass `max_ejection_percent`). True if it ejected it."""
        now = self._clock()
        replica.failures += 1
        replica.last_failure_at = now
        outlier = self.outlier
        if replica.failures < outlier.eject_after or now < replica.ejected_until:
            return False
        others_healthy = any(r.healthy(now) for r in self.replicas if r is not replica)
        ejected = sum(1 for r in self.replicas if now < r.ejected_until)
        allowed = max(1, math.floor(len(self.replicas) * outlier.max_ejection_percent / 100))
        if not others_healthy or ejected + 1 > allowed:
            self._log("replica_ejection_skipped", replica, reason=reason, consecutive_failures=replica.failures,
                      why="last healthy replica" if not others_healthy else "max_ejection_percent")
            return False
        replica.ejections += 1
        seconds = min(outlier.cooldown * replica.ejections, outlier.max_cooldown)
        replica.ejected_until = now + seconds
        replica.ejected, replica.ejected_at = True, now
        self._log("replica_ejected", replica, reason=reason, consecutive_failures=replica.failures,
                  ejected_for_s=round(seconds, 3), ejections=replica.ejections)
        replica.failures = 0  # counted afresh once it returns
        return True

    def succeeded(self, replica: Replica) -> None:
        """It answered (a result, or its own verdict on the request): the fault counts reset."""
        replica.failures = 0
        replica.ejections = 0
        if replica.ejected:  # a panic choice that worked: it is back before its time
            replica.ejected_until = 0.0
            self._returned(replica, "succeeded")

    def probed(self, replica: Replica, ok: bool, detail: str = "") -> None:
        """An active health check's answer (state changes are logged)."""
        if replica.probe_ok is not ok:
            self._log("replica_probe_up" if ok else "replica_probe_down", replica, **({"detail": detail} if detail
                                                                                       else {}))
        replica.probe_ok = ok

    def state(self) -> dict[str, dict[str, object]]:
        """Per replica: healthy / ejected / probe_down, and the counts behind it (for /readyz)."""
        now = self._clock()
        self._return_expired(now)
        out: dict[str, dict[str, object]] = {}
        for r in self.replicas:
            status = "probe_down" if r.probe_ok is False else "ejected" if now < r.ejected_until else "healthy"
            entry: dict[str, object] = {"state": status, "consecutive_failures": r.failures}
            if now < r.ejected_until:
                entry["ejected_for_s"] = round(r.ejected_until - now, 3)
            out[r.url] = entry
        return out

    @contextlib.contextmanager
    def in_flight(self, replica: Replica):
        replica.in_flight += 1
        try:
            yield replica
        finally:
            replica.in_flight -= 1

    def _return_expired(self, now: float) -> None:
        for r in self.replicas:
            if r.ejected and now >= r.ejected_until:
                self._returned(r, "ejection_expired")

    def _returned(self, replica: Replica, how: str) -> None:
        replica.ejected = False
        self._log("replica_returned", replica, how=how, out_for_s=round(self._clock() - replica.ejected_at, 3))

    def _retry_after(self, now: float) -> float:
        waits = [r.ejected_until - now for r in self.replicas if r.probe_ok is not False and now < r.ejected_until]
        if waits:
            return min(waits)
        return self.outlier.probe_interval or self.outlier.cooldown or 1.0

    def _log(self, event: str, replica: Replica, **fields: object) -> None:
        """One JSON line per change of a replica's state: a warning when it leaves, info when it returns."""
        level = logging.INFO if event in ("replica_returned", "replica_probe_up") else logging.WARNING
        if log.isEnabledFor(level):
            entry = {"event": event, "upstream": self.name, "replica": replica.url, **fields}
            log.log(level, orjson.dumps(entry).decode())


def retry_after_header(seconds: float) -> str:
    """A Retry-After value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


async def probe_forever(replicas: ReplicaSet, session: aiohttp.ClientSession, path: str, interval: float,
                        headers: dict[str, str]) -> None:
    """Check every replica's health path every `interval` seconds until cancelled."""
    timeout = aiohttp.ClientTimeout(total=max(1.0, min(interval, 5.0)))
    while True:
        await asyncio.gather(*(_probe(replicas, r, session, path, timeout, headers) for r in replicas.replicas))
        await asyncio.sleep(interval)


async def _probe(replicas: ReplicaSet, replica: Replica, session: aiohttp.ClientSession, path: str,
                 timeout: aiohttp.ClientTimeout, headers: dict[str, str]) -> None:
    try:
        async with session.get(replica.url + path, timeout=timeout, headers=headers) as response:
            replicas.probed(replica, response.status < 400, f"HTTP {response.status}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        replicas.probed(replica, False, type(exc).__name__)
