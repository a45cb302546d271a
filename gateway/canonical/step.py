"""What every dialect's parser yields and every streaming translator consumes: one step of generation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.logprobs.report import TranslationReport
from gateway.logprobs.tokens import Token


class UpstreamFormatError(ValueError):
    """The upstream's body is not the shape its dialect promises (raised by parsers, and by translators
    when a sequence of well-formed steps is not a well-formed answer)."""


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A tool call, or a piece of one in a stream: `index` says which call of the message it extends.

    `id` and `name` come with a call's first piece; `arguments` is the JSON text (or the piece of it).
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class Step:
    """One upstream step (a whole response, or one stream chunk) in canonical form.

    `prompt_tokens` holds echoed prompt tokens (legacy completions `echo`), `prompt_text` their text.
    `tokens` are the message text's own; a reasoning model's thinking comes as `reasoning` with
    its tokens set aside in `reasoning_tokens`, and tool calls as `tool_calls` (their tokens are
    dropped: a function call item has no logprobs).
    """

    text: str = ""
    tokens: list[Token] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_text: str | None = None
    prompt_tokens: list[Token] | None = None
    report: TranslationReport | None = None  # what parsing had to repair (for metrics)
    reasoning: str | None = None  # None: not a reasoning step; "" is one whose text is still held back
    reasoning_tokens: list[Token] = field(default_factory=list)
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
