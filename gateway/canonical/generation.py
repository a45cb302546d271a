"""One internal shape for a generation request, whichever front door it came through.

Front doors (responses, chat, completions) parse into `Generation`; each upstream dialect
builds its own request from it. Pure data, no I/O; below both, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Generation:
    """What the client asked the model to do.

    `messages` (chat-shaped) or `prompt` (a raw string) is set; `top_k_logprobs` is the number of
    alternatives the client wants, `logprobs` whether it wants logprobs at all; `echo_prompt` asks
    for the prompt's own logprobs (legacy completions `echo`).
    """

    model: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    plain_input: str | None = None  # the client's input when it was one plain string
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    user: str | None = None
    logprobs: bool = False
    top_k_logprobs: int = 0
    echo_prompt: bool = False
    stream: bool = False
    extensions: dict[str, Any] = field(default_factory=dict)
    # Chat-only options, already in chat's shape: `tools`, `tool_choice`, `parallel_tool_calls`.
    tool_options: dict[str, Any] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    format_param: str = "response_format"  # how the client named it (Responses: `text.format`)
    reasoning_effort: str | None = None
    has_images: bool = False  # some message has an image part (a chat upstream's job)
    input_param: str = "messages"  # where the client put the conversation (Responses: `input`)
    # Responses only: the request's tools as offered upstream and how their calls come back
    # (a `translate.tools.ToolSet`: namespaces, custom tools, the hosted tools dropped).
    tool_set: Any = None

    def chat_options(self) -> dict[str, Any]:
        """What only a chat upstream can take: tools, structured output, reasoning effort."""
        out = dict(self.tool_options)
        if self.response_format is not None:
            out["response_format"] = self.response_format
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        return out

    def sampling(self) -> dict[str, Any]:
        """The OpenAI-style sampling fields set by the client (unset ones are left to the server)."""
        out: dict[str, Any] = {}
        for key in ("temperature", "top_p", "stop", "user"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out
