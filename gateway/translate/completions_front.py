"""Legacy Completions as the client's format: the streaming translator and the final body.

`logprobs` is OpenAI's integer k (None: no logprobs). `text_offset` counts code points of the
text the client receives; with `echo` the prompt comes first (its first token has null logprob).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gateway.logprobs.compiled import TokenBatch
from gateway.logprobs.render import render_completions, render_completions_groups
from gateway.logprobs.tokens import Token
from gateway.logprobs.vocab import Vocab
from gateway.translate.chat_front import chat_usage, normalize_finish
from gateway.translate.grouping import TextGrouper
from gateway.translate.response_object import new_id


class CompletionsStream:
    def __init__(self, model: str, *, logprobs: int | None, include_usage: bool = False,
                 echo_text: str = "", completion_id: str | None = None,
                 created: int | None = None, vocab: Vocab | None = None, keep_for_final: bool = True) -> None:
        # keep_for_final=False (a stream): the text and logprobs are not kept for `final`, which is then not called.
        # True (a whole answer): no chunk is built, nobody would see it; the text and each group's tokens are
        # kept, and rendered once, by `final`.
        self._keep = keep_for_final
        self.model = model
        self.k = logprobs
        self.include_usage = include_usage
        self.id = completion_id or new_id("cmpl")
        self.created = created if created is not None else int(time.time())
        self._grouper = TextGrouper(vocab)
        self._text: list[str] = []
        self._chars = 0
        self._kept: list[tuple[list[Token], int]] = []  # (a group's tokens, its first character's offset)
        self._echo_text = echo_text

    def _chunk(self, text: str, logprobs: Any, finish_reason: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _render(self, text: str, tokens: list[Token]) -> dict[str, Any] | None:
        if self.k is None:
            self._chars += len(text)
            return None
        rendered = render_completions(tokens, self.k, text_offset_start=self._chars)
        self._chars += len(text)
        return rendered

    def _groups(self, groups: Iterable[tuple[str, list[Token] | TokenBatch]]) -> list[dict[str, Any]]:
        if self._keep:  # a whole answer: kept for `final`, no chunk
            for text, tokens in groups:
                self._text.append(text)
                if self.k is not None and tokens:
                    # (a body's TokenBatch stands for its visible tokens: grouping.feed_all)
                    kept = tokens.tokens(True) if type(tokens) is TokenBatch else tokens  # type: ignore[union-attr]
                    self._kept.append((kept, self._chars))
                self._chars += len(text)
            return []
        return [self._chunk(text, self._render(text, tokens)) for text, tokens in groups]

    def start(self) -> list[dict[str, Any]]:
        """Echo without logprobs: the prompt's text goes out first."""
        if not self._echo_text:
            return []
        return self._groups([(self._echo_text, [])])

    def echo(self, text: str, tokens: list[Token]) -> list[dict[str, Any]]:
        """Echo with logprobs: the prompt and its tokens, as the upstream scored them, go first."""
        return self._groups([(text, tokens)])

    def feed(self, tokens: Iterable[Token], upstream_text: str = "") -> list[dict[str, Any]]:
        if self._keep:
            # A whole answer: one group a step where its bytes are whole, valid UTF-8 (grouping.feed_all). Its
            # offsets are the same as per character: each character's group spans its own lead byte, and a
            # token that starts inside a character is never a group's first.
            return self._groups(self._grouper.feed_all(tokens, upstream_text))
        return self._groups(self._grouper.feed(tokens, upstream_text))

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        chunks = self._groups(self._grouper.finish(finish_reason))
        chunks.append(self._chunk("", None, normalize_finish(finish_reason)))
        if self.include_usage:
            chunks.append({"id": self.id, "object": "text_completion", "created": self.created,
                           "model": self.model, "choices": [], "usage": chat_usage(usage)})
        return chunks

    def final(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        """The non-streamed `text_completion` body (call `start` and feed everything first)."""
        if not self._keep:
            raise RuntimeError("a CompletionsStream made with keep_for_final=False kept nothing for final()")
        self._groups(self._grouper.finish(finish_reason))
        logprobs = None
        if self.k is not None:
            logprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            render_completions_groups(self._kept, self.k, logprobs)
        return {
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "text": "".join(self._text), "logprobs": logprobs,
                         "finish_reason": normalize_finish(finish_reason)}],
            "usage": chat_usage(usage) or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
