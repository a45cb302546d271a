"""The three front doors' output side behind one interface the server loop drives.

Each translator takes canonical tokens and returns the client's objects: Responses events, chat
chunks or completion chunks; `final` gives the non-streamed body, `fail` the in-stream error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from gateway.canonical.generation import Generation
from gateway.canonical.step import Step
from gateway.errors import GatewayError
from gateway.logprobs.compiled import TokenBatch
from gateway.logprobs.tokens import Token
from gateway.logprobs.vocab import Vocab
from gateway.translate.chat_front import ChatStream
from gateway.translate.completions_front import CompletionsStream
from gateway.translate.response_object import ResponseSettings, usage_object
from gateway.translate.stream import ResponsesStream

# (text, tokens) of a stream chunk -> what feed_step would make of it, already written as its SSE frame
# (empty: nothing yet); None: `feed_step` it.
FrameWriter = Callable[[str, TokenBatch], "bytes | None"]


class FrontTranslator(Protocol):
    # feed_step takes a Step whose tokens are a TokenBatch (a stream chunk's, kept as ids).
    takes_token_batches: bool

    def start(self) -> list[dict[str, Any]]: ...
    def echo(self, text: str, tokens: list[Token]) -> list[dict[str, Any]]: ...
    def feed(self, tokens: Iterable[Token], upstream_text: str = "") -> list[dict[str, Any]]: ...
    def feed_step(self, step: Step) -> list[dict[str, Any]]: ...
    def frame_writer(self) -> FrameWriter | None: ...
    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[dict[str, Any]]: ...
    def final(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]: ...
    def fail(self, message: str, error: GatewayError | None = None) -> list[dict[str, Any]]: ...


def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """An upstream's chat-style usage -> Responses usage with every detail field."""
    if not usage:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return usage_object(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0, cached, reasoning)


def error_payload(message: str) -> dict[str, Any]:
    """A chat/completions stream that fails midway ends with an error object, as OpenAI's do."""
    return {"error": {"message": message, "type": "upstream_error", "param": None, "code": "upstream_error"}}


class _Front:
    """Delegates to the format's streaming translator; subclasses adapt what differs."""

    stream: Any
    takes_token_batches = False

    def start(self) -> list[dict[str, Any]]:
        return self.stream.start()

    def frame_writer(self) -> FrameWriter | None:
        """Where the usual stream chunk (text and a TokenBatch, nothing else) can go straight to its SSE frame."""
        return None

    def echo(self, text: str, tokens: list[Token]) -> list[dict[str, Any]]:
        return []  # only legacy completions shows the prompt

    def feed(self, tokens: Iterable[Token], upstream_text: str = "") -> list[dict[str, Any]]:
        return self.stream.feed(tokens, upstream_text)

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        return self.stream.finish(finish_reason, usage)

    def final(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        return self.stream.final(finish_reason, usage)

    def fail(self, message: str, error: GatewayError | None = None) -> list[dict[str, Any]]:
        """`error`: the upstream's own verdict (an in-band error frame), in the client's error shape."""
        return [error.body() if error is not None else error_payload(message)]


class ResponsesFront(_Front):
    def __init__(self, settings: ResponseSettings, vocab: Vocab | None = None, *, serialized: bool = False,
                 deltas: bool = True) -> None:
        # The server passes serialized=True (it only serializes) and deltas=False when not streaming.
        self.stream = ResponsesStream(settings, vocab=vocab, serialized=serialized, deltas=deltas)
        # A stream's message keeps its tokens as ids and writes each delta's JSON from them (see stream.py).
        self.takes_token_batches = serialized and deltas

    def frame_writer(self) -> FrameWriter | None:
        return self.stream.text_frame if self.takes_token_batches else None

    def feed_step(self, step: Step) -> list[dict[str, Any]]:
        """Reasoning, then message text, then tool calls: the order a model writes them in."""
        if not step.reasoning and not step.reasoning_tokens and not step.tool_calls:
            return self.stream.feed(step.tokens, step.text)  # plain text: the other two add nothing
        events = self.stream.feed_reasoning(step.reasoning, step.reasoning_tokens)
        events += self.stream.feed(step.tokens, step.text)
        return events + self.stream.feed_tool_calls(step.tool_calls)

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        return self.stream.finish(finish_reason, responses_usage(usage))

    def final(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        return self.stream.final_response(finish_reason, responses_usage(usage))

    def fail(self, message: str, error: GatewayError | None = None) -> list[dict[str, Any]]:
        # A `response.failed` event, not an error object; its code is one of the few ResponseError allows.
        if error is None or error.status >= 500:
            return self.stream.fail(message)
        return self.stream.fail(message, "rate_limit_exceeded" if error.status == 429 else "invalid_prompt")


class ChatFront(_Front):
    def __init__(self, gen: Generation, include_usage: bool, vocab: Vocab | None = None, *,
                 serialized: bool = False) -> None:
        # The server passes serialized=True: a whole answer's logprobs are then JSON written once (see ChatStream).
        self.stream = ChatStream(gen.model, logprobs=gen.logprobs, top_logprobs=gen.top_k_logprobs,
                                 include_usage=include_usage, vocab=vocab, keep_for_final=not gen.stream,
                                 serialized=serialized)
        self.takes_token_batches = gen.stream  # a stream's entries are written from the ids (see ChatStream)

    def frame_writer(self) -> FrameWriter | None:
        return self.stream.text_frame if self.takes_token_batches else None

    def feed_step(self, step: Step) -> list[dict[str, Any]]:
        if not step.reasoning and not step.tool_calls:
            return self.stream.feed(step.tokens, step.text)  # plain text: the other two add nothing
        chunks = self.stream.feed_reasoning(step.reasoning)
        chunks += self.stream.feed(step.tokens, step.text)
        return chunks + self.stream.feed_tool_calls(step.tool_calls)


class CompletionsFront(_Front):
    def __init__(self, gen: Generation, include_usage: bool, vocab: Vocab | None = None) -> None:
        # Echo without logprobs needs nothing from the upstream: the gateway prepends the prompt.
        echo_text = (gen.prompt or "") if gen.echo_prompt and not gen.logprobs else ""
        self.stream = CompletionsStream(gen.model, logprobs=gen.top_k_logprobs if gen.logprobs else None,
                                        include_usage=include_usage, echo_text=echo_text, vocab=vocab,
                                        keep_for_final=not gen.stream)

    def echo(self, text: str, tokens: list[Token]) -> list[dict[str, Any]]:
        return self.stream.echo(text, tokens)

    def feed_step(self, step: Step) -> list[dict[str, Any]]:
        # Legacy completions has no place for reasoning or tool calls; the text is what it shows.
        return self.stream.feed(step.tokens, step.text)
