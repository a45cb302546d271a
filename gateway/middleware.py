"""The request pipeline around every handler: request id, access log, draining, auth, errors."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.config import Config
from gateway.errors import GatewayError
from gateway.translate.response_object import random_hex

log = logging.getLogger("responses_gateway.access")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST_ID_HEADER = "X-Request-Id"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that went away before its answer was complete
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Endpoints that answer without a key: probes and the scrape.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: Fields every access line carries: a worker process's number and pid (gateway.workers sets them).
ACCESS_FIELDS: dict[str, Any] = {}


def access_line(entry: dict[str, Any]) -> str:
    try:
        return orjson.dumps(entry).decode()
    except TypeError:  # a logged request body with what orjson refuses (an integer beyond 64 bits)
        return json.dumps(entry, separators=(",", ":"), default=str)


def bearer_token(request: web.Request) -> str:
    """The key of an `Authorization: Bearer <key>` header, or "" when there is none."""
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else ""


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json", headers=headers)


def _error_body(status: int, message: str, code: str | None, type_: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Accept a sane X-Request-Id or make one; return it; log one JSON line per request."""
    given = request.headers.get(REQUEST_ID_HEADER, "")
    request_id = given if _SAFE_REQUEST_ID.fullmatch(given) else random_hex(16)
    request["request_id"] = request_id
    request["log"] = {}
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        if not response.prepared:
            response.headers[REQUEST_ID_HEADER] = request_id
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        request["log"]["client_disconnected"] = True
        raise
    finally:
        if request["log"].get("client_disconnected"):
            status = CLIENT_CLOSED_REQUEST
        if log.isEnabledFor(logging.INFO):
            entry = {"request_id": request_id, "method": request.method, "path": request.path, "status": status,
                     "duration_ms": round((time.perf_counter() - started) * 1000, 2), **ACCESS_FIELDS,
                     **request["log"]}
            after_answer(lambda: log.info(access_line(entry)))


def after_answer(work: Callable[[], None]) -> None:
    """Run `work` once the request's task has ended, so after aiohttp wrote its answer: bookkeeping
    (the access line, ~30 us with its write to stderr; metrics) stays out of the client's latency, and
    still runs before the loop reads that client's next request. At once outside a task."""
    task = asyncio.current_task()
    if task is None:
        work()
    else:
        task.add_done_callback(lambda _: work())


def error_middleware_factory() -> Callable:
    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as exc:
            request["log"]["error_code"] = exc.code
            return json_response(exc.body(), exc.status, headers=exc.headers)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
            message = exc.text if exc.status == 413 and exc.text else exc.reason
            return json_response(_error_body(exc.status, message, code), exc.status)

    return errors


def load_api_keys(config: Config) -> list[bytes]:
    """Keys from an environment variable (comma-separated) and/or a file (one per line)."""
    keys: list[str] = []
    if config.auth.api_keys_env:
        keys += os.environ.get(config.auth.api_keys_env, "").split(",")
    if config.auth.api_keys_file:
        keys += config.resolve(config.auth.api_keys_file).read_text().splitlines()
    return [key.strip().encode() for key in keys if key.strip()]


def auth_middleware_factory(keys: list[bytes]) -> Callable:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not keys or request.path in OPEN_PATHS or not request.path.startswith("/v1/"):
            return await handler(request)
        presented = bearer_token(request).encode()
        # Compare against every key in constant time, so timing reveals neither key nor match.
        matched = False
        for key in keys:
            matched |= hmac.compare_digest(presented, key)
        if not presented or not matched:
            message = "You didn't provide an API key." if not presented else "Incorrect API key provided."
            return json_response(_error_body(401, message, "invalid_api_key"), 401)
        return await handler(request)

    return auth


def draining_middleware_factory(is_draining: Callable[[], bool]) -> Callable:
    @web.middleware
    async def draining(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_draining() and request.path.startswith("/v1/"):
            body = _error_body(503, "The gateway is shutting down; retry on another instance.", "shutting_down",
                               "server_error")
            return json_response(body, 503, headers={"Connection": "close"})
        return await handler(request)

    return draining


