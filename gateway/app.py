"""The aiohttp application: routes, the error middleware, and the upstream I/O around the pure core."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from pydantic import ValidationError

from gateway.config import Config
from gateway.errors import GatewayError, bad_request, upstream_error, upstream_timeout
from gateway.logprobs.align import AlignmentError
from gateway.logprobs.parse import ParseOptions
from gateway.routing import Route, build_routes
from gateway.sse import data_payloads, encode_event
from gateway.translate.chat_template import ChatTemplateError, render_prompt
from gateway.translate.request import (
    RequestTranslationError,
    chat_body,
    completions_body,
    responses_to_messages,
    wants_logprobs,
)
from gateway.translate.response_object import ResponseSettings, usage_object
from gateway.translate.stream import ResponsesStream
from gateway.upstreams.vllm import Step, UpstreamFormatError, chat_step, completions_step, error_message
from schemas.errors import validation_error_to_openai
from schemas.responses_request import CreateResponseRequest

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


def _validate(body: dict[str, Any]) -> None:
    try:
        CreateResponseRequest.model_validate(body)
    except ValidationError as exc:
        error = validation_error_to_openai(exc).error
        raise bad_request(error.message, error.param, error.code) from None
    given = body.get("input")
    if given is None or given == "" or given == []:
        raise bad_request("Input must not be empty.", "input", "empty_input")


def _route(request: web.Request, model: str) -> Route:
    route = request.app[ROUTES_KEY].get(model)
    if route is None:
        raise GatewayError(404, f"The model `{model}` does not exist or you do not have access to it.",
                           code="model_not_found")
    return route


def _settings(body: dict[str, Any]) -> ResponseSettings:
    return ResponseSettings(
        model=body["model"],
        instructions=body.get("instructions"),
        max_output_tokens=body.get("max_output_tokens"),
        temperature=body.get("temperature") if body.get("temperature") is not None else 1.0,
        top_p=body.get("top_p") if body.get("top_p") is not None else 1.0,
        top_logprobs=body.get("top_logprobs") or 0,
        metadata=body.get("metadata") or {},
        user=body.get("user"),
        include_logprobs=wants_logprobs(body),
    )


def _upstream_request(route: Route, body: dict[str, Any], stream: bool) -> tuple[str, dict[str, Any], Callable]:
    cap = route.upstream.max_top_logprobs
    base = route.next_url()
    try:
        if route.upstream.api == "chat":
            upstream_body = chat_body(body, route.upstream_model, cap=cap, stream=stream,
                                      token_ids=route.vocab is not None)
            return f"{base}/v1/chat/completions", upstream_body, chat_step
        messages = responses_to_messages(body)
        plain = body["input"] if isinstance(body.get("input"), str) and not body.get("instructions") else None
        prompt = render_prompt(messages, route.chat_template, plain)  # type: ignore[arg-type]
        return (f"{base}/v1/completions",
                completions_body(body, route.upstream_model, prompt, cap=cap, stream=stream,
                                 token_ids=route.vocab is not None), completions_step)
    except RequestTranslationError as exc:
        raise bad_request(str(exc), exc.param) from None
    except ChatTemplateError as exc:
        raise bad_request(str(exc), "input") from None


def _usage(step_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not step_usage:
        return None
    cached = (step_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (step_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return usage_object(step_usage.get("prompt_tokens") or 0, step_usage.get("completion_tokens") or 0,
                        cached, reasoning)


async def _open_upstream(request: web.Request, route: Route, url: str, payload: dict[str, Any]
                         ) -> aiohttp.ClientResponse:
    """POST upstream and wait for its headers; errors before the first byte become 502/504."""
    session = request.app[SESSION_KEY]
    timeouts = route.upstream.timeouts
    timeout = aiohttp.ClientTimeout(total=timeouts.total, connect=timeouts.connect, sock_read=timeouts.idle)
    try:
        async with asyncio.timeout(timeouts.first_token):
            response = await session.post(url, data=orjson.dumps(payload), timeout=timeout,
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


async def create_response(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    _validate(body)
    route = _route(request, body["model"])
    stream = bool(body.get("stream"))
    url, payload, step_parser = _upstream_request(route, body, stream)
    options = ParseOptions(vocab=route.vocab)
    translator = ResponsesStream(_settings(body))
    upstream = await _open_upstream(request, route, url, payload)
    if not stream:
        return await _complete(route, upstream, translator, step_parser, options)
    return await _stream(request, route, upstream, translator, step_parser, options)


async def _complete(route: Route, upstream: aiohttp.ClientResponse, translator: ResponsesStream,
                    step_parser: Callable[..., Step], options: ParseOptions) -> web.Response:
    try:
        async with upstream:
            data = orjson.loads(await upstream.read())
    except TimeoutError:
        raise upstream_timeout(f"upstream {route.upstream_name!r} timed out") from None
    except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
        raise upstream_error(f"upstream {route.upstream_name!r} sent a broken response: {exc}") from None
    try:
        step = step_parser(data, options, streaming=False)
    except (UpstreamFormatError, AlignmentError) as exc:
        raise upstream_error(f"upstream {route.upstream_name!r} sent unusable logprobs: {exc}") from None
    translator.feed(step.tokens, step.text)
    return _json(translator.final_response(step.finish_reason, _usage(step.usage)))


async def _stream(request: web.Request, route: Route, upstream: aiohttp.ClientResponse,
                  translator: ResponsesStream, step_parser: Callable[..., Step], options: ParseOptions
                  ) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    finished = False
    try:
        await response.prepare(request)
        await _write(response, translator.start())
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        try:
            async for data in data_payloads(upstream.content):
                step = step_parser(orjson.loads(data), options, streaming=True)
                await _write(response, translator.feed(step.tokens, step.text))
                finish_reason = step.finish_reason or finish_reason
                usage = step.usage or usage
            if finish_reason is None:
                raise UpstreamFormatError("upstream stream ended without a finish_reason")
            events = translator.finish(finish_reason, _usage(usage))
        except TimeoutError:
            events = translator.fail(f"upstream {route.upstream_name!r} stopped sending (idle timeout)")
        except (aiohttp.ClientError, orjson.JSONDecodeError, UpstreamFormatError) as exc:
            events = translator.fail(f"upstream {route.upstream_name!r} failed mid-stream: {exc}")
        await _write(response, events)
        finished = True
        await response.write_eof()
    finally:
        if not finished:
            # The client went away (or we failed): drop the upstream connection so the server stops.
            upstream.close()
        upstream.release()
    return response


async def _write(response: web.StreamResponse, events: list[dict[str, Any]]) -> None:
    if events:
        await response.write(b"".join(encode_event(event) for event in events))


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
    app.router.add_get("/v1/models", list_models)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app
