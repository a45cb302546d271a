"""Chat Completions (``/v1/chat/completions``): request body, response, stream chunk.

A logprob entry carries the token string, its logprob, its UTF-8 ``bytes`` and the top
candidates. OpenAI spells a token that is not valid UTF-8 alone with literal ``\\xNN`` escapes
and puts the raw bytes in ``bytes``; some servers (TGI, llama.cpp) send ``bytes: null``, which
the wire allows. A logprob of ``-9999.0`` means "not in the top 20" and is kept verbatim.

Response models are ``PassthroughModel``s: they also describe upstream output, which carries
vendor keys (vLLM's ``reasoning_content``, ``stop_reason``, ``token_ids``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from ._base import Byte, ContractModel, PassthroughModel, tagged_union
from .completions import CompletionUsage, StreamOptions

ChatFinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]
ChatRole = Literal["developer", "system", "user", "assistant", "tool"]


# --- logprobs -------------------------------------------------------------------------------


class ChatTopLogprob(PassthroughModel):
    """A likely candidate at one position."""

    token: str
    logprob: float
    bytes: list[Byte] | None
    """UTF-8 bytes of the token; ``None`` when the server has no byte representation."""


class ChatTokenLogprob(PassthroughModel):
    """The sampled token at one position, with its top candidates (``[]`` when none asked)."""

    token: str
    logprob: float
    bytes: list[Byte] | None
    top_logprobs: list[ChatTopLogprob]


class ChatChoiceLogprobs(PassthroughModel):
    """Logprobs of a choice; a refusal's tokens go in ``refusal``, never in ``content``."""

    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


# --- tools, shared by request and response ---------------------------------------------------


class ChatFunctionCall(ContractModel):
    name: str
    arguments: str
    """The arguments as a JSON string (possibly invalid JSON: the model wrote it)."""


class ChatToolCall(ContractModel):
    id: str
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatFunctionDefinition(ContractModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(ContractModel):
    """A function tool; chat nests the definition under ``function`` (Responses does not)."""

    type: Literal["function"] = "function"
    function: ChatFunctionDefinition


class ChatNamedFunction(ContractModel):
    name: str


class ChatNamedToolChoice(ContractModel):
    type: Literal["function"] = "function"
    function: ChatNamedFunction


# --- response -------------------------------------------------------------------------------


class ChatCompletionMessage(PassthroughModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ChatToolCall] | None = None


class ChatChoice(PassthroughModel):
    index: int
    message: ChatCompletionMessage
    logprobs: ChatChoiceLogprobs | None = None
    """``None`` unless the request set ``logprobs: true``."""
    finish_reason: ChatFinishReason


class ChatCompletion(PassthroughModel):
    """A non-streaming ``chat.completion`` response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None


class ChatFunctionCallDelta(PassthroughModel):
    name: str | None = None
    arguments: str | None = None
    """A fragment of the arguments string; fragments concatenate."""


class ChatToolCallDelta(PassthroughModel):
    index: int
    """Which tool call of the choice this fragment extends."""
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChatFunctionCallDelta | None = None


class ChatDelta(PassthroughModel):
    role: ChatRole | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ChatToolCallDelta] | None = None


class ChatChunkChoice(PassthroughModel):
    index: int
    delta: ChatDelta
    logprobs: ChatChoiceLogprobs | None = None
    """Logprobs of exactly the tokens in this ``delta``."""
    finish_reason: ChatFinishReason | None = None


class ChatCompletionChunk(PassthroughModel):
    """One ``data:`` frame of a chat stream (the stream ends with ``data: [DONE]``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: CompletionUsage | None = None
    """Set only on the final usage chunk (``stream_options.include_usage``), whose ``choices`` is ``[]``."""
    system_fingerprint: str | None = None


# --- request --------------------------------------------------------------------------------


class ChatTextPart(ContractModel):
    type: Literal["text"] = "text"
    text: str


class ChatImageUrl(ContractModel):
    url: str
    """An ``https:`` URL or a ``data:`` URL with base64 image bytes."""
    detail: Literal["auto", "low", "high"] | None = None


class ChatImagePart(ContractModel):
    type: Literal["image_url"] = "image_url"
    image_url: ChatImageUrl


class ChatRefusalPart(ContractModel):
    type: Literal["refusal"] = "refusal"
    refusal: str


ChatUserPart = tagged_union("type", {"text": ChatTextPart, "image_url": ChatImagePart})
ChatAssistantPart = tagged_union("type", {"text": ChatTextPart, "refusal": ChatRefusalPart})


class ChatSystemMessage(ContractModel):
    role: Literal["system"] = "system"
    content: str | list[ChatTextPart]
    name: str | None = None


class ChatDeveloperMessage(ContractModel):
    role: Literal["developer"] = "developer"
    content: str | list[ChatTextPart]
    name: str | None = None


class ChatUserMessage(ContractModel):
    role: Literal["user"] = "user"
    content: str | list[ChatUserPart]
    name: str | None = None


class ChatAssistantMessage(ContractModel):
    """A prior assistant turn; ``content`` may be ``None`` when it only called tools."""

    role: Literal["assistant"] = "assistant"
    content: str | list[ChatAssistantPart] | None = None
    refusal: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    name: str | None = None


class ChatToolMessage(ContractModel):
    """The result of a tool call, matched to it by ``tool_call_id``."""

    role: Literal["tool"] = "tool"
    content: str | list[ChatTextPart]
    tool_call_id: str


ChatMessage = tagged_union(
    "role",
    {
        "system": ChatSystemMessage,
        "developer": ChatDeveloperMessage,
        "user": ChatUserMessage,
        "assistant": ChatAssistantMessage,
        "tool": ChatToolMessage,
    },
)


class ChatResponseFormatText(ContractModel):
    type: Literal["text"] = "text"


class ChatResponseFormatJsonObject(ContractModel):
    type: Literal["json_object"] = "json_object"


class ChatJsonSchema(ContractModel):
    # `schema` would shadow a BaseModel attribute, so the field is `schema_` on the wire as `schema`.
    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ChatResponseFormatJsonSchema(ContractModel):
    """Structured output; chat nests the schema under ``json_schema`` (Responses does not)."""

    type: Literal["json_schema"] = "json_schema"
    json_schema: ChatJsonSchema


ChatResponseFormat = tagged_union(
    "type",
    {
        "text": ChatResponseFormatText,
        "json_object": ChatResponseFormatJsonObject,
        "json_schema": ChatResponseFormatJsonSchema,
    },
)

ChatToolChoice = Literal["none", "auto", "required"] | ChatNamedToolChoice


class ChatCompletionRequest(ContractModel):
    """Body of ``POST /v1/chat/completions`` as we send it upstream (or accept it).

    Unknown top-level fields are kept (``extra="allow"``): vendor extensions such as ``top_k``,
    ``ignore_eos``, ``chat_template_kwargs`` are forwarded as they are.
    """

    model_config = ConfigDict(extra="allow")

    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    """Deprecated by OpenAI in favour of ``max_completion_tokens``; many servers read only this one."""
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    logprobs: bool | None = None
    """Return logprobs of the sampled tokens."""
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """Candidates per position; servers (vLLM) require ``logprobs: true`` alongside."""
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ChatToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ChatResponseFormat | None = None
    user: str | None = None
