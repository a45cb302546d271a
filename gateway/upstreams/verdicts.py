"""An upstream's own refusal, read from any server's error spelling, as the error the client gets.

The status says who is at fault (OpenAI's contract): a 4xx the upstream gave a request keeps its
status and the upstream's message, so clients do not retry what can never succeed; a 429 stays a
429 with its `Retry-After`; 401/403 mean the gateway's own upstream credential is wrong (a 502,
never the client's fault, unless the client's key is what was forwarded); a 5xx is the server's.
The same verdict arrives *in band* too: vLLM answers some invalid streamed requests with HTTP 200
and a `data: {"error": {..., "code": 400}}` frame.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.canonical.step import UpstreamFormatError
from gateway.errors import GatewayError

# Context-length refusals, by server. Each pattern is the fixed part of the server's own message.
CONTEXT_LENGTH_PATTERNS = (
    # vLLM, every release since 0.2: "This model's maximum context length is N tokens. However, ..."
    # (vllm/entrypoints/openai/serving_engine.py `_validate_input` up to v0.17; vllm/renderers/params.py
    # from v0.18; "'max_tokens' or 'max_completion_tokens' is too large: M. This model's maximum
    # context length is N tokens and your request has T input tokens" in between).
    re.compile(r"maximum context length is \d+ tokens"),
    # vLLM's renderer length checks (vllm/renderers/params.py `_token_len_check`/`_text_len_check`):
    # "You passed T input tokens and requested M output tokens. However, the model's context length
    # is only N tokens, resulting in a maximum input length of I tokens."
    re.compile(r"the model's context length is only \d+ tokens"),
    # SGLang (python/sglang/srt/managers/tokenizer_manager.py `_validate_one_request`):
    # "The input (T tokens) is longer than the model's context length (N tokens)." and
    # "Requested token count exceeds the model's maximum context length of N tokens. ..."
    re.compile(r"is longer than the model's context length \(\d+ tokens\)"),
    re.compile(r"exceeds the model's maximum context length of \d+ tokens"),
    # TGI (router/src/validation.rs `ValidationError::MaxTotalTokens` / `InputLength`):
    # "`inputs` tokens + `max_new_tokens` must be <= N. Given: ..." / "`inputs` must have less than N tokens."
    re.compile(r"`inputs` tokens \+ `max_new_tokens` must be <= \d+"),
    re.compile(r"`inputs` must have less than \d+ tokens"),
    # llama.cpp (tools/server/server-context.cpp, sent with ERROR_TYPE_EXCEED_CONTEXT_SIZE, whose type
    # server-common.cpp `format_error_response` spells "exceed_context_size_error"):
    # "the request exceeds the available context size, try increasing it" (and "request (T tokens)
    # exceeds the available context size (N tokens), try increasing it" in newer builds).
    re.compile(r"exceeds the available context size"),
)
CONTEXT_LENGTH_TYPES = frozenset({"exceed_context_size_error", "context_length_exceeded"})

# What an upstream's `param` (or a backticked name in its message) is called at each front door.
_PARAM_NAMES: dict[str, dict[str, str]] = {
    "responses": {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
                  "max_new_tokens": "max_output_tokens", "n_predict": "max_output_tokens",
                  "messages": "input", "prompt": "input", "inputs": "input", "input_tokens": "input",
                  "input_text": "input", "logprobs": "top_logprobs", "top_n_tokens": "top_logprobs",
                  "n_probs": "top_logprobs", "response_format": "text.format"},
    "chat": {"max_new_tokens": "max_tokens", "n_predict": "max_tokens", "prompt": "messages", "inputs": "messages",
             "input_tokens": "messages", "input_text": "messages", "top_n_tokens": "top_logprobs",
             "n_probs": "top_logprobs", "logprobs": "top_logprobs"},  # vLLM names its cap on k `logprobs`
    "completions": {"max_completion_tokens": "max_tokens", "max_new_tokens": "max_tokens", "n_predict": "max_tokens",
                    "messages": "prompt", "inputs": "prompt", "input_tokens": "prompt", "input_text": "prompt",
                    "top_logprobs": "logprobs", "top_n_tokens": "logprobs", "n_probs": "logprobs"},
}
_INPUT_PARAM = {"responses": "input", "chat": "messages", "completions": "prompt"}
_BACKTICKED = re.compile(r"`([a-z_][a-z0-9_]*)`")
# TGI's `error_type` says what its status would have been (router/src/server.rs, `InferError`).
_TGI_TYPE_STATUS = {"validation": 422, "overloaded": 429, "generation": 500, "incomplete_generation": 500}


@dataclass(frozen=True, slots=True)
class UpstreamFault:
    """What an upstream error said, in any server's spelling: its status, text, param and type."""

    status: int
    message: str
    param: str | None = None
    kind: str | None = None  # the upstream's `type` / `error_type`
    code: str | None = None  # a string `code` (OpenAI's), where the upstream sent one

    @property
    def request_fault(self) -> bool:
        """The upstream judged the request itself: another replica would too, and it is no host failure."""
        return 400 <= self.status < 500 and self.status not in (401, 403, 408, 429)

    @property
    def context_length(self) -> bool:
        return self.kind in CONTEXT_LENGTH_TYPES or self.code == "context_length_exceeded" or any(
            pattern.search(self.message) for pattern in CONTEXT_LENGTH_PATTERNS)


class UpstreamRejected(UpstreamFormatError):
    """An upstream's in-band error frame (or error body) where a chunk or answer was expected.

    A subclass of UpstreamFormatError, so a reader that does not tell them apart still fails safe."""

    def __init__(self, fault: UpstreamFault) -> None:
        super().__init__(fault.message)
        self.fault = fault


def rejected(body: Any) -> UpstreamRejected:
    """The exception for an error object found where a chunk or an answer was expected (HTTP 200)."""
    return UpstreamRejected(read_fault(body, 200))


def read_fault(body: Any, status: int) -> UpstreamFault:
    """An error body or in-band frame -> UpstreamFault. `status` is the HTTP status (200 in band:
    then the frame's own `code`, TGI's `error_type` or, for a context-length text, 400 decide)."""
    error: Any = body.get("error") if isinstance(body, Mapping) else None
    fields: Mapping[str, Any] = error if isinstance(error, Mapping) else body if isinstance(body, Mapping) else {}
    message = error if isinstance(error, str) else fields.get("message")
    if not isinstance(message, str):
        detail = fields.get("detail")
        message = detail if isinstance(detail, str) else f"upstream answered HTTP {status}"
    kind = fields.get("type") if isinstance(fields.get("type"), str) else None
    if kind is None and isinstance(body, Mapping) and isinstance(body.get("error_type"), str):
        kind = body["error_type"]
    code = fields.get("code")
    param = fields.get("param") if isinstance(fields.get("param"), str) else None
    if status < 400:
        status = _in_band_status(code, kind, message)
    return UpstreamFault(status, message, param, kind, code if isinstance(code, str) else None)


def _in_band_status(code: Any, kind: str | None, message: str) -> int:
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code  # vLLM's ErrorResponse carries the HTTP status it would have sent
    if isinstance(code, str) and code.isdigit() and 400 <= int(code) <= 599:
        return int(code)
    if kind in _TGI_TYPE_STATUS:
        return _TGI_TYPE_STATUS[kind]
    if kind in ("BadRequestError", "invalid_request_error") or kind in CONTEXT_LENGTH_TYPES:
        return 400
    fault = UpstreamFault(500, message, kind=kind)
    return 400 if fault.context_length else 500


def client_param(fault: UpstreamFault, front_door: str) -> str | None:
    """The request field the upstream blamed, named as the client's front door names it."""
    param = fault.param
    if param is None and (match := _BACKTICKED.search(fault.message)):
        param = match.group(1)
    if param is None and fault.context_length:
        return _INPUT_PARAM.get(front_door)
    if param is None:
        return None
    return _PARAM_NAMES.get(front_door, {}).get(param, param)


def client_error(fault: UpstreamFault, upstream: str, front_door: str, *, forwarded_client_key: bool = False,
                 retry_after: str | None = None) -> GatewayError:
    """The error the client gets for an upstream's refusal (a 5xx: the gateway's 502)."""
    status = fault.status
    if status in (401, 403) and not forwarded_client_key:
        return GatewayError(502, f"upstream {upstream!r} rejected the gateway's own credential (HTTP {status}: "
                                 f"{fault.message}); check upstreams.{upstream}.api_key_env. This is not the "
                                 "client's fault.", type_="upstream_error", code="upstream_auth_failed")
    if status == 429:
        headers = {"Retry-After": retry_after} if retry_after else None
        return GatewayError(429, fault.message, type_="requests", code="rate_limit_exceeded", headers=headers)
    if status == 408 or status >= 500 or status < 400:
        return GatewayError(502, f"upstream {upstream!r} failed: {fault.message}", type_="upstream_error",
                            code="upstream_error")
    if fault.context_length:
        code = "context_length_exceeded"
    elif status in (401, 403):
        code = "invalid_api_key" if status == 401 else fault.code
    else:
        code = fault.code or ("model_not_found" if status == 404 else None)
    return GatewayError(status, fault.message, param=client_param(fault, front_door), code=code)
