"""POST /v1/responses/compact: the route's model summarises a conversation into a `compaction` item.

The conversation is the previous_response_id chain (if named) then `input`. It goes to the route's
model, on the same serving loop as any Response (replicas, retries, metrics, the access log), with
`compaction.prompt` as a last user message; the request's `instructions` come first, as for a
Response. The answer (OpenAI's `CompactedResponse`, the spec's `CompactResource`):

    {"id", "object": "response.compaction", "created_at",
     "output": [every user message of the conversation..., {"type": "compaction", "id", "encrypted_content"}],
     "usage": the summarising call's}

Nothing is stored: the output, sent back as `input` (with new messages after it), is the conversation.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.canonical.generation import Generation
from gateway.compaction import SEALER_KEY, expand_compactions, is_compaction
from gateway.errors import bad_request, upstream_error
from gateway.middleware import json_response
from gateway.routing import Route
from gateway.stored_routes import RecordingFront, begin_turn, caller_of
from gateway.translate.front_doors import generation_from_responses, responses_settings, validate_body
from gateway.translate.fronts import FrontTranslator, ResponsesFront
from gateway.translate.input_items import stored_input_items
from gateway.translate.response_object import new_id
from schemas.responses_compact import CompactRequest

Serve = Callable[[web.Request, str, Generation, Callable[[Route], FrontTranslator]], Awaitable[Any]]
ReadJson = Callable[[web.Request], Awaitable[dict[str, Any]]]


def add_compact_route(app: web.Application, read_json: ReadJson, serve: Serve) -> None:
    """Before /v1/responses/{id}'s routes, which would otherwise answer this path 405."""

    async def compact_response(request: web.Request) -> web.Response:
        return await _compact(request, await read_json(request), serve)

    app.router.add_post("/v1/responses/compact", compact_response)


async def _compact(request: web.Request, body: dict[str, Any], serve: Serve) -> web.Response:
    validate_body(CompactRequest, body)
    sealer = request.app[SEALER_KEY]
    given = body.get("input")
    given = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
    turn = await begin_turn(request, {"previous_response_id": body.get("previous_response_id"), "store": False},
                            expand=False)
    if not given and not turn.history:
        raise bad_request("Nothing to compact: give `input` and/or `previous_response_id`.", "input", "empty_input")
    caller = caller_of(request)
    model_input = expand_compactions(sealer, caller, given, "input")
    history = expand_compactions(sealer, caller, turn.replayed, "previous_response_id")
    summary_body = {"model": body["model"], "instructions": body.get("instructions"), "store": False,
                    "input": [*model_input, {"role": "user", "content": sealer.settings.prompt}],
                    "max_output_tokens": sealer.settings.max_output_tokens}
    gen = generation_from_responses(summary_body, history)
    settings = responses_settings(summary_body, gen)
    fronts: list[RecordingFront] = []

    def front(route: Route) -> FrontTranslator:
        fronts.append(RecordingFront(ResponsesFront(settings, route.vocab, serialized=True, deltas=False)))
        return fronts[-1]  # type: ignore[return-value]  # a FrontTranslator by delegation

    await serve(request, "compact", gen, front)
    final = fronts[-1].final_response if fronts else None
    summary = _output_text(final or {})
    if final is None or not summary.strip():
        raise upstream_error("The model wrote no summary of the conversation.")
    # What stays visible: the user's own messages (earlier compaction items are in the new summary).
    kept = [item for item in [*turn.replayed, *stored_input_items([i for i in given if not is_compaction(i)])]
            if item.get("type", "message") == "message" and item.get("role") == "user"]
    created = int(time.time())
    token = sealer.seal({"summary": summary, "model": body["model"], "created_at": created}, caller)
    return json_response({"id": new_id("resp"), "object": "response.compaction", "created_at": created,
                          "output": [*kept, {"id": new_id("cmp"), "type": "compaction", "encrypted_content": token}],
                          "usage": final["usage"]})


def _output_text(response: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for item in response.get("output") or [] if item.get("type") == "message"
                   for part in item.get("content") or [] if part.get("type") == "output_text")
