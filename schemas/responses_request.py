"""The body of ``POST /v1/responses`` (OpenAI's ``CreateResponse``), validated at the edge.

Types are strict where OpenAI rejects: ``"top_logprobs": "3"`` or ``"stream": "true"`` fail,
while an integer is a fine number (``"temperature": 1``). Nested objects reject unknown keys
(OpenAI answers ``Unknown parameter: 'input[0].foo'``), but unknown top-level fields are kept:
vendor options such as ``top_k``, ``ignore_eos`` or ``repetition_penalty`` are forwarded to the
upstream server. ``extra_fields`` returns them.

Deliberate departures from OpenAI:

- ``max_output_tokens`` only needs to be >= 1. OpenAI (and the Open Responses spec) reject values
  below 16, but people scoring with vLLM ask for 4 tokens.
- Only what a Chat/Completions upstream can serve is accepted: message, ``function_call``,
  ``custom_tool_call`` and their ``*_output`` input items, ``item_reference`` (and ``reasoning`` items
  we returned, which are dropped); text, image and file parts (only text files reach the model);
  function, ``namespace`` and ``custom`` tools, and OpenAI's hosted tools, which each model's
  ``hosted_tools`` policy drops or refuses (``gateway.translate.tools``). Other item, part and tool
  types fail with ``invalid_value`` naming the supported ones.
- ``reasoning.effort`` and ``service_tier`` accept the SDK's values, which are more than the
  spec lets a response echo (see ``schemas.responses``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from ._base import ContractModel, tagged_union
from .responses_common import (
    CustomTool,
    FunctionTool,
    ItemStatus,
    NamespaceTool,
    OutputRefusal,
    OutputText,
    ReasoningSummary,
    ReasoningText,
    SummaryText,
    TextConfig,
    ToolChoice,
)

CallId = Annotated[str, Field(min_length=1, max_length=64)]

# `include` values OpenAI's API reference documents (the SDK's `ResponseIncludable`). Only the
# logprobs one changes what this gateway returns; the others name tools it does not run.
INCLUDABLE = (
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "message.input_image.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
)


# --- content parts --------------------------------------------------------------------------


class InputText(ContractModel):
    type: Literal["input_text"] = "input_text"
    text: str


class InputImage(ContractModel):
    """An image by URL (``https:`` or a base64 ``data:`` URL). Uploaded files are not supported."""

    type: Literal["input_image"] = "input_image"
    image_url: str
    detail: Literal["low", "high", "auto", "original"] = "auto"


class InputFile(ContractModel):
    """A file inline as ``file_data`` (base64, or a base64 ``data:`` URL); only text files reach the model
    (gateway/translate/input_files.py). ``file_id`` and ``file_url`` parse, and are refused there."""

    type: Literal["input_file"] = "input_file"
    file_data: str | None = None
    filename: str | None = None
    file_id: str | None = None
    file_url: str | None = None


UserContentPart = tagged_union("type", {"input_text": InputText, "input_image": InputImage, "input_file": InputFile})
# Prior assistant output sent back as history: the very parts we emitted.
AssistantContentPart = tagged_union("type", {"output_text": OutputText, "refusal": OutputRefusal})


# --- input items ----------------------------------------------------------------------------


class _Message(ContractModel):
    # `type` may be omitted: a bare {role, content} is a message (OpenAI's EasyInputMessage).
    type: Literal["message"] = "message"
    id: str | None = None
    status: ItemStatus | None = None


class UserMessage(_Message):
    role: Literal["user"] = "user"
    content: str | list[UserContentPart]


class SystemMessage(_Message):
    role: Literal["system"] = "system"
    content: str | list[InputText]


class DeveloperMessage(_Message):
    role: Literal["developer"] = "developer"
    content: str | list[InputText]


class AssistantMessage(_Message):
    """An earlier assistant turn, as text or as the ``output_text``/``refusal`` parts we returned."""

    role: Literal["assistant"] = "assistant"
    content: str | list[AssistantContentPart]
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallInput(ContractModel):
    """A tool call the model made earlier; becomes an assistant ``tool_calls`` entry upstream."""

    type: Literal["function_call"] = "function_call"
    call_id: CallId
    name: str
    arguments: str
    namespace: str | None = None
    """Set when the function is a member of a ``namespace`` tool."""
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputInput(ContractModel):
    """The result of a tool call; becomes a ``role: "tool"`` message upstream."""

    type: Literal["function_call_output"] = "function_call_output"
    call_id: CallId
    output: str | list[UserContentPart]
    name: str | None = None
    namespace: str | None = None
    id: str | None = None
    status: ItemStatus | None = None


class CustomToolCallInput(ContractModel):
    """A call the model made earlier to a ``custom`` tool: free-form ``input`` rather than JSON."""

    type: Literal["custom_tool_call"] = "custom_tool_call"
    call_id: CallId
    name: str
    input: str
    namespace: str | None = None
    id: str | None = None
    status: ItemStatus | None = None


class CustomToolCallOutputInput(ContractModel):
    """The result of a custom tool call; becomes a ``role: "tool"`` message upstream."""

    type: Literal["custom_tool_call_output"] = "custom_tool_call_output"
    call_id: CallId
    output: str | list[UserContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class ItemReference(ContractModel):
    """An item the gateway stored earlier, named by its id; replaced by that item before anything else
    (``gateway.stored_routes``), so only a reference to an unknown id reaches validation."""

    type: Literal["item_reference"] | None = "item_reference"
    id: str


class ReasoningInput(ContractModel):
    """A reasoning item we returned, sent back as history. Accepted and dropped: chat upstreams take
    no reasoning history (and reasoning models' templates strip earlier turns' thinking)."""

    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


MessageInput = tagged_union(
    "role",
    {"user": UserMessage, "system": SystemMessage, "developer": DeveloperMessage, "assistant": AssistantMessage},
)
InputItem = tagged_union(
    "type",
    {"message": MessageInput, "function_call": FunctionCallInput, "function_call_output": FunctionCallOutputInput,
     "custom_tool_call": CustomToolCallInput, "custom_tool_call_output": CustomToolCallOutputInput,
     "reasoning": ReasoningInput, "item_reference": ItemReference},
    default="message",
)


# --- tools ----------------------------------------------------------------------------------

# OpenAI's tools that OpenAI itself runs (or whose calls come back as items of their own kind):
# a chat upstream cannot run them. Each model's `hosted_tools` policy drops them from the upstream
# request (the default) or refuses the request (gateway.translate.tools).
HOSTED_TOOL_TYPES = (
    "web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11",
    "file_search", "code_interpreter", "image_generation", "computer", "computer_use", "computer_use_preview",
    "mcp", "local_shell", "shell", "apply_patch", "tool_search", "programmatic_tool_calling",
)


class HostedTool(ContractModel):
    """A hosted tool; its settings are not read (it never reaches the upstream), so any are kept."""

    model_config = ConfigDict(extra="allow")

    type: Literal[HOSTED_TOOL_TYPES]  # type: ignore[valid-type]


Tool = tagged_union("type", {"function": FunctionTool, "namespace": NamespaceTool, "custom": CustomTool,
                             **dict.fromkeys(HOSTED_TOOL_TYPES, HostedTool)})


# --- options --------------------------------------------------------------------------------


class ReasoningParam(ContractModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: ReasoningSummary | None = None
    generate_summary: ReasoningSummary | None = None
    """Deprecated spelling of ``summary``."""


class ResponseStreamOptions(ContractModel):
    include_obfuscation: bool | None = None


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]


class CreateResponseRequest(ContractModel):
    """The ``CreateResponse`` body. ``None`` means "not given": the echo then shows the default."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[InputItem] | None = None
    """A string is one user message."""
    instructions: str | None = None
    """A system (or developer) message put before ``input``; not inherited via ``previous_response_id``."""
    previous_response_id: str | None = None

    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None

    include: list[str] | None = None
    """Extra output to include; ``"message.output_text.logprobs"`` is the logprobs switch. Only
    the values OpenAI documents (``INCLUDABLE``) are accepted: a typo such as ``"logprobs"`` would
    otherwise silently return no logprobs."""
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """Candidates per position, when ``include`` asks for logprobs."""

    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningParam | None = None

    stream: bool | None = None
    stream_options: ResponseStreamOptions | None = None
    store: bool | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None
    metadata: Metadata | None = None
    """At most 16 pairs; keys up to 64 characters, values up to 512."""
    user: str | None = None
    safety_identifier: Annotated[str, Field(max_length=64)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=64)] | None = None
    prompt_cache_retention: Literal["in-memory", "24h"] | None = None

    @field_validator("include")
    @classmethod
    def _documented_includes(cls, values: list[str] | None) -> list[str] | None:
        for value in values or ():
            if value not in INCLUDABLE:
                supported = ", ".join(f"'{v}'" for v in INCLUDABLE)
                raise ValueError(f"unsupported value {value!r}; supported values are: {supported}")
        return values


def extra_fields(req: CreateResponseRequest) -> dict[str, Any]:
    """The top-level fields ``CreateResponse`` does not define, to forward upstream as they are."""
    return dict(req.model_extra or {})
