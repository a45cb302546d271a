"""Responses request -> chat messages, the logprob switch and vendor extensions (pure functions)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.translate.tools import ToolSet

from gateway.translate.input_files import InputFileError, input_file_text

# Responses fields the gateway itself consumes; everything else a client sends is a vendor
# extension (ignore_eos, top_k, repetition_penalty, ...) and is forwarded as is.
RESPONSES_FIELDS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "include", "top_logprobs",
    "stream", "stream_options", "store", "metadata", "user", "previous_response_id", "tools", "tool_choice",
    "parallel_tool_calls", "text", "reasoning", "truncation", "service_tier", "background", "prompt_cache_key",
    "safety_identifier", "max_tool_calls", "conversation", "prompt", "prompt_cache_retention", "client_metadata",
})
LOGPROBS_INCLUDE = "message.output_text.logprobs"
CUSTOM_INPUT = "input"  # the one string parameter a custom tool's chat function takes (translate.tools)
NAMESPACE_SEPARATOR = "__"


def upstream_name(name: str, namespace: str | None) -> str:
    """The chat function name of a Responses tool: a namespace member's is `<namespace>__<name>`
    (the flat spelling Codex uses where a namespace cannot be kept, `ToolName::canonical_flat_name`)."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


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
        elif kind == "refusal":  # an earlier assistant turn that declined: its words are the history
            parts.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not url:
                raise RequestTranslationError("input_image needs image_url (file_id is not supported)",
                                              f"{param}[{index}].image_url")
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": part.get("detail", "auto")}})
        elif kind == "input_file":
            try:
                parts.append({"type": "text", "text": input_file_text(part, f"{param}[{index}]")})
            except InputFileError as exc:
                raise RequestTranslationError(str(exc), exc.param) from None
        else:
            raise RequestTranslationError(f"content part type {kind!r} is not supported", f"{param}[{index}].type")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)  # plain text keeps every upstream and template happy
    return parts


def _tool_call(item: dict[str, Any]) -> dict[str, Any]:
    """A function call, or a custom tool call (its free-form input as the one string argument)."""
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({CUSTOM_INPUT: item.get("input", "")}, ensure_ascii=False)
    else:
        arguments = item.get("arguments", "")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": upstream_name(item["name"], item.get("namespace")), "arguments": arguments}}


def _tool_output(item: dict[str, Any], param: str) -> str:
    content = _content_text(item.get("output", ""), param)
    if not isinstance(content, str):
        raise RequestTranslationError("a function_call_output can only carry text for a chat upstream", param)
    return content


def responses_to_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`instructions` + `input` -> chat messages (instructions first, as a system message).

    `function_call` items become `tool_calls` of an assistant message (joining the assistant turn
    right before them, as chat templates expect one assistant message per turn), and
    `function_call_output` items `role: "tool"` messages keyed by `call_id`. Reasoning items are
    dropped: chat upstreams take no reasoning history (reasoning models' templates strip it anyway).
    """
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return messages
    for index, item in enumerate(given or []):
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"],
                             "content": _content_text(item["content"], f"input[{index}].content")})
        elif kind in ("function_call", "custom_tool_call"):
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(_tool_call(item))
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [_tool_call(item)]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _tool_output(item, f"input[{index}].output")})
        elif kind != "reasoning":
            raise RequestTranslationError(f"input item type {kind!r} is not supported yet", f"input[{index}].type")
    return messages


def chat_tool_options(body: dict[str, Any], tools: ToolSet | None = None) -> dict[str, Any]:
    """Responses `tools` (as `translate.tools.plan_tools` offers them) / `tool_choice` /
    `parallel_tool_calls` -> chat's, only those given.

    Chat has no `allowed_tools` choice: the same effect is the allowed subset as `tools` with its
    mode as `tool_choice`. A choice or an allowed entry names a tool as the client knows it (a
    namespace member by its own name, or by its upstream name).
    """
    if tools is None:
        from gateway.translate.tools import plan_tools

        tools = plan_tools(body.get("tools"))
    functions = tools.functions
    choice = body.get("tool_choice")
    out: dict[str, Any] = {}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = {t.get("name") for t in choice.get("tools") or []}
        functions = [f for f in functions if f["function"]["name"] in allowed
                     or getattr(tools.shapes.get(f["function"]["name"]), "name", None) in allowed]
        choice = choice.get("mode", "auto")
    if functions:
        out["tools"] = functions
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        name = choice.get("name")
        flat = {f["function"]["name"] for f in tools.functions}
        if name not in flat:  # a namespace member named as the client knows it
            name = next((key for key, shape in tools.shapes.items() if shape.name == name), name)
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif isinstance(choice, str):
        out["tool_choice"] = choice
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    return out


def chat_response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """Responses `text.format` (flat) -> chat `response_format` (json_schema nested); None for text."""
    fmt = (body.get("text") or {}).get("format") or {}
    kind = fmt.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if fmt.get(key) is not None}
        return {"type": "json_schema", "json_schema": schema}
    return None


def reasoning_effort(body: dict[str, Any]) -> str | None:
    return (body.get("reasoning") or {}).get("effort")


def wants_logprobs(body: dict[str, Any]) -> bool:
    """Logprobs are returned iff `include` asks for them (`top_logprobs` alone never does)."""
    return LOGPROBS_INCLUDE in (body.get("include") or [])


def vendor_extensions(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in RESPONSES_FIELDS}


def has_image_parts(messages: list[dict[str, Any]]) -> bool:
    return any(isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"])
               for m in messages)
