"""What every dialect hands the server loop: the upstream request and how to read its answer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError
from gateway.logprobs.body_scan import load_json
from gateway.logprobs.parse import ParseOptions
from gateway.logprobs.report import TranslationReport
from gateway.logprobs.tokens import Token


class UpstreamFormatError(ValueError):
    """The upstream's body is not the shape its dialect promises."""


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


StepParser = Callable[[Mapping[str, Any], ParseOptions, bool], Step]
BodyLoader = Callable[[bytes, ParseOptions], Any]
ChunkReader = Callable[[bytes, ParseOptions], "Step | None"]


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """A request to send (`path` under the upstream's base URL) and how to read its answer.

    `load(raw, options)` reads one JSON body or stream event's bytes (orjson, unless the dialect has
    a faster reader); `parse(payload, options, streaming)` turns what it gives into a Step.
    `read_chunk(raw, options)`, where a dialect has one, reads a stream event of its common shape
    straight to the Step `parse` would make (None: not that shape).
    """

    path: str
    body: dict[str, Any]
    parse: StepParser
    load: BodyLoader = load_json
    read_chunk: ChunkReader | None = None

    def read(self, raw: bytes, options: ParseOptions, streaming: bool) -> Step:
        """One body or stream event's bytes -> a Step."""
        if streaming and self.read_chunk is not None:
            step = self.read_chunk(raw, options)
            if step is not None:
                return step
        return self.parse(self.load(raw, options), options, streaming=streaming)


def unsupported(message: str, param: str) -> GatewayError:
    """Honest refusal: the route cannot give what was asked; never silently return less."""
    return GatewayError(400, message, param=param, code="unsupported_parameter")
