"""uvloop when it is installed (every benchmark process uses the same loop as the gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def install_uvloop() -> bool:
    """Make asyncio.run and new loops use uvloop; False when it is not installed."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    install_uvloop()
    return asyncio.run(coro)
