"""The aiohttp application: routes, the error middleware, and the upstream I/O around the pure core.

Every front door (responses, chat, completions) runs the same loop: validate into a Generation,
build the route's upstream call, then feed upstream steps to the front door's translator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.config import Config
from gateway.errors import GatewayError, bad_request, upstream_error, upstream_timeout
from gateway.logprobs.align import AlignmentError
from gateway.logprobs.parse import ParseOptions
from gateway.routing import Route, build_routes
from gateway.sse import data_payloads, encode_event
from gateway.translate.front_doors import generation_from_chat, generation_from_completions, generation_from_responses
from gateway.translate.fronts import ChatFront, CompletionsFront, FrontTranslator, ResponsesFront
from gateway.translate.generation import Generation
from gateway.translate.response_object import ResponseSettings
from gateway.upstreams.base import UpstreamCall, UpstreamFormatError
from gateway.upstreams.dispatch import build_call, parse_options
from gateway.upstreams.openai_compatible import error_message

log = logging.getLogger("responses_gateway")

CONFIG_KEY = web.AppKey("config", Config)
ROUTES_KEY = web.AppKey("routes", dict)
SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)
STARTED_KEY = web.AppKey("started_at", int)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


@web.middleware
async def error_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
    try:
        return await handler(request)
    except GatewayError as exc:
        return _json(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = "not_found" if exc.status == 404 else None
        return _json({"error": {"message": exc.reason, "type": "invalid_request_error", "param": None,
                                "code": code}}, exc.status)


async def _read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", None, "invalid_type")
    return body


def _route(request: web.Request, model: str) -> Route:
    route = request.app[ROUTES_KEY].get(model)
    if route is None:
        raise GatewayError(404, f"The model `{model}` does not exist or you do not have access to it.",
                           code="model_not_found")
    return route


@dataclass(frozen=True, slots=True)
class _Framing:
    """How a front door writes its stream: Responses events, or `data:` chunks ending in [DONE]."""

    named_events: bool

    def encode(self, items: list[dict[str, Any]]) -> bytes:
        if self.named_events:
            return b"".join(encode_event(item) for item in items)
        return b"".join(b"data: " + orjson.dumps(item) + b"\n\n" for item in items)

    def end(self) -> bytes:
        return b"" if self.named_events else b"data: [DONE]\n\n"


RESPONSES_FRAMING = _Framing(named_events=True)
OPENAI_CHUNK_FRAMING = _Framing(named_events=False)


def _responses_settings(body: dict[str, Any], gen: Generation) -> ResponseSettings:
    return ResponseSettings(
        model=body["model"],
        instructions=body.get("instructions"),
        max_output_tokens=body.get("max_output_tokens"),
        temperature=body.get("temperature") if body.get("temperature") is not None else 1.0,
        top_p=body.get("top_p") if body.get("top_p") is not None else 1.0,
        top_logprobs=gen.top_k_logprobs,
        metadata=body.get("metadata") or {},
        user=body.get("user"),
        include_logprobs=gen.logprobs,
    )


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    return bool(options.get("include_usage"))


async def create_response(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    gen = generation_from_responses(body)
    settings = _responses_settings(body, gen)
    return await _serve(request, gen, lambda route: ResponsesFront(settings, route.vocab), RESPONSES_FRAMING,
                        "top_logprobs")


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    gen = generation_from_chat(body)
    usage = _include_usage(body)
    return await _serve(request, gen, lambda route: ChatFront(gen, usage, route.vocab), OPENAI_CHUNK_FRAMING,
                        "top_logprobs")


async def create_completion(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    gen = generation_from_completions(body)
    usage = _include_usage(body)
    return await _serve(request, gen, lambda route: CompletionsFront(gen, usage, route.vocab), OPENAI_CHUNK_FRAMING,
                        "logprobs")


async def _serve(request: web.Request, gen: Generation, make_front: Callable[[Route], FrontTranslator],
                 framing: _Framing, k_param: str) -> web.StreamResponse:
    route = _route(request, gen.model)
    front = make_front(route)
    call = build_call(route, gen, k_param)
    options = parse_options(route)
    upstream = await _open_upstream(request, route, call)
    if not gen.stream:
        return await _complete(route, upstream, call, front, options)
    return await _stream(request, route, upstream, call, front, framing, options)


async def _open_upstream(request: web.Request, route: Route, call: UpstreamCall) -> aiohttp.ClientResponse:
    """POST upstream and wait for its headers; errors before the first byte become 502/504."""
    session = request.app[SESSION_KEY]
    timeouts = route.upstream.timeouts
    timeout = aiohttp.ClientTimeout(total=timeouts.total, connect=timeouts.connect, sock_read=timeouts.idle)
    url = route.next_url() + call.path
    try:
        async with asyncio.timeout(timeouts.first_token):
            response = await session.post(url, data=orjson.dumps(call.body), timeout=timeout,
                                          headers={"Content-Type": "application/json"})
    except TimeoutError:
        raise upstream_timeout(f"upstream {route.upstream_name!r} did not answer within "
                               f"{timeouts.first_token:g}s") from None
    except aiohttp.ClientError as exc:
        raise upstream_error(f"upstream {route.upstream_name!r} is unreachable: {type(exc).__name__}") from None
    if response.status >= 400:
        try:
            detail = error_message(await response.json(content_type=None), response.status)
        except (aiohttp.ClientError, ValueError):
            detail = f"upstream answered HTTP {response.status}"
        finally:
            response.release()
        raise upstream_error(f"upstream {route.upstream_name!r} refused the request: {detail}")
    return response


async def _complete(route: Route, upstream: aiohttp.ClientResponse, call: UpstreamCall, front: FrontTranslator,
                    options: ParseOptions) -> web.Response:
    try:
        async with upstream:
            data = orjson.loads(await upstream.read())
    except TimeoutError:
        raise upstream_timeout(f"upstream {route.upstream_name!r} timed out") from None
    except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
        raise upstream_error(f"upstream {route.upstream_name!r} sent a broken response: {exc}") from None
    try:
        step = call.parse(data, options, streaming=False)
    except (UpstreamFormatError, AlignmentError) as exc:
        raise upstream_error(f"upstream {route.upstream_name!r} sent unusable logprobs: {exc}") from None
    front.start()
    if step.prompt_text is not None:
        front.echo(step.prompt_text, step.prompt_tokens or [])
    front.feed(step.tokens, step.text)
    return _json(front.final(step.finish_reason, step.usage))


async def _stream(request: web.Request, route: Route, upstream: aiohttp.ClientResponse, call: UpstreamCall,
                  front: FrontTranslator, framing: _Framing, options: ParseOptions) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    finished = False
    try:
        await response.prepare(request)
        await _write(response, framing, front.start())
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        failed = False
        try:
            async for data in data_payloads(upstream.content):
                step = call.parse(orjson.loads(data), options, streaming=True)
                await _write(response, framing, front.feed(step.tokens, step.text))
                finish_reason = step.finish_reason or finish_reason
                usage = step.usage or usage
            if finish_reason is None:
                raise UpstreamFormatError("upstream stream ended without a finish_reason")
            items = front.finish(finish_reason, usage)
        except TimeoutError:
            failed, items = True, front.fail(f"upstream {route.upstream_name!r} stopped sending (idle timeout)")
        except (aiohttp.ClientError, orjson.JSONDecodeError, UpstreamFormatError, AlignmentError) as exc:
            failed, items = True, front.fail(f"upstream {route.upstream_name!r} failed mid-stream: {exc}")
        await _write(response, framing, items)
        if not failed:
            await response.write(framing.end())
        finished = True
        await response.write_eof()
    finally:
        if not finished:
            # The client went away (or we failed): drop the upstream connection so the server stops.
            upstream.close()
        upstream.release()
    return response


async def _write(response: web.StreamResponse, framing: _Framing, items: list[dict[str, Any]]) -> None:
    if items:
        await response.write(framing.encode(items))


async def list_models(request: web.Request) -> web.Response:
    created = request.app[STARTED_KEY]
    data = [{"id": name, "object": "model", "created": created, "owned_by": route.upstream_name}
            for name, route in request.app[ROUTES_KEY].items()]
    return _json({"object": "list", "data": data})


async def _on_startup(app: web.Application) -> None:
    app[SESSION_KEY] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=256),
                                             auto_decompress=True)


async def _on_cleanup(app: web.Application) -> None:
    await app[SESSION_KEY].close()


def create_app(config: Config) -> web.Application:
    """Build the app; tokenizers and templates load here, so a bad config fails before serving."""
    app = web.Application(middlewares=[error_middleware], client_max_size=16 * 1024 * 1024)
    app[CONFIG_KEY] = config
    app[ROUTES_KEY] = build_routes(config)
    app[STARTED_KEY] = int(time.time())
    app.router.add_post("/v1/responses", create_response)
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_get("/v1/models", list_models)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app
