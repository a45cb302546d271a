"""Request validation and parameter resolution with vLLM's rules and error messages.

Checks run in vLLM's order: body validators (400), model name (404), prompt length and
max_tokens (400). What vLLM's engine checks when the request is added (`engine_check`: the
logprob caps and `logit_bias` ids, vllm/v1/engine/input_processor.py `_validate_logprobs` and
`_validate_logit_bias`) comes later: a whole request still gets a 400, but a streamed one is
already answering 200 by then, so the error arrives in band (see `vllm.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.simulator.base import OpenAIError, flag, is_int
from gateway.simulator.prompt import ChatMLRenderer, message_text, reply_key

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens default when the field is absent


class RequestError(OpenAIError):
    """A request vLLM would refuse, in vLLM's current ErrorResponse: `code` is the HTTP status (an int).

    Older vLLM (before ~0.10) sent a flat `{"object": "error", "message", "type", "param", "code"}`.
    """

    def __init__(
        self, message: str, *, param: str | None = None, status: int = 400, kind: str = "BadRequestError"
    ) -> None:
        super().__init__(message, status=status, param=param, code=status, kind=kind)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Server-side settings that validation depends on (vLLM CLI flags)."""

    model: str
    max_model_len: int
    max_logprobs: int  # --max-logprobs; -1 = no cap
    vocab_size: int  # what top_logprobs=-1 / logprobs=-1 expands to
    return_tokens_as_token_ids: bool  # --return-tokens-as-token-ids (per-request field overrides)


@dataclass(frozen=True, slots=True)
class GenRequest:
    """A validated generation request, the same shape for chat and completions."""

    endpoint: Literal["chat", "completions"]
    stream: bool
    include_usage: bool
    continuous_usage: bool
    prompt_ids: list[int]
    prompt_text: str  # completions: the prompt as text (echo); chat: ""
    reply_key: str | None  # looked up in the scripted replies
    echo_text: str | None  # chat echo: the last message's text when it is the assistant's, else None
    echo: bool  # completions echo
    max_tokens: int  # tokens to generate (completions echo-only requests generate 1, show 0)
    echo_only: bool  # completions echo with max_tokens=0
    ignore_eos: bool
    logprobs: int | None  # chat top_logprobs / completions logprobs; None = no logprobs
    prompt_logprobs: int | None
    as_ids: bool
    return_token_ids: bool
    stream_interval: int | None
    logit_bias_ids: tuple[int, ...] = ()


def _int_or_none(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"`{name}` must be an integer.", param=name)
    return int(value)


def _check_stream_options(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    stream = flag(body, "stream")
    options = body.get("stream_options")
    if options and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.", param="stream_options")
    if options is None or not stream:
        return stream, False, False
    if not isinstance(options, Mapping):
        raise RequestError("stream_options must be an object.", param="stream_options")
    include_usage = bool(options.get("include_usage", True))  # StreamOptions.include_usage defaults True
    return stream, include_usage, include_usage and bool(options.get("continuous_usage_stats"))


def _check_prompt_logprobs(body: Mapping[str, Any], stream: bool) -> int | None:
    value = _int_or_none(body, "prompt_logprobs")
    if value is not None:
        if stream and (value > 0 or value == -1):
            raise RequestError("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        if value < 0 and value != -1:
            raise RequestError("`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
    return value


def _check_model(body: Mapping[str, Any], limits: ServerLimits) -> None:
    model = body.get("model")
    if model is not None and model != limits.model:
        raise RequestError(f"The model `{model}` does not exist.", param="model", status=404, kind="NotFoundError")


def _check_n(body: Mapping[str, Any]) -> None:
    n = body.get("n")
    if n not in (None, 1):
        raise RequestError("simulator limitation: only n=1 is supported", param="n")


def _check_shared(
    body: Mapping[str, Any], limits: ServerLimits, stream: bool, logprobs: int | None
) -> tuple[int | None, bool]:
    """(prompt_logprobs, echo), then the model name and `n`: what chat and completions check alike, in order.

    With `echo` and no `prompt_logprobs` of its own, a request gets as many prompt logprobs as its
    `logprobs` (`to_sampling_params` of both ChatCompletionRequest and CompletionRequest).
    """
    prompt_logprobs = _check_prompt_logprobs(body, stream)
    echo = flag(body, "echo")
    if prompt_logprobs is None and echo:
        prompt_logprobs = logprobs
    _check_model(body, limits)
    _check_n(body)
    return prompt_logprobs, echo


def engine_check(gen: GenRequest, limits: ServerLimits) -> RequestError | None:
    """What vLLM's InputProcessor refuses when the engine takes the request (None: nothing).

    Wording from vllm/v1/engine/input_processor.py (`_validate_logprobs`, then `_validate_logit_bias`:
    "token_id(s) [ids] in logit_bias contain out-of-vocab token ids. Vocabulary size: N")."""
    cap = limits.vocab_size if limits.max_logprobs == -1 else limits.max_logprobs
    for kind, value in (("sample", gen.logprobs), ("prompt", gen.prompt_logprobs)):
        if not value:
            continue
        wanted = limits.vocab_size if value == -1 else value
        if wanted > cap:
            return RequestError(
                f"Requested {kind} logprobs of {wanted}, which is greater than max allowed: {cap}",
                param="logprobs" if kind == "sample" else "prompt_logprobs",
            )
    invalid = [i for i in gen.logit_bias_ids if i < 0 or i >= limits.vocab_size]
    if invalid:
        return RequestError(
            f"token_id(s) {invalid} in logit_bias contain out-of-vocab token ids. Vocabulary size: {limits.vocab_size}",
            param="logit_bias",
        )
    return None


def _logit_bias_ids(body: Mapping[str, Any]) -> tuple[int, ...]:
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, Mapping):
        raise RequestError("`logit_bias` must be an object mapping token ids to biases.", param="logit_bias")
    try:
        return tuple(int(key) for key in bias)
    except ValueError:
        raise RequestError("`logit_bias` keys must be token ids.", param="logit_bias") from None


def _resolve_max_tokens(requested: int | None, prompt_len: int, limits: ServerLimits, param: str) -> int:
    # vLLM's context-length refusals: the prompt alone (vllm/entrypoints/openai/serving_engine.py
    # `_validate_input`, "However, your request has T input tokens. Please reduce the length of the
    # input messages."), and prompt + max_tokens (vllm/renderers/params.py from v0.18, "However, you
    # requested M output tokens and your prompt contains T input tokens, for a total of ...").
    room = limits.max_model_len - prompt_len
    if room <= 0:
        raise RequestError(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            param="input_tokens",
        )
    if requested is None:
        return room
    if requested < 1:
        raise RequestError(f"max_tokens must be at least 1, got {requested}.", param=param)
    if requested > room:
        raise RequestError(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, you requested "
            f"{requested} output tokens and your prompt contains {prompt_len} input tokens, for a total of "
            f"{prompt_len + requested} tokens. Please reduce the length of the input prompt or the number "
            "of requested output tokens.",
            param=param,
        )
    return requested


def parse_chat(body: Mapping[str, Any], limits: ServerLimits, renderer: ChatMLRenderer) -> GenRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, Mapping) for m in messages):
        raise RequestError("`messages` must be a non-empty list of message objects.", param="messages")
    stream_options = _check_stream_options(body)
    stream = stream_options[0]
    logprobs_flag = flag(body, "logprobs")
    top = _int_or_none(body, "top_logprobs") if "top_logprobs" in body else 0
    if top is not None:
        if top < 0 and top != -1:
            raise RequestError("`top_logprobs` must be a positive value or -1.", param="top_logprobs")
        if (top == -1 or top > 0) and not logprobs_flag:
            raise RequestError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    prompt_logprobs, echo = _check_shared(body, limits, stream, top)

    try:
        prompt_ids = renderer.prompt_ids(messages)
        last = messages[-1]
        echo_text = message_text(last.get("content")) if echo and last.get("role") == "assistant" else None
        key = reply_key(messages)
    except ValueError as exc:
        raise RequestError(str(exc), param="messages") from None
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    requested = _int_or_none(body, param)
    max_tokens = _resolve_max_tokens(requested, len(prompt_ids), limits, param)
    # vLLM only renders logprobs when `logprobs` is true *and* top_logprobs is not null.
    logprobs = top if logprobs_flag and top is not None else None
    return GenRequest(
        endpoint="chat",
        **_shared_fields(body, limits, stream_options),
        prompt_ids=prompt_ids,
        prompt_text="",
        reply_key=key,
        echo_text=echo_text,
        echo=False,
        max_tokens=max_tokens,
        echo_only=False,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


def parse_completions(
    body: Mapping[str, Any],
    limits: ServerLimits,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
) -> GenRequest:
    prompt = body.get("prompt")
    if prompt is None or prompt == "" or prompt == []:
        raise RequestError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        prompt_text, prompt_ids = prompt, encode(prompt)
    elif isinstance(prompt, list) and all(is_int(t) for t in prompt):
        prompt_ids = list(prompt)
        prompt_text = decode(prompt_ids)
    else:
        raise RequestError("simulator limitation: `prompt` must be one string or one list of token ids", param="prompt")
    stream_options = _check_stream_options(body)
    stream = stream_options[0]
    logprobs = _int_or_none(body, "logprobs")
    if logprobs is not None and logprobs < 0 and logprobs != -1:
        raise RequestError("`logprobs` must be a positive value or -1.", param="logprobs")
    prompt_logprobs, echo = _check_shared(body, limits, stream, logprobs)

    requested = _int_or_none(body, "max_tokens")
    if "max_tokens" not in body:
        # The field's default is 16; an explicit null means "up to the context length", as in
        # vLLM's get_max_tokens (it takes the smallest of the non-None limits).
        requested = COMPLETIONS_DEFAULT_MAX_TOKENS
    echo_only = echo and requested == 0
    # vLLM runs an echo-only request as a 1-token generation and shows only the prompt.
    max_tokens = _resolve_max_tokens(1 if echo_only else requested, len(prompt_ids), limits, "max_tokens")
    return GenRequest(
        endpoint="completions",
        **_shared_fields(body, limits, stream_options),
        prompt_ids=prompt_ids,
        prompt_text=prompt_text,
        reply_key=prompt_text,
        echo_text=None,
        echo=echo,
        max_tokens=max_tokens,
        echo_only=echo_only,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


def _shared_fields(
    body: Mapping[str, Any], limits: ServerLimits, stream_options: tuple[bool, bool, bool]
) -> dict[str, Any]:
    """GenRequest fields that chat and completions read the same way."""
    stream, include_usage, continuous = stream_options
    return {
        "stream": stream,
        "include_usage": include_usage,
        "continuous_usage": continuous,
        "ignore_eos": flag(body, "ignore_eos"),
        "as_ids": _as_ids(body, limits),
        "return_token_ids": flag(body, "return_token_ids"),
        "stream_interval": _stream_interval(body),
        "logit_bias_ids": _logit_bias_ids(body),
    }


def _as_ids(body: Mapping[str, Any], limits: ServerLimits) -> bool:
    value = body.get("return_tokens_as_token_ids")
    return limits.return_tokens_as_token_ids if value is None else bool(value)


def _stream_interval(body: Mapping[str, Any]) -> int | None:
    value = _int_or_none(body, "stream_interval")
    if value is not None and value < 1:
        raise RequestError("`stream_interval` must be >= 1.", param="stream_interval")
    return value
