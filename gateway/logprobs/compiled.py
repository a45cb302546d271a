"""The compiled twin of the logprob hot path (`_fastpath.c`), or None where it was not built.

Every compiled function returns exactly what its Python twin returns, or None for a shape it
leaves to Python, so the gateway's output never depends on whether a C compiler was present at
install time; only its speed does. `RESPONSES_GATEWAY_PURE_PYTHON=1` turns the twin off (to rule
it out when debugging, or to compare).
"""

from __future__ import annotations

import os
from types import ModuleType

from gateway.logprobs.tokens import Candidate, Origin, Token

PURE_PYTHON_ENV = "RESPONSES_GATEWAY_PURE_PYTHON"


def _load() -> ModuleType | None:
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        from gateway.logprobs import _fastpath  # type: ignore[attr-defined]
    except ImportError:  # built without a compiler: the pure-Python path runs
        return None
    _fastpath.configure(Token, Candidate, Origin.TOKEN_ID)
    return _fastpath


fastpath = _load()


class _NoBatch:
    """Stands for the compiled `TokenBatch` where it was not built: nothing is ever of this type."""


# A body's tokens in flat arrays, as the compiled body reader gives them (see body_scan.py).
TokenBatch: type = fastpath.TokenBatch if fastpath is not None else _NoBatch
