"""`responses-gateway check-config PATH`: what works and what does not, before serving traffic."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gateway.config import Config, ConfigError, load_config
from gateway.routing import Route, build_routes


@dataclass(slots=True)
class Row:
    subject: str
    check: str
    ok: bool
    detail: str


async def _probe(session: aiohttp.ClientSession, url: str) -> tuple[bool, str]:
    try:
        async with session.get(url) as reply:
            return reply.status < 400, f"HTTP {reply.status}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return False, type(exc).__name__


async def _check_upstreams(config: Config, timeout: float) -> list[Row]:
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for name, upstream in config.upstreams.items():
            for url in upstream.urls:
                ok, detail = await _probe(session, url + upstream.health_path)
                rows.append(Row(f"upstream {name}", f"{url}{upstream.health_path}", ok, detail))
    return rows


def _model_rows(routes: dict[str, Route]) -> list[Row]:
    rows = []
    for name, route in routes.items():
        if name != route.model:
            continue  # an alias
        vocab = route.vocab
        rows.append(Row(f"model {name}", "tokenizer", True,
                        f"{vocab.name} ({len(vocab)} tokens): exact bytes from ids" if vocab
                        else "none: lossy strings repaired against the text only"))
        needs_template = route.upstream.api in ("completions", "generate")
        if needs_template:
            rows.append(Row(f"model {name}", "chat template", route.chat_template is not None,
                            "loaded" if route.chat_template is not None
                            else "missing: only plain-string input will work on this completions-style route"))
    return rows


def run_checks(path: Path, timeout: float = 5.0) -> tuple[list[Row], bool]:
    try:
        config = load_config(path)
        routes = build_routes(config)
    except ConfigError as exc:
        return [Row("config", str(path), False, str(exc))], False
    rows = [Row("config", str(path), True, f"{len(config.upstreams)} upstreams, {len(config.models)} models")]
    rows += _model_rows(routes)
    rows += asyncio.run(_check_upstreams(config, timeout))
    return rows, all(row.ok for row in rows)


def print_table(rows: list[Row]) -> None:
    widths = [max(len(getattr(r, f)) for r in rows) for f in ("subject", "check")]
    for row in rows:
        mark = "ok  " if row.ok else "FAIL"
        print(f"{mark}  {row.subject:<{widths[0]}}  {row.check:<{widths[1]}}  {row.detail}")
