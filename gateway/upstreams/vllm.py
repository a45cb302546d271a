"""vLLM's chat and completions wire format -> canonical steps.

We always send `return_tokens_as_token_ids`, so with a tokenizer every token (sampled and
alternative) is a `token_id:N` placeholder whose bytes are exact; vLLM's own `bytes` (UTF-8 of a
lossy decode) are never used then. Without a tokenizer the lossy strings are aligned against the
final text (non-streaming) — see gateway/logprobs/parse.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.logprobs.parse import LogprobParseError, ParseOptions, parse_chat, parse_completions
from gateway.logprobs.tokens import Token


class UpstreamFormatError(ValueError):
    """The upstream's body is not the shape its dialect promises."""


@dataclass(slots=True)
class Step:
    """One upstream step (a whole response, or one stream chunk) in canonical form."""

    text: str = ""
    tokens: list[Token] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


def _choice(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise UpstreamFormatError("upstream body has no choices list")
    if not choices:
        return None  # the usage-only chunk at the end of a stream
    if not isinstance(choices[0], Mapping):
        raise UpstreamFormatError("upstream choice is not an object")
    return choices[0]


def _usage(body: Mapping[str, Any]) -> dict[str, Any] | None:
    usage = body.get("usage")
    return usage if isinstance(usage, dict) else None


def _logprobs_or_fail(parse, *args: Any) -> list[Token]:
    try:
        return parse(*args).tokens
    except LogprobParseError as exc:
        raise UpstreamFormatError(f"upstream logprobs unreadable: {exc}") from None


def chat_step(body: Mapping[str, Any], options: ParseOptions, *, streaming: bool) -> Step:
    """A chat completion (or chunk) -> Step."""
    choice = _choice(body)
    if choice is None:
        return Step(usage=_usage(body))
    container = choice.get("delta" if streaming else "message") or {}
    text = container.get("content") or ""
    if not isinstance(text, str):
        raise UpstreamFormatError("upstream content is not a string")
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    # Non-streamed text bounds lossy tokens; a chunk's text may lag its tokens (held-back bytes).
    tokens = _logprobs_or_fail(parse_chat, content, options, None if streaming or options.vocab else text)
    return Step(text, tokens, choice.get("finish_reason"), _usage(body))


def completions_step(body: Mapping[str, Any], options: ParseOptions, *, streaming: bool) -> Step:
    """A completion (or chunk) -> Step."""
    choice = _choice(body)
    if choice is None:
        return Step(usage=_usage(body))
    text = choice.get("text") or ""
    if not isinstance(text, str):
        raise UpstreamFormatError("upstream text is not a string")
    logprobs = choice.get("logprobs")
    tokens: list[Token] = []
    if isinstance(logprobs, Mapping):
        tokens = _logprobs_or_fail(parse_completions, logprobs, options,
                                   None if streaming or options.vocab else text)
    return Step(text, tokens, choice.get("finish_reason"), _usage(body))


def error_message(body: Any, status: int) -> str:
    """vLLM's error body (`{"error": {...}}`, or the older `{"object": "error", "message"}`) -> text."""
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(body.get("message"), str):
            return body["message"]
    return f"upstream answered HTTP {status}"
