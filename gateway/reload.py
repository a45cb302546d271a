"""SIGHUP: read the config file again; new requests take the new routes, in-flight ones finish on theirs.

A request looks its route up once, when it starts, and keeps that object (upstream, tokenizer,
template, replicas) to its end, so swapping `state.routes` never touches it. What is bound when the
app is built — the listening address, the response store, inbound API keys, the body size limit,
the playground route — keeps its running value until a restart, and the reload says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from aiohttp import web

from gateway.app import STATE, start_probes, stop_probes
from gateway.config import Config, load_config
from gateway.logprobs.vocab import forget_loaded_vocabularies
from gateway.memory import release_free_memory
from gateway.middleware import ACCESS_FIELDS
from gateway.replicas import ReplicaSet
from gateway.routing import TokenizerLoaded, build_routes

log = logging.getLogger("responses_gateway")

#: Config sections fixed when the app is built: a reload keeps their running values.
RESTART_ONLY = ("listen", "store", "auth", "limits", "playground", "workers")


class Reloader:
    """Reloads `path` into a running app; one reload at a time (a SIGHUP during one is ignored)."""

    def __init__(self, app: web.Application, path: Path, on_tokenizer: TokenizerLoaded | None = None) -> None:
        self.app = app
        self.path = path
        self.on_tokenizer = on_tokenizer
        self.task: asyncio.Task[None] | None = None

    def request(self) -> None:
        if self.task is not None and not self.task.done():
            log.warning('{"event":"reload_ignored","reason":"a reload is already running"}')
            return
        self.task = asyncio.create_task(self._run())

    async def run_now(self) -> None:
        """Reload at once (a worker started after a reload, before it accepts); a failure is logged."""
        await self._run()

    async def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        try:
            await reload_config(self.app, self.path, self.on_tokenizer)
        except Exception as exc:  # a bad config (ConfigError) or anything else: keep serving the old one
            log.error(json.dumps({"event": "reload_failed", "config": str(self.path), "error": str(exc),
                                  "kept": "the running config"}))


async def reload_config(app: web.Application, path: Path, on_tokenizer: TokenizerLoaded | None = None) -> Config:
    """Load `path`, build its routes off the event loop, then swap them in; the config now applied."""
    state = app[STATE]
    running = state.config
    new = load_config(path)
    # Upstreams whose settings did not change keep their replica sets: health, cooldowns, in-flight counts.
    kept: dict[str, ReplicaSet] = {
        route.upstream_name: route.replicas for route in state.routes.values()
        if new.upstreams.get(route.upstream_name) == running.upstreams.get(route.upstream_name)
    }
    # Tokenizers are cached by path; the file may have changed since, so this reload reads them again.
    forget_loaded_vocabularies()
    routes = await asyncio.to_thread(build_routes, new, on_tokenizer, kept)
    needs_restart = [key for key in RESTART_ONLY if getattr(new, key) != getattr(running, key)]
    applied = new.model_copy(update={key: getattr(running, key) for key in RESTART_ONLY})
    await stop_probes(state)
    state.config, state.routes = applied, routes
    start_probes(state)
    logging.getLogger("responses_gateway").setLevel(applied.logging.level.upper())
    release_free_memory()  # the old routes' tables go once their last requests end
    log.info(json.dumps({"event": "reloaded", "config": str(path), "models": len(applied.models),
                         "in_flight_on_the_old": state.in_flight, "kept_until_restart": needs_restart,
                         **ACCESS_FIELDS}))  # which worker, with --workers N
    return applied
