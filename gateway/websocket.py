"""WebSocket mode on /v1/responses (Open Responses 2026-04-24, OpenAI's "WebSocket mode").

`GET /v1/responses` with an upgrade opens a connection; each `response.create` message is one turn:
the body of `POST /v1/responses` plus `type`, without `stream`, `stream_options` or `background`.
A turn runs on the same stream loop and translators as an SSE stream (its sink sends each event as
one text message), so the events are the same objects. One turn at a time per connection: a
`response.create` that arrives while one runs gets an error message and changes nothing.

Continuing: every completed (or incomplete) response of the connection is kept in a small
per-connection cache (the newest `CACHED_RESPONSES`), so a `store: false` response can be continued on
the same socket with `previous_response_id` and only the new input; ids not in the cache are looked
up in the store as over HTTP (a `store: false` id on a new socket: `previous_response_not_found`).
A continuation that fails (an error message or `response.failed`) evicts the id it continued.

Failures are `{"type": "error", "status": ..., "error": {...}}` messages (the spec's
WebSocketErrorEvent); the connection stays open. After `limits.websocket_seconds` the connection
ends with `websocket_connection_limit_reached` (a running turn finishes first); while the gateway
drains, a new `response.create` gets `shutting_down` and the connection closes. Auth, draining and
the body size limit apply to the upgrade and messages as to HTTP; each turn has its own request id
(`<connection id>.<n>`), metrics and access-log line; the client closing the socket cancels the
running turn, which drops its upstream request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from gateway.app import RESPONSES_FRAMING, STATE, ClientGone, serve_generation
from gateway.errors import GatewayError, bad_request
from gateway.middleware import access_line
from gateway.sse import frame_json
from gateway.stored_routes import STORED_STATUSES, Turn, begin_turn, expand_turn_compactions, turn_input_items
from gateway.translate.front_doors import generation_from_responses, responses_settings
from gateway.translate.fronts import ResponsesFront
from gateway.translate.input_items import Item, replayed_items

access_log = logging.getLogger("responses_gateway.access")
log = logging.getLogger("responses_gateway.websocket")

CACHED_RESPONSES = 16
_TRANSPORT_FIELDS = ("stream", "stream_options", "background")  # HTTP-only: the spec forbids them here
CONNECTIONS = web.AppKey("websocket_connections", set)


def error_message(error: GatewayError) -> dict[str, Any]:
    return {"type": "error", "status": error.status, "error": error.body()["error"]}


class _WebSocketSink:
    """The stream loop's sink for one turn: each event one text message, in order."""

    __slots__ = ("failed", "final", "ws")

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.final: dict[str, Any] | None = None
        self.failed = False

    async def begin(self, items: list[dict[str, Any] | bytes]) -> None:
        send = self.ws.send_frame
        try:
            for item in items:
                await send(frame_json(item) if type(item) is bytes else orjson.dumps(item), WSMsgType.TEXT)
        except ConnectionResetError:  # aiohttp's is a ClientError: the loop would blame the upstream
            raise ClientGone("the client closed the WebSocket") from None

    send = begin

    async def end(self, items: list[dict[str, Any] | bytes], failed: bool) -> None:
        self.failed = failed
        last = items[-1] if items else None
        if isinstance(last, dict) and isinstance(last.get("response"), dict):
            # Plain JSON values (the live dicts may hold pre-serialized logprobs) for the cache.
            self.final = orjson.loads(orjson.dumps(last["response"]))
        await self.begin(items)


class _Connection:
    def __init__(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        self.request = request
        self.ws = ws
        self.id = request["request_id"]
        self.turns = 0
        # response id -> what continuing it replays (its input items and its output), newest last.
        self.cache: OrderedDict[str, list[Item]] = OrderedDict()

    def remember(self, response_id: str, history: list[Item]) -> None:
        self.cache[response_id] = history
        self.cache.move_to_end(response_id)
        while len(self.cache) > CACHED_RESPONSES:
            self.cache.popitem(last=False)

    async def turn(self, raw: str | bytes) -> None:
        """One `response.create`, its events or one error message; logged like an HTTP request."""
        request = self.request
        self.turns += 1
        connection_log = request["log"]
        request["request_id"], request["log"] = f"{self.id}.{self.turns}", {"transport": "websocket"}
        started = time.perf_counter()
        status = 200
        previous: str | None = None
        try:
            body = self._body(raw)
            previous = body.get("previous_response_id") if isinstance(body.get("previous_response_id"), str) else None
            sink = _WebSocketSink(self.ws)
            turn = await self._begin(body, previous)
            gen = generation_from_responses({**body, "stream": True}, turn.history)
            settings = responses_settings(body, gen, store=turn.stored, previous_response_id=turn.previous_response_id)
            await serve_generation(request, "responses", gen,
                                   lambda route: turn.track(ResponsesFront(settings, route.vocab, serialized=True)),
                                   RESPONSES_FRAMING, "top_logprobs", on_final=turn.save, sink=sink)
            final = sink.final
            if sink.failed or final is None:
                status = 502
                if previous is not None:
                    self.cache.pop(previous, None)
            elif final.get("status") in STORED_STATUSES:
                history = turn_input_items(turn.replayed, turn.given_input)  # as given, as stored
                self.remember(final["id"], replayed_items(history, final.get("output") or []))
        except GatewayError as exc:
            status = exc.status
            request["log"]["error_code"] = exc.code
            if previous is not None:
                self.cache.pop(previous, None)  # a failed continuation: its id is not continued again
            if not self.ws.closed:
                await self.ws.send_frame(orjson.dumps(error_message(exc)), WSMsgType.TEXT)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                entry = {"request_id": request["request_id"], "method": "WS", "path": request.path, "status": status,
                         "duration_ms": round((time.perf_counter() - started) * 1000, 2), **request["log"]}
                access_log.info(access_line(entry))
            request["request_id"], request["log"] = self.id, connection_log

    @staticmethod
    def _body(raw: str | bytes) -> dict[str, Any]:
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"We could not parse the JSON of your message: {exc}", None, "invalid_json") from None
        if not isinstance(message, dict):
            raise bad_request("A message must be a JSON object.", None, "invalid_type")
        if message.get("type") != "response.create":
            raise bad_request(f"Unknown message type {message.get('type')!r}: send 'response.create'.", "type")
        for name in _TRANSPORT_FIELDS:
            if name in message:
                raise bad_request(f"'{name}' is not used in WebSocket mode (every response streams on the socket).",
                                  name, "unsupported_parameter")
        body = dict(message)
        del body["type"]
        return body

    async def _begin(self, body: dict[str, Any], previous: str | None) -> Turn:
        cached = self.cache.get(previous) if previous is not None else None
        if cached is None:
            return await begin_turn(self.request, body)  # the store, as over HTTP
        turn = await begin_turn(self.request, {**body, "previous_response_id": None}, expand=False)
        turn.previous_response_id, turn.replayed = previous, list(cached)
        turn.history = turn.replayed
        expand_turn_compactions(self.request, body, turn)  # kept as given, expanded for the model as over HTTP
        return turn


async def responses_websocket(request: web.Request) -> web.StreamResponse:
    """`GET /v1/responses`: the WebSocket upgrade (a plain GET is 405, as before)."""
    config = request.app[STATE].config
    ws = web.WebSocketResponse(max_msg_size=config.limits.max_body_bytes, heartbeat=30.0)
    if not ws.can_prepare(request).ok:
        raise web.HTTPMethodNotAllowed("GET", ["POST"])
    await ws.prepare(request)
    connections = request.app[CONNECTIONS]
    connections.add(ws)
    connection = _Connection(request, ws)
    request["log"]["transport"] = "websocket"
    deadline = asyncio.get_running_loop().time() + config.limits.websocket_seconds
    running: asyncio.Task[None] | None = None
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await ws.receive()
            except TimeoutError:
                if running is not None:
                    await running  # the turn under way finishes first
                limit = GatewayError(400, f"This connection reached its time limit ({config.limits.websocket_seconds:g}"
                                          " s); open a new one to continue.", code="websocket_connection_limit_reached")
                await ws.send_frame(orjson.dumps(error_message(limit)), WSMsgType.TEXT)
                break
            if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                break
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue
            if request.app[STATE].draining:  # as the draining middleware answers HTTP: retry elsewhere
                going = GatewayError(503, "The gateway is shutting down; retry on another instance.",
                                     type_="server_error", code="shutting_down")
                await ws.send_frame(orjson.dumps(error_message(going)), WSMsgType.TEXT)
                break
            if running is not None and not running.done():
                busy = GatewayError(409, "A response is already in progress on this connection; send the next "
                                         "response.create after its terminal event.", code="response_in_progress")
                await ws.send_frame(orjson.dumps(error_message(busy)), WSMsgType.TEXT)
                continue
            running = asyncio.create_task(connection.turn(message.data))
    finally:
        connections.discard(ws)
        if running is not None and not running.done():
            running.cancel()  # the client left mid-turn: the stream loop drops the upstream request
            with contextlib.suppress(asyncio.CancelledError):
                await running
        request["log"]["turns"] = connection.turns
        await ws.close()
    return ws


def add_websocket_route(app: web.Application) -> None:
    app[CONNECTIONS] = set()
    app.router.add_get("/v1/responses", responses_websocket)

    async def close_all(app: web.Application) -> None:
        for ws in list(app[CONNECTIONS]):
            await ws.close(code=1001, message=b"server shutting down")

    app.on_shutdown.append(close_all)
