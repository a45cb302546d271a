"""Legacy Completions (``/v1/completions``): request body, response, stream chunk.

Logprobs here are four parallel arrays, and ``top_logprobs[i]`` is a ``{token: logprob}`` dict.
With ``echo: true`` the first prompt token has no context, so ``token_logprobs[0]`` and
``top_logprobs[0]`` are ``null``: that is the wire truth (vLLM, OpenAI's base models), although
the OpenAI spec and SDK type these arrays as numbers only and ``openai.types.Completion`` rejects
such a body. These models accept it.

Response models are ``PassthroughModel``s because they also describe what upstream servers send
us, vendor keys included (vLLM's ``stop_reason``, ``prompt_logprobs``, ``prompt_token_ids``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StrictInt

from ._base import ContractModel, PassthroughModel

CompletionFinishReason = Literal["stop", "length", "content_filter"]


class CompletionLogprobs(PassthroughModel):
    """Per-token logprobs as parallel arrays over the returned tokens (prompt ones too under echo)."""

    tokens: list[str]
    """Token strings; a token that is not valid UTF-8 alone is spelled ``bytes:\\xNN...``."""
    token_logprobs: list[float | None]
    """Logprob of each token; ``None`` for the first echoed prompt token (nothing to condition on)."""
    top_logprobs: list[dict[str, float] | None] | None = None
    """The most likely candidates at each position (``{token: logprob}``), ``None`` as above."""
    text_offset: list[int]
    """Character offset of each token in the returned text."""


class CompletionTokensDetails(PassthroughModel):
    reasoning_tokens: int | None = None


class PromptTokensDetails(PassthroughModel):
    cached_tokens: int | None = None


class CompletionUsage(PassthroughModel):
    """Token counts; the same object in Completions and Chat Completions."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class CompletionChoice(PassthroughModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: CompletionFinishReason | None = None
    """``None`` until the last chunk of a stream; always set in a non-streaming response."""


class Completion(PassthroughModel):
    """A non-streaming ``text_completion`` response."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None


class CompletionChunk(Completion):
    """One ``data:`` frame of a completions stream: the same shape as ``Completion``.

    The last frame before ``[DONE]`` may carry only ``usage`` with ``choices: []``
    (``stream_options.include_usage``).
    """


class StreamOptions(ContractModel):
    """``stream_options`` of Completions and Chat Completions."""

    # Vendor options (vLLM's ``continuous_usage_stats``) are forwarded, not rejected.
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = None
    """Send a final chunk with ``usage`` (and ``choices: []``) before ``[DONE]``."""
    include_obfuscation: bool | None = None


class CompletionRequest(ContractModel):
    """Body of ``POST /v1/completions`` as we send it upstream (or accept it).

    Unknown fields are kept (``extra="allow"``): vendor extensions such as ``top_k``,
    ``ignore_eos`` or ``return_tokens_as_token_ids`` are forwarded as they are.
    """

    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str | list[str] | list[StrictInt]
    """Text, a batch of texts, or token ids."""
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    """``0`` scores the prompt only (with ``echo`` and ``logprobs``)."""
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """Top candidates per position. OpenAI caps this at 5; vLLM and others allow 20."""
    echo: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    """Modelled for documentation; the gateway only ever asks for one choice."""
    user: str | None = None
