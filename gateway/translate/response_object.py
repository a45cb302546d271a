"""Responses API objects as plain dicts (the hot path renders dicts; schemas/ documents them).

Every Response carries every field both contracts want: OpenAI's SDK types and the Open Responses
spec's `ResponseResource` (which requires completed_at, truncation, penalties, store, ... and
numbers, never null, for temperature, top_p and top_logprobs).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any


def new_id(prefix: str) -> str:
    """`resp_`, `msg_`, ... followed by 48 hex digits, as OpenAI's ids are shaped: the first 12 are the
    creation time (unix milliseconds), the other 36 random (144 bits). The response store uses the time
    to tell an id that may still be on its way to the store (read your own writes) from an unknown one."""
    return f"{prefix}_{int(time.time() * 1000) & 0xFFFF_FFFF_FFFF:012x}{random_hex(18)}"


# os.urandom bytes read 4 KB at a time and handed out in order, never twice: a getrandom call per id
# cost ~2% of a streamed request's CPU (three or four ids each). A forked worker starts a pool of its
# own, so no two processes hand out the same bytes.
_POOL_SIZE = 4096
_pool = [b"", 0]  # the bytes read, and how many of them are handed out
_pool_lock = threading.Lock()


def random_hex(count: int) -> str:
    """`count` random bytes (from os.urandom) as hex: what secrets.token_hex(count) gives."""
    with _pool_lock:
        data, used = _pool
        if used + count > len(data):
            data, used = os.urandom(max(_POOL_SIZE, count)), 0
            _pool[0] = data
        _pool[1] = used + count
    return data[used:used + count].hex()


def _fresh_pool() -> None:
    global _pool_lock
    _pool[:] = [b"", 0]
    _pool_lock = threading.Lock()  # another thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_fresh_pool)


def id_created_at(item_id: str) -> float | None:
    """When `new_id` made the id (unix seconds), or None for an id it cannot have made."""
    _, _, digits = item_id.rpartition("_")
    if len(digits) != 48:
        return None
    try:
        return int(digits[:12], 16) / 1000
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class ResponseSettings:
    """What a Response echoes of its request."""

    model: str
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    store: bool = False
    background: bool = False
    previous_response_id: str | None = None
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    service_tier: str = "default"
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    include_logprobs: bool = False
    reasoning: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    truncation: str = "disabled"
    verbosity: str = "medium"
    tool_shapes: dict[str, Any] = field(default_factory=dict)
    """Upstream function name -> `translate.tools.CallShape`: calls that come back as a namespaced
    `function_call` or a `custom_tool_call`."""


def output_text_part(text: str, logprobs: Any) -> dict[str, Any]:
    """`logprobs`: the entries, or an `orjson.Fragment` of their JSON (see stream.ResponsesStream)."""
    return {"type": "output_text", "annotations": [], "logprobs": logprobs, "text": text}


def message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def reasoning_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    """A reasoning item: the upstream's thinking as one `reasoning_text` part (None: no part yet)."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def function_call_item(item_id: str, status: str, call_id: str, name: str, arguments: str,
                       namespace: str | None = None) -> dict[str, Any]:
    item = {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}
    if namespace is not None:
        item["namespace"] = namespace  # OpenAI's key for a member of a `namespace` tool
    return item


def custom_tool_call_item(item_id: str, status: str, call_id: str, name: str, input_text: str,
                          namespace: str | None = None) -> dict[str, Any]:
    """A call to a `custom` tool: its free-form `input` (OpenAI's `ResponseCustomToolCall`)."""
    item = {"id": item_id, "type": "custom_tool_call", "status": status, "call_id": call_id, "name": name,
            "input": input_text}
    if namespace is not None:
        item["namespace"] = namespace
    return item


def usage_object(input_tokens: int, output_tokens: int, cached_tokens: int = 0,
                 reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    settings: ResponseSettings,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    *,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    completed_at: int | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at if status == "completed" else None,
        "status": status,
        "background": settings.background,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": settings.instructions,
        "max_output_tokens": settings.max_output_tokens,
        "max_tool_calls": settings.max_tool_calls,
        "model": settings.model,
        "output": output,
        "parallel_tool_calls": settings.parallel_tool_calls,
        "previous_response_id": settings.previous_response_id,
        "prompt_cache_key": settings.prompt_cache_key,
        "reasoning": settings.reasoning,
        "safety_identifier": settings.safety_identifier,
        "service_tier": settings.service_tier,
        "store": settings.store,
        "temperature": settings.temperature,
        "text": {"format": settings.text_format, "verbosity": settings.verbosity},
        "tool_choice": settings.tool_choice,
        "tools": settings.tools,
        "top_logprobs": settings.top_logprobs,
        "top_p": settings.top_p,
        "presence_penalty": settings.presence_penalty,
        "frequency_penalty": settings.frequency_penalty,
        "truncation": settings.truncation,
        "usage": usage,
        "user": settings.user,
        "metadata": settings.metadata,
    }


def status_for_finish(finish_reason: str | None) -> tuple[str, str | None]:
    """Upstream finish_reason -> (Response status, incomplete_details.reason)."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "content_filter":
        return "incomplete", "content_filter"
    return "completed", None
