"""Simulator-only test hooks: injected faults, per-step delays, and request counters.

None of this exists in the real servers. A request selects a fault with a header or a JSON body
field of the same name (`x-sim-fault` or `x_sim_fault`):

    refuse                   drop the connection without any response bytes
    http500 / httpNNN        answer NNN with the server's own JSON error shape (http500 = engine error)
    hang                     send nothing at all until the client goes away
    hang_before_first_token  streaming: send the response headers, then nothing; else as hang
    die_mid_stream           streaming: send `x-sim-die-after` data frames (default 3), then drop
                             the connection mid-body; non-streaming: drop before answering
    error_mid_stream         streaming: send `x-sim-die-after` frames, then the server's in-band
                             error frame (vLLM: `data: {"error": {...}}` and `data: [DONE]`); else as http500
    slow                     wait `x-sim-delay-ms` (default 200) before every engine step

`x-sim-delay-ms` alone sets the per-step delay without any fault; `x-sim-tokens-per-step`
(an int or "vary") overrides the server's step grouping for one request.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.simulator.script import TokensPerStep

SLOW_DEFAULT_DELAY_MS = 200.0
DIE_AFTER_DEFAULT = 3
_HTTP_FAULT = re.compile(r"^http(\d{3})$")
_FAULTS = {"refuse", "hang", "hang_before_first_token", "die_mid_stream", "error_mid_stream", "slow"}


class HookError(ValueError):
    """A malformed x-sim-* value: answered with 400 naming the hook."""

    def __init__(self, hook: str, detail: str) -> None:
        super().__init__(f"simulator hook {hook}: {detail}")
        self.hook = hook


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What to do to one request. `fault` is None for a normal answer."""

    fault: str | None = None
    http_status: int = 500
    delay_ms: float = 0.0
    die_after: int = DIE_AFTER_DEFAULT
    tokens_per_step: TokensPerStep | None = None


def _hook(headers: Mapping[str, str], body: Mapping[str, Any], name: str) -> Any:
    value = headers.get(name)
    if value is None:
        value = body.get(name, body.get(name.replace("-", "_")))
    return value


def _number(hook: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise HookError(hook, f"expected a number, got {value!r}") from None
    if number < 0:
        raise HookError(hook, f"must be >= 0, got {value!r}")
    return number


def read_fault_plan(headers: Mapping[str, str], body: Mapping[str, Any], default_delay_ms: float) -> FaultPlan:
    fault = _hook(headers, body, "x-sim-fault")
    status = 500
    if fault is not None:
        fault = str(fault).strip().lower()
        if match := _HTTP_FAULT.match(fault):
            status = int(match.group(1))
            if not 400 <= status <= 599:
                raise HookError("x-sim-fault", f"httpNNN needs a 4xx/5xx status, got {fault!r}")
        elif fault not in _FAULTS:
            allowed = ", ".join(sorted(_FAULTS | {"httpNNN"}))
            raise HookError("x-sim-fault", f"unknown fault {fault!r} (one of {allowed})")
    delay_value = _hook(headers, body, "x-sim-delay-ms")
    if delay_value is not None:
        delay_ms = _number("x-sim-delay-ms", delay_value)
    else:
        delay_ms = SLOW_DEFAULT_DELAY_MS if fault == "slow" else default_delay_ms
    die_value = _hook(headers, body, "x-sim-die-after")
    die_after = int(_number("x-sim-die-after", die_value)) if die_value is not None else DIE_AFTER_DEFAULT
    tps_value = _hook(headers, body, "x-sim-tokens-per-step")
    tokens_per_step: TokensPerStep | None = None
    if tps_value is not None:
        if str(tps_value).strip().lower() == "vary":
            tokens_per_step = "vary"
        else:
            tokens_per_step = max(1, int(_number("x-sim-tokens-per-step", tps_value)))
    return FaultPlan(fault, status, delay_ms, die_after, tokens_per_step)


class SimStats:
    """Counters behind GET /sim/stats; each started request ends in exactly one outcome.

    finished: a complete answer was sent; rejected: answered 4xx by validation (the server's own
    errors); faulted: ended by an injected fault; cancelled: the client went away first;
    errored: the simulator itself failed (a bug).
    """

    OUTCOMES = ("finished", "rejected", "faulted", "cancelled", "errored")

    def __init__(self, keep_requests: int = 64) -> None:
        self.started = 0
        self.outcomes = dict.fromkeys(self.OUTCOMES, 0)
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep_requests)

    def start(self) -> None:
        self.started += 1

    def end(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def record(self, path: str, headers: Mapping[str, str], body: Any) -> None:
        """Keep a received request (credentials redacted) for GET /sim/requests."""
        shown = {
            str(k): ("<redacted>" if k.lower() in {"authorization", "cookie"} else str(v)) for k, v in headers.items()
        }
        self.recent.append({"path": path, "headers": shown, "body": body})

    def reset(self) -> None:
        self.started = 0
        self.outcomes = dict.fromkeys(self.OUTCOMES, 0)
        self.recent.clear()

    def snapshot(self) -> dict[str, int]:
        ended = sum(self.outcomes.values())
        return {
            "requests_started": self.started,
            **{f"requests_{name}": count for name, count in self.outcomes.items()},
            "in_flight": self.started - ended,
        }
