"""Each front door's request body -> a validated `Generation` (pure; errors are OpenAI-shaped)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from gateway.canonical.generation import Generation
from gateway.errors import GatewayError, bad_request
from gateway.translate.request import (
    RequestTranslationError,
    chat_response_format,
    chat_tool_options,
    has_image_parts,
    reasoning_effort,
    responses_to_messages,
    vendor_extensions,
    wants_logprobs,
)
from gateway.translate.response_object import ResponseSettings
from gateway.translate.tools import HostedPolicy, plan_tools
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.errors import validation_error_to_openai
from schemas.responses_request import CreateResponseRequest

CHAT_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "logprobs", "top_logprobs",
    "stream", "stream_options", "stop", "tools", "tool_choice", "parallel_tool_calls", "response_format", "user", "n",
})
COMPLETIONS_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "logprobs", "echo", "stream", "stream_options", "stop",
    "n", "user",
})
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for legacy completions


def validate_body(model: type[BaseModel], body: dict[str, Any]) -> None:
    try:
        model.model_validate(body)
    except ValidationError as exc:
        error = validation_error_to_openai(exc).error
        raise bad_request(error.message, error.param, error.code) from None


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _one_choice(body: dict[str, Any]) -> None:
    if body.get("n") not in (None, 1):
        raise GatewayError(400, "Only n=1 is supported.", param="n", code="unsupported_parameter")


# Fields OpenAI's Responses API defines that this gateway cannot honour (they name state kept at OpenAI).
_UNSERVED_RESPONSES_FIELDS = {
    "conversation": "conversations are not stored here; continue with previous_response_id.",
    "prompt": "stored prompt templates live at OpenAI; send instructions and input instead.",
}


def generation_from_responses(body: dict[str, Any], history: Sequence[dict[str, Any]] = (),
                              hosted_tools: HostedPolicy = "drop") -> Generation:
    """`history`: the items `previous_response_id` replays (its input items, then its output).
    `hosted_tools`: the model's policy for tools only OpenAI can run (`translate.tools`)."""
    validate_body(CreateResponseRequest, body)
    for name, why in _UNSERVED_RESPONSES_FIELDS.items():
        if body.get(name) is not None:  # OpenAI's field, not a vendor option: never silently ignored
            raise GatewayError(400, f"`{name}` is not supported: {why}", param=name, code="unsupported_parameter")
    given = body.get("input")
    if given is None or given == "" or given == []:
        raise bad_request("Input must not be empty.", "input", "empty_input")
    try:
        tool_set = plan_tools(body.get("tools"), hosted_tools)
        messages = responses_to_messages(body)
    except RequestTranslationError as exc:
        raise bad_request(str(exc), exc.param) from None
    _check_call_ids(given, history)
    if history:
        messages = _after_history(body, history)
    return Generation(
        model=body["model"], messages=messages,
        plain_input=given if isinstance(given, str) and not body.get("instructions") and not history else None,
        max_tokens=body.get("max_output_tokens"), temperature=body.get("temperature"), top_p=body.get("top_p"),
        user=body.get("user"), logprobs=wants_logprobs(body), top_k_logprobs=body.get("top_logprobs") or 0,
        stream=bool(body.get("stream")), extensions=vendor_extensions(body),
        tool_options=chat_tool_options(body, tool_set), tool_set=tool_set,
        response_format=chat_response_format(body), format_param="text.format",
        reasoning_effort=reasoning_effort(body), has_images=has_image_parts(messages), input_param="input",
    )


def responses_settings(body: dict[str, Any], gen: Generation, *, store: bool = False,
                       previous_response_id: str | None = None, background: bool = False) -> ResponseSettings:
    """What the Response echoes of its (validated) request: given values, else the defaults it ran with.
    `store` and `previous_response_id` as the gateway honours them (the response store decides).

    Both contracts are met: numbers are never null, function tools carry description, parameters
    and strict, a json_schema format carries description and a boolean strict.
    """
    text = body.get("text") or {}
    return ResponseSettings(
        model=body["model"],
        instructions=body.get("instructions"),
        max_output_tokens=body.get("max_output_tokens"),
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        presence_penalty=_number(body, "presence_penalty", 0.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0),
        top_logprobs=gen.top_k_logprobs,
        metadata=body.get("metadata") or {},
        user=body.get("user"),
        include_logprobs=gen.logprobs,
        text_format=_echo_format(text.get("format")),
        verbosity=text.get("verbosity") or "medium",
        tools=[_echo_tool(tool) for tool in (gen.tool_set.offered if gen.tool_set else body.get("tools") or [])],
        tool_shapes=gen.tool_set.shapes if gen.tool_set else {},
        tool_choice=body.get("tool_choice") if body.get("tool_choice") is not None else "auto",
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        max_tool_calls=body.get("max_tool_calls"),
        reasoning=_echo_reasoning(body.get("reasoning")),
        truncation=body.get("truncation") or "disabled",
        safety_identifier=body.get("safety_identifier"),
        prompt_cache_key=body.get("prompt_cache_key"),
        store=store,
        background=background,
        previous_response_id=previous_response_id,
    )


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    return default if value is None else value


def _echo_format(fmt: dict[str, Any] | None) -> dict[str, Any]:
    if not fmt or fmt.get("type") not in ("json_object", "json_schema"):
        return {"type": "text"}
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "name": fmt["name"], "schema": fmt["schema"],
            "description": fmt.get("description"), "strict": bool(fmt.get("strict"))}


def _echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type", "function")
    if kind == "namespace":
        return {"type": "namespace", "name": tool["name"], "description": tool["description"],
                "tools": [_echo_tool(member) for member in tool["tools"]]}
    if kind == "custom":
        return {"type": "custom", "name": tool["name"], "description": tool.get("description"),
                "format": tool.get("format") or {"type": "text"}}
    return {"type": "function", "name": tool["name"], "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": tool.get("strict")}


# The spec's effort values; the SDK's `minimal` and `max` echo as their nearest neighbours.
_EFFORT_ECHO = {"minimal": "low", "max": "xhigh"}


def _echo_reasoning(reasoning: dict[str, Any] | None) -> dict[str, Any] | None:
    if reasoning is None:
        return None
    effort = reasoning.get("effort")
    summary = reasoning.get("summary") or reasoning.get("generate_summary")
    return {"effort": _EFFORT_ECHO.get(effort, effort), "summary": summary}


def _check_call_ids(given: Any, history: Sequence[dict[str, Any]]) -> None:
    """Every `function_call_output` answers a `function_call` before it: in the replayed history or
    earlier in `input`. OpenAI refuses an orphan output (400, this message); a chat upstream would
    take a `role: "tool"` message for a call it never made, or fail on it in its template."""
    if isinstance(given, str):
        return
    calls = {item.get("call_id") for item in history if item.get("type") == "function_call"}
    for index, item in enumerate(given or []):
        kind = item.get("type")
        if kind == "function_call":
            calls.add(item.get("call_id"))
        elif kind == "function_call_output" and item.get("call_id") not in calls:
            raise GatewayError(400, f"No tool call found for function call output with call_id {item.get('call_id')}.",
                               param=f"input[{index}].call_id", code="invalid_value")


def _after_history(body: dict[str, Any], history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """This turn's instructions, then the replayed conversation, then this turn's input.

    Only this turn's `instructions` apply: the previous turns' are not carried over. One translation
    over history and input keeps items that span them together (a tool call and its output). The
    input alone has translated already, so an error here is the stored history's.
    """
    given = body["input"]
    items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
    try:
        return responses_to_messages({"instructions": body.get("instructions"), "input": [*history, *items]})
    except RequestTranslationError as exc:
        raise bad_request(f"The previous response cannot be replayed: {exc}", "previous_response_id") from None


def generation_from_chat(body: dict[str, Any]) -> Generation:
    validate_body(ChatCompletionRequest, body)
    _one_choice(body)
    if body.get("top_logprobs") and not body.get("logprobs"):
        raise bad_request("top_logprobs requires logprobs to be true.", "top_logprobs", "invalid_value")
    return Generation(
        model=body["model"], messages=body["messages"],
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
        temperature=body.get("temperature"), top_p=body.get("top_p"), stop=_stop(body.get("stop")),
        user=body.get("user"), logprobs=bool(body.get("logprobs")), top_k_logprobs=body.get("top_logprobs") or 0,
        stream=bool(body.get("stream")),
        extensions={k: v for k, v in body.items() if k not in CHAT_FIELDS},
        tool_options={k: body[k] for k in ("tools", "tool_choice", "parallel_tool_calls") if body.get(k) is not None},
        response_format=body.get("response_format"), has_images=has_image_parts(body["messages"]),
    )


def generation_from_completions(body: dict[str, Any]) -> Generation:
    validate_body(CompletionRequest, body)
    _one_choice(body)
    prompt = body["prompt"]
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise GatewayError(400, "Only a single text prompt is supported (no batches or token ids).",
                               param="prompt", code="unsupported_parameter")
        prompt = prompt[0]
    if prompt == "":
        raise bad_request("Prompt must not be empty.", "prompt", "empty_input")
    logprobs = body.get("logprobs")
    max_tokens = body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    echo = bool(body.get("echo"))
    if max_tokens == 0 and not echo:
        raise bad_request("max_tokens 0 only makes sense with echo.", "max_tokens", "invalid_value")
    return Generation(
        model=body["model"], prompt=prompt, plain_input=prompt, max_tokens=max_tokens,
        temperature=body.get("temperature"), top_p=body.get("top_p"), stop=_stop(body.get("stop")),
        user=body.get("user"), logprobs=logprobs is not None, top_k_logprobs=logprobs or 0,
        echo_prompt=echo, stream=bool(body.get("stream")),
        extensions={k: v for k, v in body.items() if k not in COMPLETIONS_FIELDS},
    )
