"""The streaming Responses translator: feed it canonical tokens, get Responses events back.

Sans-I/O (after h11): no sockets here. The server loop reads an upstream chunk, parses it into
tokens with the dialect's parser, calls `feed`, and writes the events this returns. The same
object builds the final Response, so streamed and non-streamed output cannot drift apart.

Text is built from the tokens' exact bytes. A token that ends inside a character waits until the
character completes, so each `output_text.delta` carries the logprobs of exactly the tokens whose
text it adds. Tokens left dangling inside an unfinished character when generation stops (a length
cap) go out in a last delta with empty text: their logprobs are kept, the text cannot hold them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gateway.logprobs.render import render_responses_entry
from gateway.logprobs.tokens import Token
from gateway.logprobs.vocab import Vocab
from gateway.translate.grouping import TextGrouper
from gateway.translate.response_object import (
    ResponseSettings,
    message_item,
    new_id,
    output_text_part,
    response_object,
    status_for_finish,
)


class ResponsesStream:
    """One Responses stream (or non-streamed Response), built token by token."""

    def __init__(self, settings: ResponseSettings, *, response_id: str | None = None,
                 created_at: int | None = None, vocab: Vocab | None = None) -> None:
        self.settings = settings
        self.response_id = response_id or new_id("resp")
        self.message_id = new_id("msg")
        self.created_at = created_at if created_at is not None else int(time.time())
        self._sequence = 0
        self._text: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._grouper = TextGrouper(vocab)
        self._message_open = False
        self.finished = False

    # --- events -------------------------------------------------------------------------------

    def _event(self, event_type: str, **fields: Any) -> dict[str, Any]:
        event = {"type": event_type, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(self.settings, self.response_id, self.created_at, status,
                               extra.pop("output", []), **extra)

    def start(self) -> list[dict[str, Any]]:
        snapshot = self._snapshot("in_progress")
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def _open_message(self) -> list[dict[str, Any]]:
        if self._message_open:
            return []
        self._message_open = True
        return [
            self._event("response.output_item.added", output_index=0,
                        item=message_item(self.message_id, "in_progress", [])),
            self._event("response.content_part.added", item_id=self.message_id, output_index=0,
                        content_index=0, part=output_text_part("", [])),
        ]

    def _delta(self, text: str, tokens: list[Token]) -> dict[str, Any]:
        entries = self._entries(tokens)
        self._text.append(text)
        self._logprobs.extend(entries)
        return self._event("response.output_text.delta", item_id=self.message_id, output_index=0,
                           content_index=0, delta=text, logprobs=entries)

    def _entries(self, tokens: Iterable[Token]) -> list[dict[str, Any]]:
        if not self.settings.include_logprobs:
            return []
        k = self.settings.top_logprobs
        return [render_responses_entry(token, k) for token in tokens]

    # --- input --------------------------------------------------------------------------------

    def feed(self, tokens: Iterable[Token], upstream_text: str = "") -> list[dict[str, Any]]:
        """Take one upstream step: its tokens (exact bytes) and the text delta it reported."""
        return self._deltas(self._grouper.feed(tokens, upstream_text))

    def _deltas(self, groups: list[tuple[str, list[Token]]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for text, tokens in groups:
            events.extend(self._open_message())
            events.append(self._delta(text, tokens))
        return events

    # --- output -------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def logprobs(self) -> list[dict[str, Any]]:
        return self._logprobs

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Close the message and end with `response.completed` or `response.incomplete`."""
        events = self._open_message()
        events += self._deltas(self._grouper.finish(finish_reason))
        status, _ = status_for_finish(finish_reason)
        item_status = "incomplete" if status == "incomplete" else "completed"
        part = output_text_part(self.text, self._logprobs)
        item = message_item(self.message_id, item_status, [part])
        events += [
            self._event("response.output_text.done", item_id=self.message_id, output_index=0, content_index=0,
                        text=self.text, logprobs=self._logprobs),
            self._event("response.content_part.done", item_id=self.message_id, output_index=0, content_index=0,
                        part=part),
            self._event("response.output_item.done", output_index=0, item=item),
        ]
        final = self.final_response(finish_reason, usage)
        events.append(self._event(f"response.{final['status']}", response=final))
        self.finished = True
        return events

    def final_response(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        """The complete Response (also what a non-streamed request returns)."""
        self._deltas(self._grouper.finish(finish_reason))
        status, reason = status_for_finish(finish_reason)
        item_status = "incomplete" if status == "incomplete" else "completed"
        item = message_item(self.message_id, item_status, [output_text_part(self.text, self._logprobs)])
        return self._snapshot(status, output=[item], usage=usage, incomplete_reason=reason,
                              completed_at=int(time.time()))

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        """End a stream whose upstream failed after it began: one terminal `response.failed`."""
        self.finished = True
        output = []
        if self._message_open:
            output = [message_item(self.message_id, "incomplete", [output_text_part(self.text, self._logprobs)])]
        failed = self._snapshot("failed", output=output, error={"code": code, "message": message})
        return [self._event("response.failed", response=failed)]
