"""The parts of the Responses API that requests and responses share.

A request sends back what a response returned (its ``output_text``/``refusal`` parts, reasoning
text) and names the tools, tool choice and text format that the response then echoes, so both
schemas use these models. They live apart from ``schemas.responses`` so that the server, which
validates requests but writes responses without pydantic, never builds the response object and
stream-event models (several MB of validators). ``schemas.responses`` re-exports every name here,
and its docstring gives the contract choices (SDK versus Open Responses spec) these follow.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from ._base import Byte, ContractModel, tagged_union

Index = Annotated[int, Field(ge=0)]
FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ReasoningSummary = Literal["auto", "concise", "detailed"]


# --- logprobs -------------------------------------------------------------------------------


class TopLogProb(ContractModel):
    """A likely candidate at one position."""

    token: str
    """The token as text; bytes that are not valid UTF-8 alone are written as literal ``\\xNN``."""
    bytes: list[Byte]
    """The token's exact bytes. Never ``null``: concatenated over a part they give its text."""
    logprob: float


class LogProb(ContractModel):
    """The sampled token at one position and its top candidates (``[]`` when none asked for)."""

    token: str
    bytes: list[Byte]
    logprob: float
    top_logprobs: list[TopLogProb]


# --- content parts --------------------------------------------------------------------------


class UrlCitation(ContractModel):
    type: Literal["url_citation"] = "url_citation"
    url: str
    start_index: Index
    end_index: Index
    title: str


class OutputText(ContractModel):
    """A text part of an assistant message."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[UrlCitation] = Field(default_factory=list)
    logprobs: list[LogProb] = Field(default_factory=list)
    """One entry per generated token of ``text``; ``[]`` unless ``include`` asked for logprobs."""


class OutputRefusal(ContractModel):
    """The model declined; refusals carry no logprobs in the Responses API."""

    type: Literal["refusal"] = "refusal"
    refusal: str


class SummaryText(ContractModel):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningText(ContractModel):
    """The thinking itself, as a reasoning parser (vLLM's ``reasoning``) separated it from the answer."""

    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


# --- configuration (requested, then echoed) -------------------------------------------------


class FunctionTool(ContractModel):
    """A function the model may call; flat, unlike chat's ``{type, function: {...}}``."""

    type: Literal["function"] = "function"
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """JSON Schema of the arguments object."""
    strict: bool | None = None


class CustomToolFormatText(ContractModel):
    type: Literal["text"] = "text"


class CustomToolFormatGrammar(ContractModel):
    """A grammar the input should follow. A chat upstream cannot enforce it: the model is shown it."""

    type: Literal["grammar"] = "grammar"
    syntax: Literal["lark", "regex"]
    definition: str


CustomToolFormat = tagged_union("type", {"text": CustomToolFormatText, "grammar": CustomToolFormatGrammar})


class CustomTool(ContractModel):
    """A tool whose input is free-form text (Codex's ``apply_patch`` can be one), not JSON arguments.

    Offered to a chat upstream as a function with one string parameter, ``input``; its calls come
    back as ``custom_tool_call`` items.
    """

    type: Literal["custom"] = "custom"
    name: FunctionName
    description: str | None = None
    format: CustomToolFormat | None = None


NamespaceMember = tagged_union("type", {"function": FunctionTool, "custom": CustomTool})


class NamespaceTool(ContractModel):
    """Function (and custom) tools grouped under a namespace (Codex's ``multi_agent_v1``).

    The model is offered each member as its own function; a call to one comes back with the
    member's ``name`` and the ``namespace`` (OpenAI's ``function_call.namespace``).
    """

    type: Literal["namespace"] = "namespace"
    name: FunctionName
    description: str
    tools: Annotated[list[NamespaceMember], Field(min_length=1)]


class ToolChoiceFunction(ContractModel):
    type: Literal["function"] = "function"
    name: str


class ToolChoiceCustom(ContractModel):
    type: Literal["custom"] = "custom"
    name: str


class ToolChoiceAllowed(ContractModel):
    type: Literal["allowed_tools"] = "allowed_tools"
    mode: Literal["auto", "required"]
    tools: Annotated[list[tagged_union("type", {"function": ToolChoiceFunction, "custom": ToolChoiceCustom})],
                     Field(min_length=1, max_length=128)]


ToolChoiceOptions = Literal["none", "auto", "required"]
ToolChoice = ToolChoiceOptions | tagged_union(
    "type", {"function": ToolChoiceFunction, "custom": ToolChoiceCustom, "allowed_tools": ToolChoiceAllowed}
)


class TextFormatText(ContractModel):
    type: Literal["text"] = "text"


class TextFormatJsonObject(ContractModel):
    type: Literal["json_object"] = "json_object"


class TextFormatJsonSchema(ContractModel):
    """Structured output; flat, unlike chat's ``response_format.json_schema``."""

    # `schema` would shadow a BaseModel attribute, so the field is `schema_` on the wire as `schema`.
    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    type: Literal["json_schema"] = "json_schema"
    name: FunctionName
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool = False
    """The spec needs a boolean in the echo; a request's ``null`` means the default, ``False``."""

    @field_validator("strict", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any) -> Any:
        return False if value is None else value


TextFormat = tagged_union(
    "type",
    {"text": TextFormatText, "json_object": TextFormatJsonObject, "json_schema": TextFormatJsonSchema},
)


class TextConfig(ContractModel):
    """``text``: the output format and verbosity."""

    format: TextFormat = Field(default_factory=TextFormatText)
    verbosity: Literal["low", "medium", "high"] = "medium"
