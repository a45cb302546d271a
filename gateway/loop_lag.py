"""How long the gateway's own event loop was stalled: a timeout it caused is no replica's fault.

A saturated loop reads upstream answers late, so its timeouts look like slow upstreams; counting
them would eject healthy replicas exactly when the gateway is busiest (the cascade the issue saw
starting from the gateway's own connect timeouts). A ticker sleeps a short interval and records
by how much each wake-up came late; `stalled_since(t)` is the sum since `t`, including a wake-up
that is overdue right now.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

TICK_SECONDS = 0.05
_KEEP_SECONDS = 900.0  # longer than any timeout worth asking about
_NOISE_SECONDS = 0.002  # ordinary scheduling jitter is not a stall


class LoopLag:
    def __init__(self, tick: float = TICK_SECONDS) -> None:
        self.tick = tick
        self._late: deque[tuple[float, float]] = deque()  # (when the wake-up came, by how much late)
        self._due: float | None = None  # when the ticker should wake next (None: not running)

    async def run(self) -> None:
        """Tick until cancelled."""
        try:
            while True:
                self._due = time.monotonic() + self.tick
                await asyncio.sleep(self.tick)
                now = time.monotonic()
                late = now - self._due
                if late > _NOISE_SECONDS:
                    self._late.append((now, late))
                while self._late and self._late[0][0] < now - _KEEP_SECONDS:
                    self._late.popleft()
        finally:
            self._due = None

    def stalled_since(self, since: float) -> float:
        """Seconds the loop was stalled after `since` (a time.monotonic() value)."""
        now = time.monotonic()
        total = sum(min(late, at - since) for at, late in self._late if at > since)
        if self._due is not None and now > self._due + _NOISE_SECONDS:
            total += now - max(self._due, since)  # a stall still going on (the ticker has not run yet)
        return total

    def excuses(self, since: float, budget: float) -> bool:
        """Whether a timeout of `budget` seconds that started at `since` is the gateway's own doing:
        its loop was stalled for at least half of that budget."""
        return self.stalled_since(since) >= 0.5 * budget
