"""The aiohttp application: routes, middlewares, and the upstream I/O around the pure core.

Every front door (responses, chat, completions) runs the same loop: validate into a Generation,
build the route's upstream call, pick a replica (retrying another before the first byte reaches
the client), then feed upstream steps to the front door's translator.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import aiohttp
import orjson
from aiohttp import web

from gateway.canonical.generation import Generation
from gateway.canonical.step import Step, UpstreamFormatError
from gateway.compact_route import add_compact_route
from gateway.compaction import add_sealer
from gateway.config import Config, Timeouts
from gateway.errors import GatewayError, bad_request, upstream_error, upstream_timeout
from gateway.logprobs.align import AlignmentError
from gateway.logprobs.parse import ParseOptions
from gateway.loop_lag import LoopLag
from gateway.memory import (
    DEFAULT_READ_BUFSIZE,
    LONG_STREAM_READ_BUFSIZE,
    configured_read_bufsize,
    is_long_stream,
    long_stream_receive_buffer,
    receive_buffer_socket_factory,
)
from gateway.metrics import Metrics, ReportCounters
from gateway.middleware import (
    REQUEST_ID_HEADER,
    after_answer,
    auth_middleware_factory,
    draining_middleware_factory,
    error_middleware_factory,
    json_response,
    load_api_keys,
    request_context,
)
from gateway.playground import add_playground
from gateway.replicas import NoReplicaAvailable, Replica, probe_forever, retry_after_header
from gateway.routing import Route, build_routes
from gateway.sse import data_batches, encode_events, encode_pieces, split_events, sse_headers
from gateway.stored_routes import BACKGROUND_KEY, Turn, add_stored_routes, begin_turn, follow_events
from gateway.translate.front_doors import (
    generation_from_chat,
    generation_from_completions,
    generation_from_responses,
    responses_settings,
)
from gateway.translate.fronts import ChatFront, CompletionsFront, FrontTranslator, ResponsesFront
from gateway.translate.grouping import TextMismatch
from gateway.upstream_bodies import MAX_ERROR_BODY_BYTES, UpstreamBodyTooLarge, read_whole
from gateway.upstreams.base import UpstreamCall, step_of_fields
from gateway.upstreams.dispatch import bytes_precision
from gateway.upstreams.verdicts import UpstreamFault, UpstreamRejected, client_error, read_fault

log = logging.getLogger("responses_gateway")


@dataclass
class GatewayState:
    """Everything the handlers share: config, routes, the client session, metrics, lifecycle."""

    config: Config
    routes: dict[str, Route]
    metrics: Metrics = field(default_factory=Metrics)
    session: aiohttp.ClientSession | None = None
    long_stream_session: aiohttp.ClientSession | None = None  # its own pool: small receive windows (gateway.memory)
    read_bufsize: int | None = None  # RESPONSES_GATEWAY_UPSTREAM_READ_BUFSIZE if set: one size for all
    draining: bool = False
    in_flight: int = 0
    started_at: int = field(default_factory=lambda: int(time.time()))
    probes: list[asyncio.Task] = field(default_factory=list)
    health_checks: list[asyncio.Task] = field(default_factory=list)  # per replica set (start_probes)
    loop_lag: LoopLag = field(default_factory=LoopLag)  # a timeout while the loop was stalled is ours
    stream_endings: set[asyncio.Task] = field(default_factory=set)  # finished streams' bodies read to their end


STATE = web.AppKey("gateway_state", GatewayState)


# --- front doors -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Framing:
    """How a front door writes its stream: Responses events, or `data:` chunks ending in [DONE]."""

    named_events: bool

    def encode(self, items: list[dict[str, Any] | bytes]) -> bytes:
        """The frames of `items`; an item already written as its frame (bytes) is copied as it is."""
        if self.named_events:
            return encode_events(items)
        parts: list[bytes] = []
        dumps = orjson.dumps
        for item in items:
            if type(item) is bytes:
                parts.append(item)
            else:
                parts += (b"data: ", dumps(item), b"\n\n")
        return b"".join(parts)  # one copy of all the frames

    def pieces(self, items: list[dict[str, Any] | bytes]) -> list[bytes]:
        """`encode(items)` in pieces (sse.encode_pieces: a long logprob list the frames repeat is one
        piece they share); the last piece is always a small one."""
        return encode_pieces(items) if self.named_events else [self.encode(items)]

    def end(self) -> bytes:
        return b"" if self.named_events else b"data: [DONE]\n\n"


RESPONSES_FRAMING = _Framing(named_events=True)
OPENAI_CHUNK_FRAMING = _Framing(named_events=False)


async def _read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", None, "invalid_type")
    if request.app[STATE].config.logging.log_bodies:
        request["log"]["body"] = body  # explicitly asked for: bodies hold prompts
    return body


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    return bool(options.get("include_usage"))


DROPPED_TOOLS_HEADER = "X-Dropped-Hosted-Tools"


async def create_response(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    turn = await begin_turn(request, body)  # previous_response_id's history, from the store
    if body.get("background") is True:
        return await _create_background(request, body, turn)
    gen = _responses_generation(request, body, turn)
    settings = responses_settings(body, gen, store=turn.stored, previous_response_id=turn.previous_response_id)
    def front(route: Route) -> FrontTranslator:
        # Events are only serialized here: logprobs go out as JSON written once (no entry dicts), and a
        # non-streamed Response skips the delta events nobody would see.
        return turn.track(ResponsesFront(settings, route.vocab, serialized=True, deltas=gen.stream))

    return await _serve(request, "responses", gen, front, RESPONSES_FRAMING, "top_logprobs",
                        on_final=turn.save_after_answer)


async def _create_background(request: web.Request, body: dict[str, Any], turn: Turn) -> web.StreamResponse:
    """Answer at once (`queued`, or the stream of its events) and run the response in a task, on the same
    loop as any stream, into an event log; see gateway.background."""
    if turn.store is None:
        raise bad_request("Background responses must be stored: they need store=true and a configured response "
                          "store.", "background")
    runs = request.app[BACKGROUND_KEY]
    runs.admit()
    gen = _responses_generation(request, {**body, "stream": True}, turn)  # the log keeps every event
    settings = responses_settings(body, gen, store=True, previous_response_id=turn.previous_response_id,
                                  background=True)
    route = _route(request.app[STATE], gen.model)
    front = ResponsesFront(settings, route.vocab, serialized=True)
    queued = front.stream.snapshot("queued")
    await turn.save(queued)  # any replica over the store can poll it from now on

    async def serve(sink: EventSink) -> None:
        await serve_generation(request, "responses", gen, lambda _: front, RESPONSES_FRAMING, "top_logprobs",
                               sink=sink)

    run = runs.start(turn.store.prefix + queued["id"], front.stream, serve, turn.save)
    request["log"]["background"] = queued["id"]
    if body.get("stream") is True:
        return await follow_events(request, run.log.follow(-1))
    return json_response(queued)


def _responses_generation(request: web.Request, body: dict[str, Any], turn: Turn) -> Generation:
    """The validated Generation, under its model's policy for hosted tools (reported when any is dropped)."""
    state = request.app[STATE]
    known = state.routes.get(body.get("model")) if isinstance(body.get("model"), str) else None
    gen = generation_from_responses(body, turn.history, known.hosted_tools if known else "drop")
    if gen.tool_set.dropped:
        _report_dropped(request, state, gen)
    return gen


def _report_dropped(request: web.Request, state: GatewayState, gen: Generation) -> None:
    """Hosted tools the upstream was not offered: counted, in the access log, and in a response header."""
    dropped = list(dict.fromkeys(gen.tool_set.dropped))
    for tool in gen.tool_set.dropped:
        state.metrics.hosted_dropped.labels(gen.model, tool).inc()
    request["log"]["hosted_tools_dropped"] = dropped
    request[_DROPPED_KEY] = ",".join(dropped)


_DROPPED_KEY = web.RequestKey("hosted_tools_dropped", str)


async def _dropped_tools_header(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every answer to a request that dropped hosted tools names them (a streamed
    answer too, before its headers go out), errors included."""
    dropped = request.get(_DROPPED_KEY)
    if dropped:
        response.headers[DROPPED_TOOLS_HEADER] = dropped


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    gen = generation_from_chat(body)
    usage = _include_usage(body)
    return await _serve(request, "chat", gen, lambda route: ChatFront(gen, usage, route.vocab, serialized=True),
                        OPENAI_CHUNK_FRAMING, "top_logprobs")


async def create_completion(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    gen = generation_from_completions(body)
    usage = _include_usage(body)
    return await _serve(request, "completions", gen, lambda route: CompletionsFront(gen, usage, route.vocab),
                        OPENAI_CHUNK_FRAMING, "logprobs")


# --- the serving loop ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Exchange:
    """One request's bookkeeping: labels for metrics and the access log."""

    route: Route
    front_door: str
    stream: bool
    reports: ReportCounters  # the route's translation counters, resolved once per request
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    sent_tokens: int = 0  # output tokens written to the client so far (streams)
    step_usage: dict[str, Any] | None = None
    # Awaited once the final output exists, before the client gets it (the response store queues its save
    # here, or, for an HTTP answer, has it queued once the answer is written: Turn.save_after_answer).
    on_final: Callable[[], Awaitable[None]] | None = None
    long_stream: bool = False  # the upstream stream may run long: it goes through state.long_stream_session

    def labels(self) -> tuple[str, str, str, str]:
        return (self.route.model, self.route.upstream_name, self.front_door, "true" if self.stream else "false")


def _route(state: GatewayState, model: str) -> Route:
    route = state.routes.get(model)
    if route is None:
        raise GatewayError(404, f"The model `{model}` does not exist or you do not have access to it.",
                           code="model_not_found")
    return route


async def _serve(request: web.Request, front_door: str, gen: Generation,
                 make_front: Callable[[Route], FrontTranslator], framing: _Framing, k_param: str,
                 on_final: Callable[[], Awaitable[None]] | None = None) -> web.StreamResponse:
    """Serve `gen` over HTTP: a JSON body, or an SSE stream."""
    response = await serve_generation(request, front_door, gen, make_front, framing, k_param, on_final)
    assert response is not None
    return response


async def serve_generation(request: web.Request, front_door: str, gen: Generation,
                           make_front: Callable[[Route], FrontTranslator], framing: _Framing, k_param: str,
                           on_final: Callable[[], Awaitable[None]] | None = None,
                           sink: EventSink | None = None) -> web.StreamResponse | None:
    """Serve `gen` on the route's replicas. A stream goes to `sink` when one is given (then nothing is
    returned), else to an SSE response."""
    state = request.app[STATE]
    route = _route(state, gen.model)
    try:
        call = route.upstream_call(gen, k_param)
    except GatewayError as exc:
        if exc.code == "unsupported_parameter":
            state.metrics.refused.labels(route.model, front_door, exc.param or "").inc()
        raise
    metrics = state.metrics
    long_stream = gen.stream and is_long_stream(gen.max_tokens, state.read_bufsize)
    exchange = _Exchange(route, front_door, gen.stream, metrics.report_counters(route.model, route.upstream_name),
                         on_final=on_final, long_stream=long_stream)
    request["log"].update(model=route.model, upstream=route.upstream_name, stream=gen.stream)
    in_flight = metrics.child(metrics.in_flight, front_door)
    in_flight.inc()
    state.in_flight += 1
    status = "error"
    try:
        response = await _serve_on_replicas(request, state, exchange, call, make_front(route), framing, sink)
        status = "200" if response is None else str(response.status)
        return response
    except GatewayError as exc:
        status = str(exc.status)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        status = "499"  # the client went away (nginx's "client closed request")
        raise
    finally:
        state.in_flight -= 1
        in_flight.dec()
        _record(state, exchange, status, request)


def _record(state: GatewayState, exchange: _Exchange, status: str, request: web.Request) -> None:
    """The request's figures, taken now: into the access log at once, into the metrics once the answer is
    written (`after_answer`)."""
    now = time.perf_counter()
    elapsed = now - exchange.started
    ttft = per_token = None
    if exchange.first_token_at is not None:
        ttft = exchange.first_token_at - exchange.started
        request["log"]["ttft_ms"] = round(ttft * 1000, 2)
    usage = exchange.step_usage or {}
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    if exchange.sent_tokens > completion:  # a stream cut short: what reached the client
        completion = exchange.sent_tokens
    if exchange.first_token_at is not None and completion > 1:
        per_token = (now - exchange.first_token_at) / (completion - 1)
    request["log"].update(input_tokens=prompt, output_tokens=completion)
    # Plain values only: a closure over `exchange` would keep the whole translator (a long stream's final
    # logprobs) alive until the answer's last byte is written (bench.memory: 256 streams peaked 60 MB higher).
    metrics, labels = state.metrics, exchange.labels()
    after_answer(lambda: _observe(metrics, labels, status, elapsed, ttft, per_token, prompt, completion))


def _observe(metrics: Metrics, labels: tuple[str, str, str, str], status: str, elapsed: float,
             ttft: float | None, per_token: float | None, prompt: int, completion: int) -> None:
    child = metrics.child
    child(metrics.requests, *labels, status).inc()
    child(metrics.duration, *labels).observe(elapsed)
    if ttft is not None:
        child(metrics.ttft, *labels).observe(ttft)
    model, upstream = labels[0], labels[1]
    if prompt:
        child(metrics.tokens, model, upstream, "in").inc(prompt)
    if completion:
        child(metrics.tokens, model, upstream, "out").inc(completion)
    if per_token is not None:
        child(metrics.per_token, model, upstream).observe(per_token)


class _Retryable(Exception):
    """An upstream fault before any byte reached the client: another replica may serve it.

    `counts`: a gateway-side fault of the replica (refused, no first byte in time, 5xx, malformed
    body) that counts toward ejecting it; a 429 is retried elsewhere but counts against nothing.
    `started`/`budget`: for a timeout, when the wait began and how long it was allowed."""

    def __init__(self, error: GatewayError, kind: str, *, counts: bool = True, started: float | None = None,
                 budget: float = 0.0) -> None:
        super().__init__(error.message)
        self.error = error
        self.kind = kind
        self.counts = counts
        self.started = started
        self.budget = budget


async def _serve_on_replicas(request: web.Request, state: GatewayState, exchange: _Exchange, call: UpstreamCall,
                             front: FrontTranslator, framing: _Framing, sink: EventSink | None
                             ) -> web.StreamResponse | None:
    route = exchange.route
    replicas = route.replicas
    tried: set[str] = set()
    last: _Retryable | None = None
    options = route.parse_options()
    for _ in range(route.upstream.retries + 1):
        try:
            replica = replicas.choose(exclude=tried)
        except NoReplicaAvailable as exc:
            if last is not None:
                break
            raise GatewayError(503, f"No replica of upstream {route.upstream_name!r} is available: every one fails "
                                    "its health check.", type_="server_error", code="upstream_unavailable",
                               headers={"Retry-After": retry_after_header(exc.retry_after)}) from None
        tried.add(replica.url)
        with replicas.in_flight(replica):
            try:
                upstream, batches = await _open_upstream(request, state, exchange, replica, call)
                if not exchange.stream:
                    return await _complete(state, exchange, replica, upstream, call, front, options)
            except _Retryable as exc:
                _replica_fault(state, route, replica, exc.kind, counts=exc.counts, started=exc.started,
                               budget=exc.budget)
                last = exc
                continue
            if sink is not None:
                await _stream(request, state, exchange, replica, upstream, batches, call, front, sink, options)
                return None
            sse = SSESink(request, framing)
            await _stream(request, state, exchange, replica, upstream, batches, call, front, sse, options)
            return sse.response
    assert last is not None
    raise last.error


def _replica_fault(state: GatewayState, route: Route, replica: Replica, kind: str, *, counts: bool = True,
                   started: float | None = None, budget: float = 0.0) -> None:
    """Count a fault against the replica, unless it was none of its own: a 429, or a timeout while
    the gateway's own loop was stalled for half the wait (`started`, `budget`: the wait's)."""
    state.metrics.upstream_errors.labels(route.upstream_name, replica.url, kind).inc()
    if not counts:
        return
    if started is not None and state.loop_lag.excuses(started, budget):
        stalled = round(state.loop_lag.stalled_since(started), 3)
        log.warning(orjson.dumps({"event": "timeout_excused", "upstream": route.upstream_name, "replica": replica.url,
                                  "kind": kind, "budget_s": budget, "loop_stalled_s": stalled}).decode())
        return
    if route.replicas.failed(replica, kind):
        state.metrics.ejections.labels(route.upstream_name, replica.url, kind).inc()


def _upstream_headers(request: web.Request, route: Route, config: Config) -> dict[str, str]:
    """Only what we choose goes upstream: the request id, the upstream's own credential, and an
    explicit allow-list; the client's key only when configured."""
    headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: request["request_id"]}
    for name in route.upstream.forward_headers:
        if name in request.headers and name.lower() != "authorization":
            headers[name] = request.headers[name]
    if _own_credential(route):
        headers["Authorization"] = f"Bearer {os.environ[route.upstream.api_key_env or '']}"
    elif config.auth.forward_client_key and "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]
    return headers


def _own_credential(route: Route) -> bool:
    return bool(route.upstream.api_key_env and os.environ.get(route.upstream.api_key_env))


Batches = AsyncIterator[list[bytes]]


@functools.lru_cache(maxsize=64)
def _client_timeout(timeouts: Timeouts) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for an upstream's, made once (the config's are frozen, so each is a key)."""
    return aiohttp.ClientTimeout(total=timeouts.total, connect=timeouts.connect, sock_read=timeouts.idle)


async def _open_upstream(request: web.Request, state: GatewayState, exchange: _Exchange, replica: Replica,
                         call: UpstreamCall) -> tuple[aiohttp.ClientResponse, Batches | None]:
    """POST upstream and wait for its headers (and, streaming, its first events). Faults here are
    retryable (nothing was sent yet); the upstream's verdict on the request is raised as it is."""
    session = state.long_stream_session if exchange.long_stream else state.session
    assert session is not None
    route = exchange.route
    timeouts = route.upstream.timeouts
    timeout = _client_timeout(timeouts)
    started = time.perf_counter()
    waiting_since = time.monotonic()
    deadline = asyncio.get_running_loop().time() + timeouts.first_token  # for headers and first events
    name = route.upstream_name
    batches: Batches | None = None
    try:
        async with asyncio.timeout_at(deadline):
            headers = _upstream_headers(request, route, state.config)
            response = await session.post(replica.url + call.path, data=orjson.dumps(call.body),
                                          timeout=timeout, headers=headers)
            if response.status < 400 and exchange.stream:
                batches = await _first_events(exchange, replica, response, deadline)
    except aiohttp.ConnectionTimeoutError:  # (a TimeoutError too) the gateway's own connect budget
        raise _Retryable(upstream_timeout(f"upstream {name!r} did not accept a connection within "
                                          f"{timeouts.connect:g}s"), "connect_timeout", started=waiting_since,
                         budget=timeouts.connect) from None
    except TimeoutError:
        raise _Retryable(upstream_timeout(f"upstream {name!r} did not answer within {timeouts.first_token:g}s"),
                         "timeout", started=waiting_since, budget=timeouts.first_token) from None
    except aiohttp.ClientError as exc:
        raise _Retryable(upstream_error(f"upstream {name!r} is unreachable: {type(exc).__name__}"),
                         "connect") from None
    # Observed now, not after the answer: a stream's answer may take minutes, and dashboards want this figure.
    metrics = state.metrics
    metrics.child(metrics.upstream_latency, name, replica.url).observe(time.perf_counter() - started)
    if response.status >= 400:
        await _refused(state, exchange, replica, response)
    return response, batches


async def _refused(state: GatewayState, exchange: _Exchange, replica: Replica,
                   response: aiohttp.ClientResponse) -> NoReturn:
    """An upstream's error answer -> the client's error (retried elsewhere for a 5xx or a 429)."""
    route = exchange.route
    try:
        body = orjson.loads(await read_whole(response, MAX_ERROR_BODY_BYTES))
    except (aiohttp.ClientError, ValueError, TimeoutError, UpstreamBodyTooLarge):
        body = None  # judged by its status alone
    finally:
        response.release()
    status = response.status
    fault = read_fault(body, status)
    error = client_error(fault, route.upstream_name, exchange.front_door,
                         forwarded_client_key=state.config.auth.forward_client_key and not _own_credential(route),
                         retry_after=response.headers.get("Retry-After"))
    kind = f"http_{status}"
    if status >= 500 or status == 408:
        raise _Retryable(error, kind)
    if status == 429:
        raise _Retryable(error, kind, counts=False)  # another replica may have room
    state.metrics.upstream_errors.labels(route.upstream_name, replica.url, kind).inc()
    if fault.request_fault:
        route.replicas.succeeded(replica)  # it is serving: it judged the request
    raise error


# How long a stream's headers wait for the upstream's first event. An engine refuses an invalid
# request within milliseconds (vLLM's in-band error frame), so the client then gets a plain 4xx;
# a long prefill does not keep the client without headers (it learns at once the stream began).
_FIRST_EVENT_HOLD_SECONDS = 0.25


async def _first_events(exchange: _Exchange, replica: Replica, response: aiohttp.ClientResponse,
                        deadline: float) -> Batches:
    """Wait briefly for a stream's first events before the client is answered: an in-band error
    frame there (vLLM's 200 + `data: {"error": ...}`) becomes a plain error status, and a stream
    that ends before any event is a malformed answer another replica may serve."""
    batches = data_batches(response.content)
    pending = asyncio.ensure_future(anext(batches))
    pending.add_done_callback(_retrieved)  # its error is read by whoever awaits it; none may, if the client left
    await asyncio.wait((pending,), timeout=_FIRST_EVENT_HOLD_SECONDS)
    if not pending.done():
        return _chain(pending, batches, deadline)  # slow to start: the stream loop takes it from here
    try:
        first = pending.result()
    except StopAsyncIteration:
        response.release()
        raise _Retryable(upstream_error(f"upstream {exchange.route.upstream_name!r} ended the stream before any "
                                        "event"), "malformed") from None
    except UpstreamFormatError as exc:  # (sse.data_batches: no event ended within its bound)
        response.close()
        raise _Retryable(upstream_error(f"upstream {exchange.route.upstream_name!r} sent a broken stream: {exc}"),
                         "malformed") from None
    for data in first:
        if data.find(b'"error"') >= 0:  # (not `in`: for bytes it builds and drops a TypeError first, per event)
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                break  # left to the stream loop, which reports it
            if isinstance(payload, dict) and "error" in payload and not payload.get("choices"):
                response.release()
                _in_band_verdict(exchange, replica, read_fault(payload, 200))
    return _chain(pending, batches, deadline)


def _in_band_verdict(exchange: _Exchange, replica: Replica, fault: UpstreamFault) -> NoReturn:
    route = exchange.route
    error = client_error(fault, route.upstream_name, exchange.front_door)
    if fault.request_fault:
        route.replicas.succeeded(replica)
        raise error
    raise _Retryable(error, f"in_band_{fault.status}", counts=fault.status != 429)


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def _chain(first: asyncio.Future[list[bytes]], rest: Batches, deadline: float) -> Batches:
    """The first events (still bound by the first-token deadline, a loop time), then the rest."""
    try:
        async with asyncio.timeout_at(deadline):
            batch = await first
        yield batch
    except StopAsyncIteration:
        return
    finally:
        first.cancel()  # the client went away while it was still pending
    async for batch in rest:
        yield batch


def _account(exchange: _Exchange, step: Step) -> None:
    if step.usage:
        exchange.step_usage = step.usage
    if step.report is not None:
        exchange.reports.count(step.report)


async def _complete(state: GatewayState, exchange: _Exchange, replica: Replica, upstream: aiohttp.ClientResponse,
                    call: UpstreamCall, front: FrontTranslator, options: ParseOptions) -> web.Response:
    """A whole answer. Until it is parsed nothing was sent, so a broken one is retried elsewhere."""
    route = exchange.route
    name = route.upstream_name
    reading_since = time.monotonic()
    try:
        async with upstream:
            raw = await read_whole(upstream, state.config.limits.max_upstream_body_bytes)
        data = [call.load(event, options) for event in split_events(raw)] if call.streamed_whole else call.load(
            raw, options)
        step = call.parse(data, options, streaming=False)
    except TimeoutError:
        raise _Retryable(upstream_timeout(f"upstream {name!r} timed out"), "timeout", started=reading_since,
                         budget=route.upstream.timeouts.idle) from None
    except UpstreamRejected as exc:  # an error object in a 200 answer: the upstream's verdict
        _in_band_verdict(exchange, replica, exc.fault)
    except (aiohttp.ClientError, orjson.JSONDecodeError, UpstreamFormatError) as exc:
        raise _Retryable(upstream_error(f"upstream {name!r} sent a broken response: {exc}"), "malformed") from None
    except AlignmentError as exc:  # the answer is whole; its logprobs do not fit the model's tokenizer
        raise upstream_error(f"upstream {name!r} sent unusable logprobs: {exc}") from None
    except UpstreamBodyTooLarge as exc:  # another replica would send the same answer: not retried
        raise upstream_error(f"upstream {name!r} sent a response too large to read: {exc} "
                             f"(limits.max_upstream_body_bytes)") from None
    route.replicas.succeeded(replica)
    _account(exchange, step)
    exchange.first_token_at = time.perf_counter()
    front.start()
    if step.prompt_text is not None:
        front.echo(step.prompt_text, step.prompt_tokens or [])
    front.feed_step(step)
    body = front.final(step.finish_reason, step.usage)
    if exchange.on_final is not None:
        await exchange.on_final()
    return json_response(body)


async def _stream(request: web.Request, state: GatewayState, exchange: _Exchange, replica: Replica,
                  upstream: aiohttp.ClientResponse, batches: Batches | None, call: UpstreamCall,
                  front: FrontTranslator, sink: EventSink, options: ParseOptions) -> None:
    route = exchange.route
    name = route.upstream_name
    finished = False
    try:
        await sink.begin(front.start())
        send = sink.send
        finish_reason: str | None = None
        failed = False
        # Everything made from one network read goes out in one write. `items` holds what is not
        # written yet, so a failure partway through a read still sends the events before it.
        items: list[dict[str, Any] | bytes] = []
        read, feed, reports = call.stream_reader(options, front.takes_token_batches), front.feed_step, exchange.reports
        # The usual chunk (text and a TokenBatch, nothing else) straight to its frame, where the front door
        # writes frames and the call reads chunks as their parts: no Step, no event dict.
        frame_of = front.frame_writer()
        fields_of = call.fields_reader(options) if frame_of is not None else None
        add_from_ids = reports.add_from_ids  # (a frame's tokens were all read from their ids)
        # What parsing repaired reaches the counters at most a second late (and all of it at the end).
        flush_at = read_at = time.monotonic()
        flush_at += _REPORT_FLUSH_SECONDS
        unsent = 0  # output tokens in `items`: counted as sent once written (the access log's on a disconnect)
        try:
            async for batch in batches or data_batches(upstream.content):
                for data in batch:
                    if fields_of is not None and (fields := fields_of(data)) is not None:
                        if fields[2] is None and (frame := frame_of(fields[0], fields[1])) is not None:
                            count = len(fields[1])
                            unsent += count
                            add_from_ids(count)
                            if frame:  # (empty: its token waits for the rest of its character)
                                items.append(frame)
                                if exchange.first_token_at is None:
                                    exchange.first_token_at = time.perf_counter()
                            continue
                        step = step_of_fields(fields)
                    else:
                        step = read(data)
                    unsent += len(step.tokens) + len(step.reasoning_tokens)
                    if step.usage:
                        exchange.step_usage = step.usage
                    if step.report is not None:
                        reports.add(step.report)
                    made = feed(step)
                    if made:
                        if exchange.first_token_at is None:
                            exchange.first_token_at = time.perf_counter()
                        items += made
                    finish_reason = step.finish_reason or finish_reason
                read_at = time.monotonic()
                if read_at >= flush_at:
                    reports.flush()
                    flush_at = read_at + _REPORT_FLUSH_SECONDS
                if items:
                    await send(items)
                    items = []
                    exchange.sent_tokens += unsent
                    unsent = 0
            if finish_reason is None:
                raise UpstreamFormatError("upstream stream ended without a finish_reason")
            items = front.finish(finish_reason, exchange.step_usage)
            route.replicas.succeeded(replica)
            if exchange.on_final is not None:
                await exchange.on_final()
        except TimeoutError:
            failed = True
            items = items + front.fail(f"upstream {name!r} stopped sending (idle timeout)")
            _stream_failed(request, "idle_timeout")
            _replica_fault(state, route, replica, "idle_timeout", started=read_at, budget=route.upstream.timeouts.idle)
        except UpstreamRejected as exc:  # an in-band error frame after the stream began
            failed = True
            error = client_error(exc.fault, name, exchange.front_door)
            items = items + front.fail(error.message, error)
            kind = f"in_band_{exc.fault.status}"
            _stream_failed(request, kind, error.code)
            if exc.fault.request_fault:
                route.replicas.succeeded(replica)  # its verdict on this request: no host failure
                state.metrics.upstream_errors.labels(name, replica.url, kind).inc()
            else:
                _replica_fault(state, route, replica, kind, counts=exc.fault.status != 429)
        except (aiohttp.ClientError, orjson.JSONDecodeError, UpstreamFormatError) as exc:
            failed = True
            items = items + front.fail(f"upstream {name!r} failed mid-stream: {exc}")
            _stream_failed(request, "mid_stream")
            _replica_fault(state, route, replica, "mid_stream")
        except (AlignmentError, TextMismatch) as exc:  # the logprobs do not fit the tokenizer: no host failure
            failed = True
            items = items + front.fail(f"upstream {name!r} sent unusable logprobs: {exc}")
            _stream_failed(request, "unusable_logprobs")
        await sink.end(items, failed)
        exchange.sent_tokens += unsent
        finished = True
    finally:
        exchange.reports.flush()
        if not finished:
            # The client went away: drop the upstream connection so the server stops generating.
            upstream.close()
            request["log"]["client_disconnected"] = True
            upstream.release()
    if failed or upstream.content.at_eof():
        upstream.release()
    else:  # (the request's figures and the client's next request do not wait for it)
        ending = asyncio.create_task(_read_to_end(upstream))
        state.stream_endings.add(ending)
        ending.add_done_callback(state.stream_endings.discard)


_REPORT_FLUSH_SECONDS = 1.0

# After a stream's `[DONE]` comes the end of its chunked body. When it arrives in a later network read (the
# bench's replay upstream sends it a loop turn later; real vLLM's came in time at c=1, measured), reading it
# lets the connection serve the next request; left unread, aiohttp closes the connection and the next
# stream connects anew (and, to an https upstream, handshakes).
_END_WAIT_SECONDS = 0.1
_END_MAX_BYTES = 64 * 1024


async def _read_to_end(upstream: aiohttp.ClientResponse) -> None:
    """Read what is left of a finished stream's body (its end), so that its connection goes back to the
    pool; if more comes than an ending, or it takes longer than a moment, the connection is closed instead."""
    content = upstream.content
    left = _END_MAX_BYTES
    try:
        async with asyncio.timeout(_END_WAIT_SECONDS):
            while not content.at_eof() and left >= 0:
                data = await content.readany()
                if not data:
                    break
                left -= len(data)
    except (TimeoutError, aiohttp.ClientError):
        pass
    finally:
        if not content.at_eof():
            upstream.close()
        upstream.release()


def _stream_failed(request: web.Request, reason: str, code: str | None = None) -> None:
    """The access line of a stream that began (HTTP 200) and then failed says so, and why."""
    request["log"].update(outcome="failed", failure=reason, **({"error_code": code} if code else {}))


class EventSink(Protocol):
    """Where the stream loop puts a stream's events: `begin` with the first ones, `send` what one
    network read made (never empty), `end` with the last ones (`failed`: the stream ended in an
    in-stream error). An SSE response, a WebSocket, or a background response's event log.

    A sink whose client went away raises ClientGone (never aiohttp's ClientError, which the loop
    would take for the upstream's fault).

    `send` and `end` also take events already written as their frames (bytes: the front door's
    `frame_writer`, in its framing)."""

    async def begin(self, items: list[dict[str, Any]]) -> None: ...
    async def send(self, items: list[dict[str, Any] | bytes]) -> None: ...
    async def end(self, items: list[dict[str, Any] | bytes], failed: bool) -> None: ...


class ClientGone(ConnectionResetError):
    """Writing to the client failed: it went away. Not an upstream fault (aiohttp's own reset
    error is a ClientError, which the stream loop would take for the upstream's)."""


class _EventStreamResponse(web.StreamResponse):
    """A StreamResponse whose headers wait for the first body write (sent with it, one syscall).

    Only for a stream that writes its first events right after `prepare`: the client sees no delay.
    """

    _send_headers_immediately = False


_SLICE = 64 * 1024  # aiohttp's write copies what it is given (chunk header joined): at most this much


class SSESink:
    """The HTTP stream: `text/event-stream` frames, one write per network read."""

    __slots__ = ("framing", "request", "response")

    def __init__(self, request: web.Request, framing: _Framing) -> None:
        self.request = request
        self.framing = framing
        self.response: web.StreamResponse | None = None

    async def begin(self, items: list[dict[str, Any]]) -> None:
        # With events to send at once, the headers go out with them, in one write; else straight away.
        response = (_EventStreamResponse if items else web.StreamResponse)(
            headers=sse_headers(self.request["request_id"]))
        self.response = response
        await response.prepare(self.request)
        if items:
            await self._write(self.framing.encode(items))

    async def send(self, items: list[dict[str, Any] | bytes]) -> None:
        await self._write(self.framing.encode(items))

    async def end(self, items: list[dict[str, Any] | bytes], failed: bool) -> None:
        assert self.response is not None
        *body, tail = self.framing.pieces(items) if items else [b""]
        # A long message's closing frames repeat its logprob list (~0.4 MB at 1,000 tokens, k=5) four
        # times: each copy goes out as the one shared piece, a slice at a time, each write waiting
        # while the client is behind (aiohttp drains past 64 KB), so a stream's ending holds the list
        # once and at most a slice or two more, however slowly its client reads. No lock or turn is
        # shared between streams: a client that stops reading holds up only its own stream.
        for piece in body:
            if len(piece) <= _SLICE:
                await self._write(piece)
                continue
            view = memoryview(piece)
            for start in range(0, len(piece), _SLICE):
                await self._write(view[start:start + _SLICE])
        # The last events, the end marker and the chunked-encoding terminator: one write (all of a
        # short stream's ending).
        await self.response.write_eof(tail if failed else tail + self.framing.end())

    async def _write(self, data: bytes | memoryview) -> None:
        assert self.response is not None
        try:
            await self.response.write(data)
        except ConnectionResetError:
            raise ClientGone("the client closed the connection") from None


# --- discovery, probes, metrics --------------------------------------------------------------------


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    data = [{"id": name, "object": "model", "created": state.started_at, "owned_by": route.upstream_name}
            for name, route in state.routes.items()]
    return json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready: config loaded, not draining, and every model has a replica a request could try (the
    same state the router uses: with active checks, one that passed; ejection does not count, as
    the router tries ejected replicas when none is healthy). The body shows each replica's state."""
    state = request.app[STATE]
    unready = sorted({name for name, route in state.routes.items()
                      if not route.replicas.ready(probed=route.upstream.health_interval > 0)})
    upstreams = {route.upstream_name: route.replicas.state() for route in state.routes.values()}
    if state.draining or unready:
        return json_response({"status": "draining" if state.draining else "unready", "models_without_replica":
                              unready, "upstreams": upstreams}, 503)
    return json_response({"status": "ready", "upstreams": upstreams})


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


# --- lifecycle -------------------------------------------------------------------------------------


# The cyclic collector's first generation runs every 700 net container allocations by default:
# several times per request, each pass walking the request's (acyclic) parse and render objects
# that reference counting frees moments later anyway. A request's objects now come and go
# between passes; real cycles are still collected, only after more allocations.
_GC_GEN0_THRESHOLD = 20_000


def _tune_gc() -> None:
    gen0, gen1, gen2 = gc.get_threshold()
    if 0 < gen0 < _GC_GEN0_THRESHOLD:  # 0: the collector is off; leave it so
        gc.set_threshold(_GC_GEN0_THRESHOLD, gen1, gen2)


async def _on_startup(app: web.Application) -> None:
    _tune_gc()
    state = app[STATE]
    # How much of each upstream response is read ahead of the translator (memory vs. throughput).
    state.read_bufsize = configured_read_bufsize(os.environ)
    # Every client's requests share these sessions: a cookie one upstream answer set (a sticky load balancer's,
    # a session's) must not ride along on other clients' requests, so none is kept.
    # No cap on connections (per host either): a request in flight holds one (a stream for as long as it
    # runs), so a cap made the request past it wait for another to end, and that wait counted as the
    # upstream's connect timeout (a 504 and a fault against a replica that refused nothing; at 300 at once
    # under the old 256, 44 failed: tests/test_upstream_pool.py). Idle ones are kept and reused as before.
    state.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                                          read_bufsize=state.read_bufsize or DEFAULT_READ_BUFSIZE,
                                          cookie_jar=aiohttp.DummyCookieJar())
    state.long_stream_session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, socket_factory=receive_buffer_socket_factory(
            long_stream_receive_buffer(os.environ))),
        read_bufsize=LONG_STREAM_READ_BUFSIZE, cookie_jar=aiohttp.DummyCookieJar())
    state.probes.append(asyncio.create_task(state.loop_lag.run()))
    start_probes(state)


def start_probes(state: GatewayState) -> None:
    """An active health check per replica set of the current routes (those with a health_interval)."""
    assert state.session is not None
    seen: set[int] = set()
    for route in state.routes.values():
        if route.upstream.health_interval <= 0 or id(route.replicas) in seen:
            continue
        seen.add(id(route.replicas))
        headers = {}
        if route.upstream.api_key_env and os.environ.get(route.upstream.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[route.upstream.api_key_env]}"
        state.health_checks.append(asyncio.create_task(probe_forever(
            route.replicas, state.session, route.upstream.health_path, route.upstream.health_interval, headers)))


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def stop_probes(state: GatewayState) -> None:
    """Stop the health checks start_probes started (a reload starts the new routes' own)."""
    checks, state.health_checks = state.health_checks, []
    await _cancel(checks)


async def _on_cleanup(app: web.Application) -> None:
    state = app[STATE]
    await stop_probes(state)
    await _cancel(state.probes)
    await _cancel(list(state.stream_endings))
    for session in (state.session, state.long_stream_session):
        if session is not None:
            await session.close()


def _warn_per_character(routes: dict[str, Route]) -> None:
    """Say at start-up which routes' logprob bytes are per character rather than per token."""
    for name, route in routes.items():
        if name != route.model:
            continue  # an alias
        precision, per_character = bytes_precision(route.upstream.dialect, route.upstream.api, route.vocab is not None)
        if per_character:
            log.warning(orjson.dumps({"event": "logprob_bytes_per_character", "model": name,
                                      "upstream": route.upstream_name, "detail": precision}).decode())


def create_app(config: Config, routes: dict[str, Route] | None = None) -> web.Application:
    """Build the app; tokenizers and templates load here (unless `routes` built from `config` are
    given), so a bad config fails before serving."""
    state = GatewayState(config, build_routes(config) if routes is None else routes)
    _warn_per_character(state.routes)
    api_keys = load_api_keys(config)
    middlewares = [
        request_context,
        error_middleware_factory(),
        draining_middleware_factory(lambda: state.draining),
        auth_middleware_factory(api_keys),
    ]
    app = web.Application(middlewares=middlewares, client_max_size=config.limits.max_body_bytes)
    app[STATE] = state
    app.router.add_post("/v1/responses", create_response)
    from gateway.websocket import add_websocket_route  # it builds on this module's serving loop

    add_websocket_route(app)  # GET /v1/responses: WebSocket mode
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_get("/v1/models", list_models)
    add_sealer(app, config)
    add_compact_route(app, _read_json, lambda request, door, gen, front: _serve(
        request, door, gen, front, RESPONSES_FRAMING, "top_logprobs"))
    # Callers are told apart by key where keys mean something: checked here, or by the upstream.
    add_stored_routes(app, config, per_key=bool(api_keys) or config.auth.forward_client_key,
                      counters=state.metrics.store_counters())
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    if config.playground:
        add_playground(app)
    app.on_response_prepare.append(_dropped_tools_header)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app
