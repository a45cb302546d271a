"""Chat Completions as the client's format: the streaming translator and the final body.

Same contract as the Responses translator: feed canonical tokens, get chunks back. Chunks are
`chat.completion.chunk` objects (the server loop adds `data: ` framing and the closing `[DONE]`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson

from gateway.canonical.step import ToolCallDelta
from gateway.logprobs.compiled import TokenBatch
from gateway.logprobs.render import render_responses_json
from gateway.logprobs.tokens import Token
from gateway.logprobs.vocab import Vocab
from gateway.translate.grouping import TextGrouper
from gateway.translate.response_object import new_id
from gateway.translate.stream import MessageLogprobs


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def normalize_finish(reason: str | None) -> str:
    """Servers' own words (TGI `eos_token`, `stop_sequence`) -> OpenAI's."""
    if reason in ("length", "tool_calls", "content_filter", "function_call"):
        return reason
    return "stop"


class ChatStream:
    def __init__(self, model: str, *, logprobs: bool, top_logprobs: int, include_usage: bool = False,
                 completion_id: str | None = None, created: int | None = None,
                 vocab: Vocab | None = None, keep_for_final: bool = True, serialized: bool = False) -> None:
        # keep_for_final=False (a stream, whose chunks are all it sends): the text and logprob entries are not
        # kept for `final`, which is then not called; a 1,000-token k=5 stream held ~2 MB of entry dicts.
        # True (a whole answer): no chunk is built for its text, nobody would see one; its tokens are kept
        # (a whole body's TokenBatch as it is) and its logprob list rendered once, by `final`, as a Response's
        # message is (the entries are the same): as JSON written once (`serialized`, the server), else dicts.
        self._keep = keep_for_final
        self.model = model
        self.logprobs = logprobs
        self.k = top_logprobs
        self.include_usage = include_usage
        self.id = completion_id or new_id("chatcmpl")
        self.created = created if created is not None else int(time.time())
        self._grouper = TextGrouper(vocab)
        self._text: list[str] = []
        self._whole = MessageLogprobs(top_logprobs, serialized)  # a whole answer's tokens (keep_for_final)
        self._reasoning: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}  # upstream index -> the call so far
        self._frame_head = self._frame_tail = b""  # a text chunk's frame around its text and logprobs (text_frame)
        if not keep_for_final:
            self._frame_head = b'data: {"id":%s,"object":"chat.completion.chunk","created":%d,"model":%s,' \
                               b'"choices":[{"index":0,"delta":{"content":' % (orjson.dumps(self.id), self.created,
                                                                               orjson.dumps(model))
            self._frame_tail = b',"finish_reason":null}]%s}\n\n' % (b',"usage":null' if include_usage else b"")

    def _chunk(self, delta: dict[str, Any], logprobs: Any, finish_reason: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _logprobs(self, tokens: list[Token] | TokenBatch) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        # A stream's entries are only serialized: written once as JSON (chat's entries are the Responses
        # entries), from the ids when the grouper passed a step's TokenBatch on.
        return {"content": orjson.Fragment(render_responses_json(tokens, self.k)), "refusal": None}

    def start(self) -> list[dict[str, Any]]:
        return [] if self._keep else [self._chunk({"role": "assistant", "content": ""}, None)]

    def _groups_to_chunks(self, groups: Iterable[tuple[str, list[Token]]]) -> list[dict[str, Any]]:
        if self._keep:  # a whole answer: kept for `final`, no chunk
            for text, tokens in groups:
                self._text.append(text)
                if self.logprobs:
                    self._whole.keep(tokens)
            return []
        return [self._chunk({"content": text}, self._logprobs(tokens)) for text, tokens in groups]

    def feed(self, tokens: Iterable[Token], upstream_text: str = "") -> list[dict[str, Any]]:
        if self._keep:  # only the groups' sum is used: one group a step where it can be (a body's batch whole)
            return self._groups_to_chunks(self._grouper.feed_all(tokens, upstream_text))
        return self._groups_to_chunks(self._grouper.feed(tokens, upstream_text))

    def text_frame(self, upstream_text: str, batch: TokenBatch) -> bytes | None:
        """A stream's usual chunk, one visible token as a TokenBatch (`TextGrouper.feed_batch`), straight to
        the `data:` frame of the chunk `feed` would make of it; empty while it waits for the rest of its
        character. None, nothing changed, for any other: `feed` it."""
        if self._keep:
            return None
        groups = self._grouper.feed_batch(batch, upstream_text)
        if not groups:
            return None if groups is None else b""
        text, tokens = groups[0]
        if self.logprobs:
            logprobs = b'{"content":%s,"refusal":null}' % render_responses_json(tokens, self.k)
        else:
            logprobs = b"null"
        return b"".join((self._frame_head, orjson.dumps(text), b'},"logprobs":', logprobs, self._frame_tail))

    def feed_reasoning(self, text: str | None) -> list[dict[str, Any]]:
        """A reasoning model's thinking, as vLLM's chat API spells it (`reasoning_content`), no logprobs."""
        if not text:
            return []
        if self._keep:
            self._reasoning.append(text)
            return []
        return [self._chunk({"reasoning_content": text}, None)]

    def feed_tool_calls(self, deltas: Iterable[ToolCallDelta]) -> list[dict[str, Any]]:
        """Tool calls (or pieces of them) passed on in OpenAI's chunk shape: id, type and name first."""
        pieces = []
        for delta in deltas:
            piece: dict[str, Any] = {"index": delta.index}
            call = self._tool_calls.get(delta.index)
            if call is None:
                call = self._tool_calls[delta.index] = {"id": delta.id or new_id("call"), "type": "function",
                                                        "function": {"name": "", "arguments": ""}}
                piece.update(id=call["id"], type="function")
            function: dict[str, Any] = {}
            if delta.name:
                call["function"]["name"] = function["name"] = delta.name
            call["function"]["arguments"] += delta.arguments
            function["arguments"] = delta.arguments
            piece["function"] = function
            pieces.append(piece)
        return [self._chunk({"tool_calls": pieces}, None)] if pieces and not self._keep else []

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        chunks = self._groups_to_chunks(self._grouper.finish(finish_reason))
        chunks.append(self._chunk({}, None, normalize_finish(finish_reason)))
        if self.include_usage:
            chunks.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.model, "choices": [], "usage": chat_usage(usage)})
        return chunks

    def final(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        """The non-streamed `chat.completion` body (feed everything first)."""
        if not self._keep:
            raise RuntimeError("a ChatStream made with keep_for_final=False kept nothing for final()")
        self._groups_to_chunks(self._grouper.finish(finish_reason))
        text = "".join(self._text)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self._tool_calls:
            message["tool_calls"] = [self._tool_calls[index] for index in sorted(self._tool_calls)]
            message["content"] = text or None  # OpenAI's shape for a turn that only calls tools
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        logprobs = {"content": self._whole.whole(), "refusal": None} if self.logprobs else None
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                         "finish_reason": normalize_finish(finish_reason)}],
            "usage": chat_usage(usage) or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
