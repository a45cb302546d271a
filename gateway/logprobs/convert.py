"""The six conversions between completions, chat and responses logprobs.

Each is parse (upstream spelling -> canonical) then render (canonical -> client spelling);
they are pure functions of their inputs, for use as a library and in the gateway alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from gateway.logprobs.parse import Parsed, ParseOptions, parse_chat, parse_completions, parse_responses
from gateway.logprobs.render import render_chat, render_completions, render_responses, visible_tokens


class LogprobFormat(Enum):
    COMPLETIONS = "completions"  # {tokens, token_logprobs, top_logprobs: [{token: lp}], text_offset}
    CHAT = "chat"  # {content: [{token, logprob, bytes, top_logprobs}]} -> the content list
    RESPONSES = "responses"  # output_text.logprobs: [{token, bytes, logprob, top_logprobs}]


def parse(payload: Any, source: LogprobFormat, options: ParseOptions, text: str | None = None) -> Parsed:
    if source is LogprobFormat.COMPLETIONS:
        return parse_completions(payload, options, text)
    if source is LogprobFormat.CHAT:
        return parse_chat(payload, options, text)
    return parse_responses(payload, options.vocab)


def render(tokens: Sequence[Any], target: LogprobFormat, k: int) -> Any:
    if target is LogprobFormat.COMPLETIONS:
        return render_completions(tokens, k)
    if target is LogprobFormat.CHAT:
        return render_chat(tokens, k)
    return render_responses(tokens, k)


def convert(
    payload: Any,
    source: LogprobFormat,
    target: LogprobFormat,
    k: int,
    options: ParseOptions | None = None,
    text: str | None = None,
) -> Any:
    """Reshape one logprob payload into another format, control tokens set aside."""
    parsed = parse(payload, source, options or ParseOptions(), text)
    return render(visible_tokens(parsed.tokens), target, k)


def chat_to_responses(content: Sequence[Mapping[str, Any]], k: int, options: ParseOptions | None = None,
                      text: str | None = None) -> list[dict[str, Any]]:
    return convert(content, LogprobFormat.CHAT, LogprobFormat.RESPONSES, k, options, text)


def chat_to_completions(content: Sequence[Mapping[str, Any]], k: int, options: ParseOptions | None = None,
                        text: str | None = None) -> dict[str, Any]:
    return convert(content, LogprobFormat.CHAT, LogprobFormat.COMPLETIONS, k, options, text)


def completions_to_chat(logprobs: Mapping[str, Any], k: int, options: ParseOptions | None = None,
                        text: str | None = None) -> list[dict[str, Any]]:
    return convert(logprobs, LogprobFormat.COMPLETIONS, LogprobFormat.CHAT, k, options, text)


def completions_to_responses(logprobs: Mapping[str, Any], k: int, options: ParseOptions | None = None,
                             text: str | None = None) -> list[dict[str, Any]]:
    return convert(logprobs, LogprobFormat.COMPLETIONS, LogprobFormat.RESPONSES, k, options, text)


def responses_to_chat(entries: Sequence[Mapping[str, Any]], k: int) -> list[dict[str, Any]]:
    return convert(entries, LogprobFormat.RESPONSES, LogprobFormat.CHAT, k)


def responses_to_completions(entries: Sequence[Mapping[str, Any]], k: int) -> dict[str, Any]:
    return convert(entries, LogprobFormat.RESPONSES, LogprobFormat.COMPLETIONS, k)
