"""An upstream's replicas: least-in-flight choice, passive cooldown, active health checks.

A replica that errors or times out sits out a cooldown; a background probe of its health path
marks it up or down. The choice is the healthy replica with the fewest requests in flight, so a
slow replica naturally gets less traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp


@dataclass(slots=True)
class Replica:
    url: str
    in_flight: int = 0
    cooldown_until: float = 0.0
    probe_ok: bool | None = None  # None until the first active check answers
    failures: int = 0

    def available(self, now: float) -> bool:
        return now >= self.cooldown_until and self.probe_ok is not False


class NoReplicaAvailable(Exception):
    """Every replica of the upstream is cooling down or failing its health check."""


class ReplicaSet:
    def __init__(self, urls: list[str], *, cooldown: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.replicas = [Replica(url) for url in urls]
        self.cooldown = cooldown
        self._clock = clock
        self._cursor = 0

    def choose(self, exclude: set[str] | frozenset[str] = frozenset()) -> Replica:
        """The available replica with the fewest requests in flight (ties rotate)."""
        now = self._clock()
        candidates = [r for r in self.replicas if r.url not in exclude and r.available(now)]
        if not candidates:
            raise NoReplicaAvailable
        self._cursor += 1
        start = self._cursor % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda r: r.in_flight)

    def ready(self, probed: bool) -> bool:
        """Some replica can take traffic; with active checks, one must have passed a check."""
        now = self._clock()
        return any(r.available(now) and (r.probe_ok is True or not probed) for r in self.replicas)

    def failed(self, replica: Replica) -> None:
        replica.failures += 1
        replica.cooldown_until = self._clock() + self.cooldown

    def succeeded(self, replica: Replica) -> None:
        replica.failures = 0
        replica.cooldown_until = 0.0

    @contextlib.contextmanager
    def in_flight(self, replica: Replica):
        replica.in_flight += 1
        try:
            yield replica
        finally:
            replica.in_flight -= 1


async def probe_forever(replicas: ReplicaSet, session: aiohttp.ClientSession, path: str, interval: float,
                        headers: dict[str, str]) -> None:
    """Check every replica's health path every `interval` seconds until cancelled."""
    timeout = aiohttp.ClientTimeout(total=max(1.0, min(interval, 5.0)))
    while True:
        await asyncio.gather(*(_probe(r, session, path, timeout, headers) for r in replicas.replicas))
        await asyncio.sleep(interval)


async def _probe(replica: Replica, session: aiohttp.ClientSession, path: str, timeout: aiohttp.ClientTimeout,
                 headers: dict[str, str]) -> None:
    try:
        async with session.get(replica.url + path, timeout=timeout, headers=headers) as response:
            replica.probe_ok = response.status < 400
    except (aiohttp.ClientError, TimeoutError):
        replica.probe_ok = False
