"""Responses request -> chat messages, the logprob switch and vendor extensions (pure functions)."""

from __future__ import annotations

from typing import Any

# Responses fields the gateway itself consumes; everything else a client sends is a vendor
# extension (ignore_eos, top_k, repetition_penalty, ...) and is forwarded as is.
RESPONSES_FIELDS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "include", "top_logprobs",
    "stream", "stream_options", "store", "metadata", "user", "previous_response_id", "tools", "tool_choice",
    "parallel_tool_calls", "text", "reasoning", "truncation", "service_tier", "background", "prompt_cache_key",
    "safety_identifier", "max_tool_calls", "conversation", "prompt", "prompt_cache_retention",
})
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class RequestTranslationError(ValueError):
    """The request cannot be expressed to the upstream; `param` names the field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def _content_text(content: Any, param: str) -> str | list[dict[str, Any]]:
    """Responses content -> chat content: a string stays a string; parts map one to one."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not url:
                raise RequestTranslationError("input_image needs image_url (file_id is not supported)",
                                              f"{param}[{index}].image_url")
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": part.get("detail", "auto")}})
        else:
            raise RequestTranslationError(f"content part type {kind!r} is not supported", f"{param}[{index}].type")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)  # plain text keeps every upstream and template happy
    return parts


def responses_to_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`instructions` + `input` -> chat messages (instructions first, as a system message)."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return messages
    for index, item in enumerate(given or []):
        kind = item.get("type", "message")
        if kind != "message":
            raise RequestTranslationError(f"input item type {kind!r} is not supported yet", f"input[{index}].type")
        messages.append({"role": item["role"], "content": _content_text(item["content"], f"input[{index}].content")})
    return messages


def wants_logprobs(body: dict[str, Any]) -> bool:
    """Logprobs are returned iff `include` asks for them (`top_logprobs` alone never does)."""
    return LOGPROBS_INCLUDE in (body.get("include") or [])


def vendor_extensions(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in RESPONSES_FIELDS}
