"""Each front door's request body -> a validated `Generation` (pure; errors are OpenAI-shaped)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from gateway.errors import GatewayError, bad_request
from gateway.translate.generation import Generation
from gateway.translate.request import (
    RequestTranslationError,
    responses_to_messages,
    vendor_extensions,
    wants_logprobs,
)
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


def _validate(model: type[BaseModel], body: dict[str, Any]) -> None:
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


def generation_from_responses(body: dict[str, Any]) -> Generation:
    _validate(CreateResponseRequest, body)
    given = body.get("input")
    if given is None or given == "" or given == []:
        raise bad_request("Input must not be empty.", "input", "empty_input")
    try:
        messages = responses_to_messages(body)
    except RequestTranslationError as exc:
        raise bad_request(str(exc), exc.param) from None
    return Generation(
        model=body["model"], messages=messages,
        plain_input=given if isinstance(given, str) and not body.get("instructions") else None,
        max_tokens=body.get("max_output_tokens"), temperature=body.get("temperature"), top_p=body.get("top_p"),
        user=body.get("user"), logprobs=wants_logprobs(body), top_k_logprobs=body.get("top_logprobs") or 0,
        stream=bool(body.get("stream")), extensions=vendor_extensions(body),
    )


def generation_from_chat(body: dict[str, Any]) -> Generation:
    _validate(ChatCompletionRequest, body)
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
    )


def generation_from_completions(body: dict[str, Any]) -> Generation:
    _validate(CompletionRequest, body)
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
