"""The floor: a bare aiohttp relay that forwards bytes and parses nothing.

Same stack as the gateway (aiohttp server and client, the same connection pool, uvloop when
installed), so the gateway's figures over the relay's are the cost of translating, not of being
a proxy. Bodies pass through untouched; streams are forwarded chunk by chunk as they arrive.

    python -m bench.relay --upstream http://127.0.0.1:PORT [--port 0] [--workers N]
    (prints `READY <port>` when it listens)

With `--workers N` it forks N relay processes on one port the way `serve --workers N` does (one
SO_REUSEPORT socket each, gateway.workers.listening_sockets), so a gateway with N workers is compared
with a relay that has as many cores' worth of processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys

import aiohttp
from aiohttp import web

from bench.loop import install_uvloop

UPSTREAM_KEY = web.AppKey("upstream", str)
SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)


async def relay(request: web.Request) -> web.StreamResponse:
    session = request.app[SESSION_KEY]
    body = await request.read()
    async with session.post(request.app[UPSTREAM_KEY] + request.path, data=body,
                            headers={"Content-Type": request.headers.get("Content-Type", "application/json")}
                            ) as upstream:
        content_type = upstream.headers.get("Content-Type", "application/json")
        if not content_type.startswith("text/event-stream"):
            return web.Response(body=await upstream.read(), status=upstream.status,
                                headers={"Content-Type": content_type})
        response = web.StreamResponse(status=upstream.status, headers={"Content-Type": content_type})
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def _session(app: web.Application) -> None:
    app[SESSION_KEY] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                                             auto_decompress=False)


async def _close(app: web.Application) -> None:
    await app[SESSION_KEY].close()


def create_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app[UPSTREAM_KEY] = upstream.rstrip("/")
    app.router.add_post("/{path:.*}", relay)
    app.on_startup.append(_session)
    app.on_cleanup.append(_close)
    return app


async def serve(upstream: str, host: str, port: int, sock: socket.socket | None = None) -> None:
    runner = web.AppRunner(create_app(upstream), handler_cancellation=True)
    await runner.setup()
    if sock is not None:
        await web.SockSite(runner, sock).start()
    else:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        print(f"READY {site._server.sockets[0].getsockname()[1]}", flush=True)  # type: ignore[union-attr]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _serve_forked(upstream: str, host: str, port: int, workers: int) -> int:
    """N relay processes on one port; SIGTERM to this one ends them all."""
    from gateway.workers import listening_sockets

    sockets = listening_sockets(host, port, workers)
    children = []
    for index in range(workers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                install_uvloop()
                asyncio.run(serve(upstream, host, port, sockets[index % len(sockets)]))
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    print(f"READY {sockets[0].getsockname()[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: [os.kill(child, signal.SIGTERM) for child in children])
    for child in children:
        while True:
            try:
                os.waitpid(child, 0)
                break
            except ChildProcessError:
                break
            except InterruptedError:
                continue
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    if args.workers > 1:
        return _serve_forked(args.upstream, args.host, args.port, args.workers)
    install_uvloop()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.upstream, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
