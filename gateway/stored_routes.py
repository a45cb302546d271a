"""Stored responses over HTTP: `previous_response_id` replay, saving, and the /v1/responses/{id} routes.

What is stored: a Response that ended `completed` or `incomplete`, when its request had `store`
(default true) and a backend is configured. A `failed` Response (upstream broke mid-stream) and a
stream the client abandoned are not: replaying half an answer would poison the next turn. The save
is queued before the client gets the final Response (body or terminal event) and committed after it
(gateway.store.writer: group commit, off the client's latency); a client can still name it as
`previous_response_id` at once, on this process (served from the queue) and on any process sharing
the store (a miss of a recent id waits for the commit). A store that fails to save is logged and
counted; the client still gets its answer.

The Response is kept as sent, logprobs included (compactly, gateway.store.codec); GET strips them
unless `include[]` asks again.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.background import ACTIVE_STATUSES, BackgroundRun, BackgroundRuns, sse_frames
from gateway.compaction import SEALER_KEY, expand_compactions
from gateway.config import Config
from gateway.errors import GatewayError, bad_request
from gateway.middleware import after_answer, bearer_token, json_response
from gateway.sse import sse_headers
from gateway.store import Item, ResponseStore, ScopedStore, caller_tag, open_store, page_items
from gateway.store.codec import LogprobList
from gateway.store.writer import is_long
from gateway.translate.fronts import FrontTranslator
from gateway.translate.input_items import replayed_items, stored_input_items, without_logprobs
from gateway.translate.request import LOGPROBS_INCLUDE
from gateway.translate.stream import ResponsesStream

log = logging.getLogger("responses_gateway.store")


@dataclass(slots=True)
class StoreHolder:
    """The app's store (None when `store.backend` is `none`), and whether each API key sees only its own."""

    store: ResponseStore | None
    per_key: bool = False


STORE_KEY = web.AppKey("response_store", StoreHolder)
BACKGROUND_KEY = web.AppKey("background_runs", BackgroundRuns)

STORED_STATUSES = frozenset({"completed", "incomplete"})


def _not_found(response_id: str) -> GatewayError:
    return GatewayError(404, f"Response with id '{response_id}' not found.")


@contextmanager
def _store_errors() -> Iterator[None]:
    """A store that fails a read (Redis down, disk error) answers 503 in OpenAI's shape, not a bare 500."""
    try:
        yield
    except GatewayError:
        raise
    except Exception:
        log.exception("response store failed")
        raise GatewayError(503, "The response store is unavailable; try again later.", type_="server_error",
                           code="store_unavailable") from None


# --- creating a response: replay before, save after -----------------------------------------------


class RecordingFront:
    """A Responses translator that remembers the final Response it produced (pure; no I/O).

    Everything but `finish`/`final` is the inner translator's own, so the wrapper follows the
    translator interface as it grows.
    """

    def __init__(self, inner: FrontTranslator) -> None:
        self.inner = inner
        self.final_response: dict[str, Any] | None = None
        self.logprob_lists: list[LogprobList] = []  # its logprobs as rendered from a batch (store.codec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        events = self.inner.finish(finish_reason, usage)
        self.final_response = events[-1]["response"]  # the terminal event carries the full Response
        self._keep_lists()
        return events

    def final(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        self.final_response = self.inner.final(finish_reason, usage)
        self._keep_lists()
        return self.final_response

    def _keep_lists(self) -> None:
        stream = getattr(self.inner, "stream", None)
        self.logprob_lists = stream.logprob_lists() if isinstance(stream, ResponsesStream) else []


@dataclass(slots=True)
class Turn:
    """One POST /v1/responses as the store sees it: what it replays, and what it will save."""

    store: ScopedStore | None
    previous_response_id: str | None
    given_input: Any  # the request's `input`, made into stored items only once validated and answered
    history: list[Item] = field(default_factory=list)  # what the model sees (compaction items expanded)
    replayed: list[Item] = field(default_factory=list)  # the same as stored (compaction items as they came)
    front: RecordingFront | None = None

    @property
    def stored(self) -> bool:
        """The Response echoes `store` as it will be honoured."""
        return self.store is not None

    def track(self, front: FrontTranslator) -> FrontTranslator:
        if self.store is None:
            return front
        self.front = RecordingFront(front)
        return self.front  # type: ignore[return-value]  # a FrontTranslator by delegation

    async def save(self, response: dict[str, Any] | None = None, events: bytes | None = None) -> None:
        """Awaited by the serving loop once the final Response exists, before it is sent (a WebSocket turn;
        an HTTP answer uses `save_after_answer`): it queues the save (the SQLite and Redis stores commit
        after the answer; see gateway.store.writer). A background
        response saves its own: `response` whatever its status (queued at first, then final), with
        `events`; only a completed or incomplete one keeps input items (only those can be continued). Those
        saves return once committed: the run shows each status only after every process over the store
        reads it (a poll elsewhere never goes back from `completed` to `in_progress`)."""
        if self.store is None:
            return
        durable = response is not None
        lists: list[LogprobList] = []
        if response is None:
            response = self.front.final_response if self.front is not None else None
            lists = self.front.logprob_lists if self.front is not None else []
            if response is None or response.get("status") not in STORED_STATUSES:
                return
        continued = response.get("status") in STORED_STATUSES
        try:
            items = turn_input_items(self.replayed, self.given_input) if continued else []
            await self.store.save(response, items, events, durable=durable, lists=lists)
        except Exception:
            log.exception("could not store response %s", response.get("id"))

    async def save_after_answer(self) -> None:
        """`save` for an HTTP answer (on_final of POST /v1/responses): the save is queued once the answer
        is written (`after_answer`), so the client's latency holds none of it (~35 us for a 100-token k=5
        Response: its input made into stored items, their keys, the queue). A request that names the new
        id still finds it: the callback runs when the request's task ends, before the loop reads a request
        that follows the answer (and a read of a recent id waits for a pending save anyway; see
        gateway.store.writer). Saved now instead, as `save` does: when the store's queue is full (the
        answer waits for room: backpressure), and a long answer (encoded at once, so that its Response is
        not held while its last frames go out; see WriteBehind.queue). Not for a WebSocket, whose task is
        the connection's: its next turn must find this one at once (`save`)."""
        front, store = self.front, self.store
        if store is None or front is None:
            return
        response, lists = front.final_response, front.logprob_lists
        if response is None or response.get("status") not in STORED_STATUSES:
            return
        if not store.has_room() or is_long(lists):
            await self.save()
            return
        # Plain values only: the Turn holds the translator, which must not outlive the handler (gateway.app._record).
        after_answer(functools.partial(_queue_save, store, response, self.replayed, self.given_input, lists))


def turn_input_items(replayed: list[Item], given_input: Any) -> list[Item]:
    """What a continued Response keeps as its input: the replayed history, then this turn's input as stored."""
    return [*replayed, *stored_input_items(given_input)]


def _queue_save(store: ScopedStore, response: dict[str, Any], replayed: list[Item], given_input: Any,
                lists: list[LogprobList]) -> None:
    try:
        store.queue(response, turn_input_items(replayed, given_input), lists=lists)
    except Exception:
        log.exception("could not store response %s", response.get("id"))


async def begin_turn(request: web.Request, body: dict[str, Any], *, expand: bool = True) -> Turn:
    """Fetch what `previous_response_id` replays (400 `previous_response_not_found` when it is gone,
    or when it belongs to another API key), replace each `item_reference` in `body["input"]` by the
    stored item it names (400 when there is none), and expand compaction items (`expand_turn_compactions`)."""
    store = _store(request)
    wanted = body.get("store") is not False  # OpenAI's default is true
    previous_id = body.get("previous_response_id")
    if isinstance(body.get("input"), list) and any(_is_reference(item) for item in body["input"]):
        body["input"] = await _resolve_references(store, body["input"])
    turn = Turn(store if wanted else None, previous_id if isinstance(previous_id, str) else None, body.get("input"))
    if turn.previous_response_id is not None:
        turn.history = turn.replayed = await _replay(store, turn.previous_response_id)
    if expand:
        expand_turn_compactions(request, body, turn)
    return turn


def expand_turn_compactions(request: web.Request, body: dict[str, Any], turn: Turn) -> None:
    """What the model sees: each `compaction` item, in the body's `input` (replaced in `body`, while
    the turn keeps the input as given, to store) and in the replayed history, as its message."""
    sealer, caller = request.app.get(SEALER_KEY), caller_of(request)
    if isinstance(body.get("input"), list):
        body["input"] = expand_compactions(sealer, caller, body["input"], "input")
    turn.history = expand_compactions(sealer, caller, turn.history, "previous_response_id")


def _is_reference(item: Any) -> bool:
    """`{"type": "item_reference", "id": ...}`, or OpenAI's short form `{"id": ...}` (no type, no role)."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        return False
    return item.get("type") == "item_reference" or ("type" not in item and "role" not in item)


async def _resolve_references(store: ScopedStore | None, given: list[Any]) -> list[Any]:
    """The input with every reference replaced by the item it names, as stored (logprobs left out), so
    the request reads as if the client had sent the item itself. References are looked up in this
    caller's responses only, as `previous_response_id` is; the request's own `store` does not matter."""
    resolved = []
    for index, item in enumerate(given):
        if not _is_reference(item):
            resolved.append(item)
            continue
        item_id = item["id"]
        if store is None:
            raise bad_request(f"input[{index}] is an item_reference to '{item_id}', but this gateway keeps no "
                              "items to refer to (store.backend is none): send the item itself.",
                              f"input[{index}]", "item_not_found")
        with _store_errors():
            found = await store.find_item(item_id)
        if found is None:
            raise bad_request(f"Item with id '{item_id}' not found (input[{index}] is an item_reference).",
                              f"input[{index}]", "item_not_found")
        resolved.extend(without_logprobs([found]))
    return resolved


async def _replay(store: ScopedStore | None, response_id: str) -> list[Item]:
    with _store_errors():
        previous = await store.get(response_id) if store is not None else None
        items = await store.input_items(response_id) if store is not None and previous is not None else None
    if previous is None or items is None:
        raise GatewayError(400, f"Previous response with id '{response_id}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
    if previous.get("status") not in STORED_STATUSES:  # a background response still running, failed, cancelled
        raise GatewayError(400, f"Previous response with id '{response_id}' is {previous.get('status')}; only a "
                                "completed or incomplete response can be continued.", param="previous_response_id",
                           code="invalid_value")
    return replayed_items(items, previous.get("output") or [])


# --- the /v1/responses/{id} routes ------------------------------------------------------------------


def _store(request: web.Request) -> ScopedStore | None:
    """The caller's view of the store: with keys in use, responses saved with one API key are invisible
    to every other (a 404, as for an unknown id). Without keys there is one caller."""
    holder = request.app[STORE_KEY]
    if holder.store is None:
        return None
    return ScopedStore(holder.store, caller_of(request) or None)


def caller_of(request: web.Request) -> str:
    """Who is asking, where API keys tell callers apart: a hash of the key; "" for the one shared caller."""
    key = bearer_token(request) if request.app[STORE_KEY].per_key else ""
    return caller_tag(key) if key else ""


def _include(request: web.Request) -> list[str]:
    # The SDK sends `include[]=...`; plain `include=...` is accepted too.
    return [*request.query.getall("include[]", []), *request.query.getall("include", [])]


def background_run(request: web.Request, store: ScopedStore | None, response_id: str) -> BackgroundRun | None:
    """The caller's background response of that id while this process runs it."""
    return None if store is None else request.app[BACKGROUND_KEY].get(store.prefix + response_id)


def _as_shown(request: web.Request, response: dict[str, Any]) -> web.Response:
    if LOGPROBS_INCLUDE not in _include(request):
        response = {**response, "output": without_logprobs(response.get("output") or [])}
    return json_response(response)


def _starting_after(request: web.Request) -> int:
    raw = request.query.get("starting_after", "-1")
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f"Invalid 'starting_after': expected an integer, got {raw!r}.", "starting_after",
                          "invalid_type") from None


async def follow_events(request: web.Request, frames: AsyncIterator[bytes]) -> web.StreamResponse:
    """An SSE response of a background response's events; the client leaving stops only this."""
    response = web.StreamResponse(headers=sse_headers(request["request_id"]))
    await response.prepare(request)
    async for chunk in frames:
        await response.write(chunk)
    await response.write_eof()
    return response


async def _stored_frames(events: list[dict[str, Any]], after: int) -> AsyncIterator[bytes]:
    rest = events[max(after + 1, 0):]
    if rest:
        yield sse_frames(rest)


async def retrieve_response(request: web.Request) -> web.StreamResponse:
    response_id = request.match_info["response_id"]
    stream = request.query.get("stream", "false").lower() == "true"
    store = _store(request)
    run = background_run(request, store, response_id)
    if run is not None:
        return await follow_events(request, run.log.follow(_starting_after(request))) if stream else \
            _as_shown(request, run.current())
    with _store_errors():
        response = await store.get(response_id) if store is not None else None
        events = await store.events(response_id) if stream and store is not None and response is not None else None
    if response is None:
        raise _not_found(response_id)
    if stream:
        after = _starting_after(request)
        if events is None and response.get("background") and response.get("status") in ACTIVE_STATUSES:
            # Running on another process (another worker or replica): its live events are there, so wait
            # for the stored ones, then replay them; a stream late, but whole.
            return await follow_events(request, _awaited_frames(request, store, response_id, after))
        if events is None:
            raise GatewayError(400, "Only responses created with background=true can be streamed back.",
                               param="stream", code="invalid_value")
        return await follow_events(request, _stored_frames(events, after))
    return _as_shown(request, response)


# How a stream of a background response running elsewhere waits for its stored events.
_AWAIT_POLL_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0)  # then every second
_KEEPALIVE_SECONDS = 15.0  # an SSE comment this often while waiting, for proxies that close idle streams


async def _awaited_frames(request: web.Request, store: ScopedStore, response_id: str, after: int
                          ) -> AsyncIterator[bytes]:
    """The stored events once the run on another process has saved them (polled; the client leaving
    stops only this). A run that stays active past the longest upstream `total` timeout (its process
    died, leaving it `queued` or `in_progress`) ends the stream with an `error` event, as does a store
    that fails a read meanwhile."""
    limit = request.app[BACKGROUND_KEY].elsewhere_wait_seconds
    loop = asyncio.get_running_loop()
    started = last_sent = loop.time()
    for attempt in itertools.count():
        await asyncio.sleep(_AWAIT_POLL_SECONDS[min(attempt, len(_AWAIT_POLL_SECONDS) - 1)])
        try:
            with _store_errors():
                response = await store.get(response_id)
                events = await store.events(response_id) if response is not None else None
        except GatewayError as exc:  # the stream has begun: the error goes in it
            yield _error_frame(exc.message, after)
            return
        if events is not None:
            async for frame in _stored_frames(events, after):
                yield frame
            return
        now = loop.time()
        if response is None or response.get("status") not in ACTIVE_STATUSES or now - started > limit:
            message = (f"Response '{response_id}' did not finish on the gateway process running it within "
                       f"{limit:.0f} s." if response is not None and response.get("status") in ACTIVE_STATUSES
                       else f"Response '{response_id}' ended without stored events.")
            yield _error_frame(message, after)
            return
        if now - last_sent >= _KEEPALIVE_SECONDS:
            last_sent = now
            yield b": waiting for the gateway process running this response\n\n"


def _error_frame(message: str, after: int) -> bytes:
    return sse_frames([{"type": "error", "code": "server_error", "message": message, "param": None,
                        "sequence_number": max(after + 1, 0)}])


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    store = _store(request)
    with _store_errors():
        deleted = store is not None and await store.delete(response_id)
    if not deleted:
        raise _not_found(response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


async def cancel_response(request: web.Request) -> web.Response:
    """Cancel a background response: its upstream request is dropped, it ends `cancelled` with the output
    it had. Cancelling one that has ended returns it as it is (as OpenAI does: idempotent)."""
    response_id = request.match_info["response_id"]
    store = _store(request)
    run = background_run(request, store, response_id)
    if run is not None:
        return _as_shown(request, await request.app[BACKGROUND_KEY].cancel(run))
    with _store_errors():
        response = await store.get(response_id) if store is not None else None
    if response is None:
        raise _not_found(response_id)
    if not response.get("background"):
        raise GatewayError(400, "Only responses created with background=true can be cancelled.",
                           param="response_id", code="invalid_value")
    if response.get("status") in ACTIVE_STATUSES:
        raise GatewayError(409, f"Response '{response_id}' is running on another gateway process (or on one that "
                                "stopped before it finished); only that process can cancel it.",
                           param="response_id", code="response_not_cancellable")
    return _as_shown(request, response)


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        raise bad_request(f"Invalid 'limit': expected an integer, got {raw!r}.", "limit", "invalid_type") from None
    if not 1 <= limit <= 100:
        raise bad_request(f"Invalid 'limit': {limit} is not between 1 and 100.", "limit")
    return limit


async def list_input_items(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    limit = _limit(request)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"Invalid 'order': {order!r} (expected 'asc' or 'desc').", "order")
    store = _store(request)
    with _store_errors():
        items = await store.input_items(response_id) if store is not None else None
    if items is None:
        raise _not_found(response_id)
    after = request.query.get("after")
    try:
        page = page_items(items, limit=limit, order=order, after=after)
    except ValueError:
        raise bad_request(f"Invalid 'after': no input item with id '{after}'.", "after") from None
    return json_response(page)


# --- wiring -----------------------------------------------------------------------------------------


def add_stored_routes(app: web.Application, config: Config, *, per_key: bool = False, counters: Any = None) -> None:
    """Routes, and the store's life cycle (a store that cannot open fails the start). `per_key`: API
    keys are checked (by the gateway or, with `forward_client_key`, by the upstream), so each key's
    responses are its own."""
    holder = StoreHolder(open_store(config, counters), per_key)
    app[STORE_KEY] = holder
    longest = max((upstream.timeouts.total for upstream in config.upstreams.values()), default=600.0)
    runs = app[BACKGROUND_KEY] = BackgroundRuns(config.limits.background_responses, longest + 30.0)
    app.router.add_get("/v1/responses/{response_id}", retrieve_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)

    async def open_(app: web.Application) -> None:
        if holder.store is not None:
            await holder.store.open()

    async def close(app: web.Application) -> None:
        if holder.store is not None:
            await holder.store.close()  # writes what is still queued first

    async def stop_runs(app: web.Application) -> None:
        await runs.stop_all()  # before the store closes: each is saved as failed

    app.on_startup.append(open_)
    app.on_shutdown.append(stop_runs)
    app.on_cleanup.append(close)
