"""What every dialect hands the server loop: the upstream request and how to read its answer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError
from gateway.logprobs.parse import ParseOptions
from gateway.logprobs.report import TranslationReport
from gateway.logprobs.tokens import Token


class UpstreamFormatError(ValueError):
    """The upstream's body is not the shape its dialect promises."""


@dataclass(slots=True)
class Step:
    """One upstream step (a whole response, or one stream chunk) in canonical form.

    `prompt_tokens` holds echoed prompt tokens (legacy completions `echo`), `prompt_text` their text.
    """

    text: str = ""
    tokens: list[Token] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_text: str | None = None
    prompt_tokens: list[Token] | None = None
    report: TranslationReport | None = None  # what parsing had to repair (for metrics)


StepParser = Callable[[Mapping[str, Any], ParseOptions, bool], Step]


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """A request to send (`path` under the upstream's base URL) and its parser.

    `parse(payload, options, streaming)` reads one JSON body or stream event into a Step.
    """

    path: str
    body: dict[str, Any]
    parse: StepParser


def unsupported(message: str, param: str) -> GatewayError:
    """Honest refusal: the route cannot give what was asked; never silently return less."""
    return GatewayError(400, message, param=param, code="unsupported_parameter")
