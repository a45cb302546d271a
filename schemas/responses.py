"""Responses API output (``/v1/responses``): the response object and the stream events we emit.

Two contracts bind these shapes: the OpenAI Python SDK (``openai.types.responses``) and the Open
Responses spec (``ResponseResource``, ``LogProb``, the ``*StreamingEvent`` schemas). Every model
here satisfies both (so do the parts shared with requests, in ``schemas.responses_common`` and
re-exported here). Where they differ we take the stricter side:

- ``Response`` keys: the spec requires 31 keys, the SDK 8 (typed tighter). We always send all of
  them and keep non-null what the spec keeps non-null (``temperature``, ``top_p``,
  ``presence_penalty``, ``frequency_penalty``, ``top_logprobs``, ``truncation``, ``text``,
  ``store``, ``background``, ``service_tier``), with the SDK's value sets. ``user`` is SDK-only:
  sent too (``null`` when unset).
- Timestamps: integers (spec); the SDK would take floats.
- ``error.code``: any string for the spec, a fixed enum for the SDK: the enum.
- ``incomplete_details.reason``: a required string for the spec, an optional enum for the SDK:
  required, and one of the two reasons a chat/completions upstream can cause.
- ``reasoning``: the spec requires both ``effort`` and ``summary`` keys (nullable) and knows fewer
  efforts than the SDK (no ``minimal``/``max``): the spec's set. Requests may still say
  ``minimal``/``max`` (``schemas.responses_request``); echo them as the nearest spec value.
- ``text``: the spec requires ``format`` and a non-null ``verbosity``: both always sent.
- ``text.format`` json_schema: the spec types ``schema`` as ``null`` (an error in the spec) while
  the SDK needs an object: the object. Only a response to a json_schema request is affected.
- Function tools: the spec requires ``description``, ``parameters`` and ``strict`` (nullable),
  the SDK makes them optional: always sent. ``allowed_tools`` mode: ``auto``|``required`` (the
  SDK's; the spec also allows ``none``).
- ``output_text.logprobs``: optional in both, always present on the real wire: required, ``[]``
  when logprobs were not asked for.
- Function-call items: the spec requires ``id`` and ``status``, the SDK does not: required.
- Logprobs in ``response.output_text.delta``/``.done``: the spec requires ``bytes`` on each entry
  and its candidates; the SDK has no such key but keeps extra keys: the same ``LogProb`` as the
  final content part.
- ``output_item.added``/``.done``: the spec allows ``item: null``, the SDK does not: required.
- ``error`` event: the spec nests ``{type, code, message, param}`` under ``error``; the SDK reads
  ``code``/``message``/``param`` at the top level. We send both. Caveat: the SDK's SSE decoder
  raises ``openai.APIError`` on any frame with a truthy top-level ``error`` key, so SDK users get
  that exception (with this payload) instead of an ``error`` event object.
- ``obfuscation`` padding on deltas: optional in the spec, unknown to the SDK; we don't pad.
- Reasoning text events: the SDK knows ``response.reasoning_text.delta``/``.done``, the spec names
  the same shapes ``response.reasoning.delta``/``.done``; each side rejects the other's name
  (the SDK's strict client raises on an unknown event type). We send the SDK's names, which
  OpenAI, vLLM and OpenRouter send; the shapes meet both.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ._base import ContractModel, tagged_union
from .responses_common import (  # noqa: F401 (re-exported: `from schemas.responses import X` works)
    CustomTool,
    FunctionName,
    FunctionTool,
    Index,
    ItemStatus,
    LogProb,
    NamespaceTool,
    OutputRefusal,
    OutputText,
    ReasoningSummary,
    ReasoningText,
    SummaryText,
    TextConfig,
    TextFormat,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    TextFormatText,
    ToolChoice,
    ToolChoiceAllowed,
    ToolChoiceFunction,
    ToolChoiceOptions,
    TopLogProb,
    UrlCitation,
)

Count = Annotated[int, Field(ge=0)]

ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]
ServiceTier = Literal["auto", "default", "flex", "priority"]
"""The spec's tiers; the SDK also knows ``scale``, ``fast``, ``ultrafast``."""


# --- output items ---------------------------------------------------------------------------

OutputContent = tagged_union("type", {"output_text": OutputText, "refusal": OutputRefusal})


class OutputMessage(ContractModel):
    """An assistant message in ``response.output``."""

    id: str
    """``msg_...``; the ``item_id`` of its stream events."""
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputContent]


class FunctionCall(ContractModel):
    """A tool call the model made; the client runs it and sends a ``function_call_output`` back."""

    id: str
    """``fc_...``; the ``item_id`` of its stream events."""
    type: Literal["function_call"] = "function_call"
    call_id: str
    """``call_...``; what the client's ``function_call_output`` refers to."""
    name: str
    arguments: str
    """The arguments as a JSON string, as the model wrote them."""
    status: ItemStatus
    namespace: str | None = None
    """The ``namespace`` tool the function belongs to; absent for an ungrouped function."""


class CustomToolCall(ContractModel):
    """A call to a ``custom`` tool: its free-form ``input`` (the SDK's ``ResponseCustomToolCall``).

    Not in the Open Responses spec, which has no custom tools: only a request that offered one gets it.
    """

    id: str
    """``ctc_...``; the ``item_id`` of its stream events."""
    type: Literal["custom_tool_call"] = "custom_tool_call"
    call_id: str
    name: str
    input: str
    status: ItemStatus
    namespace: str | None = None


class ReasoningItem(ContractModel):
    """A reasoning model's thinking; comes before the message. Its tokens are counted in
    ``usage.output_tokens_details.reasoning_tokens`` and never appear in any logprobs."""

    id: str
    """``rs_...``; the ``item_id`` of its stream events."""
    type: Literal["reasoning"] = "reasoning"
    summary: list[SummaryText] = Field(default_factory=list)
    """Always ``[]``: chat upstreams give the thinking, not a summary of it."""
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus


OutputItem = tagged_union(
    "type", {"message": OutputMessage, "function_call": FunctionCall, "custom_tool_call": CustomToolCall,
             "reasoning": ReasoningItem}
)

EchoedTool = tagged_union("type", {"function": FunctionTool, "namespace": NamespaceTool, "custom": CustomTool})
"""A tool the model was offered, as the request gave it (hosted tools the upstream cannot run are not)."""


# --- echoed configuration -------------------------------------------------------------------


class Reasoning(ContractModel):
    """``reasoning`` as echoed in a response."""

    effort: Literal["none", "low", "medium", "high", "xhigh"] | None = None
    summary: ReasoningSummary | None = None


# --- response -------------------------------------------------------------------------------


class InputTokensDetails(ContractModel):
    cached_tokens: Count = 0
    cache_write_tokens: Count = 0
    """Required by the SDK since 2.45; ``0`` when the upstream does not say."""


class OutputTokensDetails(ContractModel):
    reasoning_tokens: Count = 0


class Usage(ContractModel):
    """Token counts; ``total_tokens == input_tokens + output_tokens``."""

    input_tokens: Count
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: Count
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: Count


class ResponseError(ContractModel):
    """Why a response failed (``status: "failed"``)."""

    code: Literal[
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "data_residency_mismatch",
        "bio_policy",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    ]
    """The SDK's closed set; upstream failures are ``server_error``."""
    message: str


class IncompleteDetails(ContractModel):
    reason: Literal["max_output_tokens", "content_filter"]
    """Upstream ``finish_reason`` ``length`` and ``content_filter`` respectively."""


class Response(ContractModel):
    """The response object: the body of a non-streaming reply and every event's snapshot."""

    id: str
    """``resp_`` followed by hex digits."""
    object: Literal["response"] = "response"
    created_at: int
    """Unix seconds."""
    completed_at: int | None = None
    """Unix seconds; set only when ``status`` is ``completed``."""
    status: ResponseStatus
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem]
    usage: Usage | None = None
    """``None`` until the response is finished."""

    # What the request asked for, echoed (the request's values or these defaults).
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[EchoedTool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = None
    text: TextConfig = Field(default_factory=TextConfig)
    reasoning: Reasoning | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: Annotated[int, Field(ge=0, le=20)] = 0
    max_output_tokens: int | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    store: bool = True
    background: bool = False
    service_tier: ServiceTier = "default"
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


# --- stream events --------------------------------------------------------------------------


class _Event(ContractModel):
    sequence_number: Index
    """Starts at 0 on ``response.created`` and grows by exactly 1 per event."""


class _SnapshotEvent(_Event):
    response: Response


class ResponseCreatedEvent(_SnapshotEvent):
    """First event of every stream; ``response.status`` is ``in_progress``, ``output`` empty."""

    type: Literal["response.created"] = "response.created"


class ResponseInProgressEvent(_SnapshotEvent):
    type: Literal["response.in_progress"] = "response.in_progress"


class ResponseCompletedEvent(_SnapshotEvent):
    """Terminal: the full response, ``status: completed``."""

    type: Literal["response.completed"] = "response.completed"


class ResponseIncompleteEvent(_SnapshotEvent):
    """Terminal: the full response, ``status: incomplete`` with ``incomplete_details``."""

    type: Literal["response.incomplete"] = "response.incomplete"


class ResponseFailedEvent(_SnapshotEvent):
    """Terminal: the response so far, ``status: failed`` with ``error``."""

    type: Literal["response.failed"] = "response.failed"


class _ItemEvent(_Event):
    output_index: Index
    item: OutputItem


class OutputItemAddedEvent(_ItemEvent):
    """An output item starts (a message with ``content: []``, ``status: in_progress``)."""

    type: Literal["response.output_item.added"] = "response.output_item.added"


class OutputItemDoneEvent(_ItemEvent):
    """An output item is final (``status`` ``completed`` or ``incomplete``)."""

    type: Literal["response.output_item.done"] = "response.output_item.done"


PartContent = tagged_union(
    "type", {"output_text": OutputText, "refusal": OutputRefusal, "reasoning_text": ReasoningText}
)


class _PartEvent(_Event):
    item_id: str
    output_index: Index
    content_index: Index
    part: PartContent


class ContentPartAddedEvent(_PartEvent):
    """A content part starts (``output_text`` with ``text: ""``, ``logprobs: []``)."""

    type: Literal["response.content_part.added"] = "response.content_part.added"


class ContentPartDoneEvent(_PartEvent):
    """A content part is final, with all its logprobs."""

    type: Literal["response.content_part.done"] = "response.content_part.done"


class OutputTextDeltaEvent(_Event):
    """Text appended to a part, with the logprobs of exactly the tokens it came from.

    ``delta`` is valid UTF-8 text, so a token ending mid-character may give ``delta: ""`` and its
    logprob entry; the character appears in the delta of the token that completes it.
    """

    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: Index
    content_index: Index
    delta: str
    logprobs: list[LogProb]


class OutputTextDoneEvent(_Event):
    """A text part is final: the whole text and all its logprobs."""

    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: Index
    content_index: Index
    text: str
    logprobs: list[LogProb]


class ReasoningTextDeltaEvent(_Event):
    """Thinking text appended to a reasoning item's ``reasoning_text`` part; no logprobs."""

    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    item_id: str
    output_index: Index
    content_index: Index
    delta: str


class ReasoningTextDoneEvent(_Event):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    item_id: str
    output_index: Index
    content_index: Index
    text: str


class FunctionCallArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: Index
    delta: str


class FunctionCallArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: Index
    name: str
    """Not in either schema but sent by OpenAI, and required by older SDKs."""
    arguments: str


class CustomToolCallInputDeltaEvent(_Event):
    """Input text appended to a custom tool call (decoded from the upstream's streamed arguments)."""

    type: Literal["response.custom_tool_call_input.delta"] = "response.custom_tool_call_input.delta"
    item_id: str
    output_index: Index
    delta: str


class CustomToolCallInputDoneEvent(_Event):
    type: Literal["response.custom_tool_call_input.done"] = "response.custom_tool_call_input.done"
    item_id: str
    output_index: Index
    input: str


class ErrorPayload(ContractModel):
    type: str
    """The error class, e.g. ``server_error``."""
    code: str | None = None
    message: str
    param: str | None = None


class ErrorEvent(_Event):
    """A failure during the stream; usually followed by ``response.failed``.

    Carries the error twice: flat (SDK) and under ``error`` (spec). Give either; the other is
    filled in.
    """

    type: Literal["error"] = "error"
    code: str | None = None
    message: str
    param: str | None = None
    error: ErrorPayload

    @model_validator(mode="before")
    @classmethod
    def _fill_both_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        nested = data.get("error")
        if nested is None and "message" in data:
            data["error"] = {
                "type": "server_error",
                "code": data.get("code"),
                "message": data["message"],
                "param": data.get("param"),
            }
        elif isinstance(nested, dict | ErrorPayload):
            payload = nested if isinstance(nested, dict) else nested.model_dump()
            for key in ("code", "message", "param"):
                data.setdefault(key, payload.get(key))
        return data

    @model_validator(mode="after")
    def _spellings_agree(self) -> ErrorEvent:
        flat = (self.code, self.message, self.param)
        if flat != (self.error.code, self.error.message, self.error.param):
            raise ValueError("top-level code/message/param must equal those under 'error'")
        return self


ResponseStreamEvent = tagged_union(
    "type",
    {
        "response.created": ResponseCreatedEvent,
        "response.in_progress": ResponseInProgressEvent,
        "response.output_item.added": OutputItemAddedEvent,
        "response.content_part.added": ContentPartAddedEvent,
        "response.output_text.delta": OutputTextDeltaEvent,
        "response.output_text.done": OutputTextDoneEvent,
        "response.reasoning_text.delta": ReasoningTextDeltaEvent,
        "response.reasoning_text.done": ReasoningTextDoneEvent,
        "response.content_part.done": ContentPartDoneEvent,
        "response.function_call_arguments.delta": FunctionCallArgumentsDeltaEvent,
        "response.function_call_arguments.done": FunctionCallArgumentsDoneEvent,
        "response.custom_tool_call_input.delta": CustomToolCallInputDeltaEvent,
        "response.custom_tool_call_input.done": CustomToolCallInputDoneEvent,
        "response.output_item.done": OutputItemDoneEvent,
        "response.completed": ResponseCompletedEvent,
        "response.incomplete": ResponseIncompleteEvent,
        "response.failed": ResponseFailedEvent,
        "error": ErrorEvent,
    },
)
"""Any event we emit, told apart by ``type``."""
