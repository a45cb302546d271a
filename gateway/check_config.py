"""`responses-gateway check-config PATH`: what works and what does not, before serving traffic."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from gateway.config import Auth, Config, ConfigError, Store, load_config
from gateway.routing import Route, build_routes
from gateway.upstreams.dispatch import FLAVORS, bytes_precision

if TYPE_CHECKING:
    from gateway.app import GatewayState


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
        precision, per_character = bytes_precision(route.upstream.dialect, route.upstream.api, vocab is not None)
        rows.append(Row(f"model {name}", "tokenizer", True,
                        f"{vocab.name} ({len(vocab)} tokens)" if vocab else "none"))
        rows.append(Row(f"model {name}", "logprob bytes", True, ("WARNING " if per_character else "") + precision))
        needs_template = route.upstream.api in ("completions", "generate")
        if needs_template:
            rows.append(Row(f"model {name}", "chat template", route.chat_template is not None,
                            "loaded" if route.chat_template is not None
                            else "missing: only plain-string input will work on this completions-style route"))
    return rows


# --- the end-to-end probe: one real generation per model, through the gateway serve runs ---------

#: The most alternatives a client can ask for through any front door (OpenAI's limit): a route's
#: cap above it is never asked of the server.
FRONT_DOOR_MAX_TOP_LOGPROBS = 20
#: Words of the gateway's own errors when an upstream's logprobs do not fit the route's tokenizer
#: (gateway.logprobs: an id outside the vocabulary, bytes that do not spell the server's text).
_TOKENIZER_MISMATCH = ("is not in the tokenizer", "does not fit the text")


def probe_request(model: str, k: int) -> dict[str, Any]:
    return {"model": model, "input": "hi", "max_output_tokens": 1, "top_logprobs": k,
            "include": ["message.output_text.logprobs"], "store": False}


async def _generate(session: aiohttp.ClientSession, base: str, model: str, k: int) -> tuple[int, dict[str, Any]]:
    async with session.post(f"{base}/v1/responses", json=probe_request(model, k)) as reply:
        try:
            return reply.status, await reply.json(content_type=None)
        except ValueError:
            return reply.status, {"error": {"message": (await reply.text())[:300]}}


def _error_message(body: dict[str, Any]) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("message")) if isinstance(error, dict) else str(body)[:300]


async def _served_models(session: aiohttp.ClientSession, route: Route) -> list[str] | None:
    """The model ids the upstream lists at /v1/models (OpenAI-compatible servers), None if it lists none."""
    if route.upstream.api == "generate":
        return None  # TGI's and SGLang's native servers serve the one model they were started with
    try:
        async with session.get(f"{route.upstream.urls[0]}/v1/models") as reply:
            listing = await reply.json(content_type=None) if reply.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return None
    return [str(entry["id"]) for entry in data if isinstance(entry, dict) and "id" in entry]


def _from_ids(state: GatewayState, route: Route) -> float:
    sample = state.metrics.registry.get_sample_value(
        "gateway_logprob_tokens_from_ids_total", {"model": route.model, "upstream": route.upstream_name})
    return sample or 0.0


async def _probe_model(session: aiohttp.ClientSession, base: str, state: GatewayState, route: Route) -> Row:
    """One 1-token generation with logprobs and the route's cap of alternatives; what it shows."""
    name, upstream = route.model, route.upstream_name
    cap = route.upstream.top_logprobs_cap
    k = FRONT_DOOR_MAX_TOP_LOGPROBS if cap is None else min(cap, FRONT_DOOR_MAX_TOP_LOGPROBS)
    subject, check = f"model {name}", f"generation (1 token, top_logprobs {k})"
    status, body = await _generate(session, base, name, k)
    if status != 200:
        message = _error_message(body)
        if any(words in message for words in _TOKENIZER_MISMATCH):
            return Row(subject, check, False, f"the tokenizer does not match the server's token ids: {message} "
                                              f"(models.{name}.tokenizer must be the served model's)")
        if k > 1 and (await _generate(session, base, name, 1))[0] == 200:
            key = f"upstreams.{upstream}.max_top_logprobs"
            source = (key if route.upstream.max_top_logprobs is not None else "the front doors' limit"
                      if cap is None else f"the {route.upstream.dialect} default")
            return Row(subject, check, False, f"the server refuses top_logprobs {k}, the route's cap ({source}), but "
                                              f"answers 1: set {key} to the server's limit. {message}")
        served = await _served_models(session, route)
        if served is not None and route.upstream_model not in served:
            return Row(subject, check, False, f"upstream {upstream!r} does not serve {route.upstream_model!r} "
                                              f"(it serves {', '.join(map(repr, served)) or 'nothing'}); set "
                                              f"models.{name}.upstream_model. {message}")
        return Row(subject, check, False, f"HTTP {status}: {message}")
    try:
        part = body["output"][0]["content"][0]
        entries, text = part["logprobs"], part["text"]
    except (KeyError, IndexError, TypeError):
        return Row(subject, check, False, f"no output text in the answer: {str(body)[:300]}")
    if not entries:
        return Row(subject, check, False, f"the server returned no logprobs (is upstreams.{upstream}.dialect "
                                          f"{route.upstream.dialect!r} / api {route.upstream.api!r} right?)")
    alternatives = len(entries[0]["top_logprobs"])
    if alternatives < k:
        return Row(subject, check, False, f"asked for {k} alternatives, the server returned {alternatives}")
    joined = b"".join(bytes(entry["bytes"]) for entry in entries)
    if not joined.startswith(text.encode()):
        return Row(subject, check, False, f"the tokens' bytes {joined!r} do not spell the text {text!r}")
    from_ids = _from_ids(state, route)
    if route.vocab is not None and FLAVORS[route.upstream.dialect].token_id_placeholders and not from_ids:
        return Row(subject, check, False, f"the server returned no token ids (asked with return_tokens_as_token_ids): "
                                          f"not a vLLM server, or one too old; set upstreams.{upstream}.dialect")
    source = ("bytes from token ids" if from_ids else "the server's raw bytes, one entry per piece of text it sent"
              if route.upstream.dialect == "llamacpp" else "bytes from the server's token strings")
    return Row(subject, check, True, f"{len(entries)} token, {alternatives} alternatives, {source}")


async def _probe_models(config: Config, routes: dict[str, Route], timeout: float) -> list[Row]:
    """Serve the config as `serve` does (same app, same routes) on a loopback port, and send each model
    one request. Nothing is stored and no inbound key is asked for."""
    from gateway.app import STATE, create_app
    from gateway.server import listen

    probing = config.model_copy(update={
        "store": Store(backend="none"), "playground": False,
        "auth": Auth(forward_client_key=config.auth.forward_client_key),
    })
    app = create_app(probing, routes)
    runner = web.AppRunner(app)
    await runner.setup()
    base = f"http://127.0.0.1:{await listen(runner, '127.0.0.1', 0)}"
    rows = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            for name, route in routes.items():
                if name != route.model:
                    continue  # an alias
                try:
                    rows.append(await _probe_model(session, base, app[STATE], route))
                except (aiohttp.ClientError, TimeoutError) as exc:
                    rows.append(Row(f"model {name}", "generation (1 token)", False,
                                    f"no answer within {timeout} s ({type(exc).__name__})"))
    finally:
        await runner.cleanup()
    return rows


def run_checks(path: Path, timeout: float = 5.0, *, probe: bool = True) -> tuple[list[Row], bool]:
    try:
        config = load_config(path)
        routes = build_routes(config)
    except ConfigError as exc:
        return [Row("config", str(path), False, str(exc))], False
    rows = [Row("config", str(path), True, f"{len(config.upstreams)} upstreams, {len(config.models)} models")]
    rows += _model_rows(routes)
    rows += asyncio.run(_check_upstreams(config, timeout))
    if probe:
        rows += asyncio.run(_probe_models(config, routes, timeout))
    return rows, all(row.ok for row in rows)


def print_table(rows: list[Row]) -> None:
    widths = [max(len(getattr(r, f)) for r in rows) for f in ("subject", "check")]
    for row in rows:
        mark = "ok  " if row.ok else "FAIL"
        print(f"{mark}  {row.subject:<{widths[0]}}  {row.check:<{widths[1]}}  {row.detail}")
