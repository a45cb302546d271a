"""A request's `input` as stored input items (OpenAI's `ItemResource` shapes, each with an id). Pure.

`GET /v1/responses/{id}/input_items` lists these, and `previous_response_id` replays them (then the
Response's output) through the same request translation as a fresh `input`. So each item keeps
what the model saw, spelled as OpenAI lists it: a string becomes a user message with one
`input_text` part; an assistant message becomes an output message with `output_text` parts.
"""

from __future__ import annotations

from typing import Any

from gateway.translate.response_object import message_item, new_id, output_text_part

Item = dict[str, Any]

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def _input_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    parts = []
    for part in content:
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif kind == "input_image":
            parts.append({"detail": "auto", **part})  # the SDK requires `detail`
        else:
            parts.append(dict(part))
    return parts


def _assistant_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [output_text_part(content, [])]
    return [output_text_part(part.get("text", ""), []) if part.get("type") in _TEXT_PARTS else dict(part)
            for part in content]


def stored_input_items(given: Any) -> list[Item]:
    """The request's `input` (a string or a list of items) as items with ids."""
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    items: list[Item] = []
    for raw in given or []:
        kind = raw.get("type", "message")
        item_id = raw.get("id") or new_id(_ID_PREFIX.get(kind, "item"))
        if kind == "message" and raw.get("role") == "assistant":
            items.append(message_item(item_id, raw.get("status") or "completed", _assistant_parts(raw["content"])))
        elif kind == "message":
            items.append({"id": item_id, "type": "message", "role": raw["role"],
                          "content": _input_parts(raw["content"]), "status": raw.get("status") or "completed"})
        else:  # function calls and their outputs: listed items need an id and a status
            items.append({**raw, "id": item_id, "status": raw.get("status") or "completed"})
    return items


def without_logprobs(items: list[Item]) -> list[Item]:
    """Output items with every `output_text` part's logprobs emptied (for replay and listings)."""
    return [_strip_item(item) for item in items]


def _strip_item(item: Item) -> Item:
    content = item.get("content")
    if item.get("type") != "message" or not isinstance(content, list):
        return item
    parts = [{**part, "logprobs": []} if part.get("type") == "output_text" and part.get("logprobs") else part
             for part in content]
    return {**item, "content": parts}


def replayed_items(input_items: list[Item], output: list[Item]) -> list[Item]:
    """What a turn that names this Response as `previous_response_id` sees before its own input."""
    return [*input_items, *without_logprobs(output)]
