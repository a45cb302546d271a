"""Running the app: listen, on SIGHUP reload the config (gateway.reload), on SIGTERM drain gracefully.

Draining: /readyz turns 503 (load balancers stop sending), new /v1 requests get 503, in-flight
streams may finish until the grace deadline; then the server stops and whatever is still
running is cancelled (which drops its upstream connection, so the GPU stops too).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from aiohttp import web

from gateway.app import STATE
from gateway.middleware import ACCESS_FIELDS
from gateway.reload import Reloader

log = logging.getLogger("responses_gateway")


# The open-file limit asked for when the hard limit is unlimited.
_OPEN_FILES_WANTED = 1 << 20


def raise_open_file_limit() -> tuple[int, int] | None:
    """Lift this process's soft limit on open files to its hard one, as Go's runtime does at start: a
    request in flight holds two descriptors (the client's connection and the upstream's, which has no pool
    cap), and a shell's usual soft limit of 1,024 would refuse connections past ~500 requests at once.
    The (old, new) soft limits when it was raised; None when there was nothing to do or it could not be."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):  # (macOS caps it below the hard limit it reports)
        return None
    return soft, wanted


def configure_logging(level: str) -> None:
    """One line per record on stderr; access records are already JSON.

    Records show only their message, so the process stops collecting what no line prints: the
    calling frame (a stack walk per record), thread and process names (the logging HOWTO's
    "Optimization" switches). That is two thirds of an access line's cost."""
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("responses_gateway")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class ListenError(RuntimeError):
    """The address cannot be listened on (in use, not this host's, a privileged port): one line for the user."""


async def listen(runner: web.AppRunner, host: str, port: int) -> int:
    """Start `runner` on host:port (0: any free port); the port it got. Cleans the runner up on failure."""
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.EADDRINUSE:
            reason += " (another process listens there: stop it, or pick another port with --port)"
        raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
    return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def serve(app: web.Application, host: str, port: int, reloader: Reloader | None = None, *,
                sock: socket.socket | None = None, reload_first: bool = False,
                on_listening: Callable[[], None] | None = None) -> None:
    """Listen until SIGTERM or SIGINT, then drain. SIGHUP reloads the config through `reloader`;
    without one it drains like SIGTERM (never the default action, which kills in-flight streams).

    A worker process (gateway.workers) passes the listening `sock` it was given, `reload_first` when
    the config was reloaded since the supervisor loaded it (so it serves what its siblings serve),
    and `on_listening`, called once it accepts."""
    state = app[STATE]
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, stop.set if reloader is None else reloader.request)
    if sock is None:
        port = await listen(runner, host, port)
        print(f"responses-gateway on http://{host}:{port} ({len(state.config.models)} models)", flush=True)
    else:
        if reload_first and reloader is not None:
            await reloader.run_now()
        await web.SockSite(runner, sock).start()
    if on_listening is not None:
        on_listening()
    await stop.wait()
    if reloader is not None:
        await reloader.cancel()  # a reload not yet swapped in is dropped
    state.draining = True
    grace_seconds = state.config.shutdown.grace_seconds  # as reloaded
    deadline = time.monotonic() + grace_seconds
    # (ACCESS_FIELDS: which worker, in a `--workers N` process; nothing otherwise)
    log.info(json.dumps({"event": "draining", "in_flight": state.in_flight, "grace_seconds": grace_seconds,
                         **ACCESS_FIELDS}))
    while state.in_flight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if state.in_flight:
        log.info(json.dumps({"event": "grace_expired", "cancelled": state.in_flight, **ACCESS_FIELDS}))
    await runner.cleanup()
