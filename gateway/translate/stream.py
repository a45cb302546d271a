"""The streaming Responses translator: feed it canonical tokens, get Responses events back.

Sans-I/O (after h11): no sockets here. The server loop reads an upstream chunk, parses it into
tokens with the dialect's parser, calls `feed`, and writes the events this returns. The same
object builds the final Response, so streamed and non-streamed output cannot drift apart.

Text is built from the tokens' exact bytes. A token that ends inside a character waits until the
character completes, so each `output_text.delta` carries the logprobs of exactly the tokens whose
text it adds. Tokens left dangling inside an unfinished character when generation stops (a length
cap) go out in a last delta with empty text: their logprobs are kept, the text cannot hold them.

Output items come one at a time, in the order the upstream produced them (a reasoning item, the
message, function calls): an item is closed (its `.done` events) before the next one is added.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.canonical.step import ToolCallDelta, UpstreamFormatError
from gateway.logprobs.compiled import TokenBatch
from gateway.logprobs.packed import PackedTokens
from gateway.logprobs.parse import id_table
from gateway.logprobs.render import render_responses, render_responses_json
from gateway.logprobs.tokens import Token
from gateway.logprobs.vocab import Vocab
from gateway.translate.grouping import TextGrouper
from gateway.translate.response_object import (
    ResponseSettings,
    custom_tool_call_item,
    function_call_item,
    message_item,
    new_id,
    output_text_part,
    reasoning_item,
    response_object,
    status_for_finish,
)
from gateway.translate.tools import InputStream

_MESSAGE = "message"
_TOKEN_SEQUENCES = (list, TokenBatch)  # what a group's tokens are (see grouping.Group)
_TEXT_PIECES = 64  # the message's text is joined whenever this many pieces wait
_DELTA_FRAME_HEAD = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":'


@dataclass(slots=True)
class _Reasoning:
    id: str
    output_index: int
    text: list[str] = field(default_factory=list)
    status: str | None = None  # set when closed

    def item(self, status: str) -> dict[str, Any]:
        return reasoning_item(self.id, status, "".join(self.text))


@dataclass(slots=True)
class _Call:
    """A function call, or a call to a custom tool (`custom` set: its input decoded as it arrives)."""

    id: str
    output_index: int
    call_id: str
    name: str
    namespace: str | None = None
    custom: InputStream | None = None
    arguments: list[str] = field(default_factory=list)
    status: str | None = None

    def item(self, status: str) -> dict[str, Any]:
        if self.custom is not None:
            text = self.custom.done()[0] if status != "in_progress" else "".join(self.custom.streamed)
            return custom_tool_call_item(self.id, status, self.call_id, self.name, text, self.namespace)
        return function_call_item(self.id, status, self.call_id, self.name, "".join(self.arguments), self.namespace)


def _call_id(upstream_id: str | None) -> str:
    """OpenAI's call ids start `call_`; the upstream's id is kept inside, so it stays recognisable."""
    if upstream_id is None:
        return new_id("call")
    return upstream_id if upstream_id.startswith("call_") else f"call_{upstream_id}"


Logprobs = list[dict[str, Any]] | orjson.Fragment


class MessageLogprobs:
    """The message's logprob entries, as its reader wants them.

    As dicts for code that reads them; as JSON (`orjson.Fragment`) for the server, which only
    serializes them: each delta's array is written by the compiled renderer and sent, and the
    message's tokens are kept packed (`PackedTokens`: their bytes, logprobs and alternatives in flat
    arrays, ~100 bytes a token at k=5 where the JSON is ~600) until the whole list is asked for, at
    the end, and rendered once, no entry dict built. A long stream so holds a few bytes per token,
    not its rendered logprobs. Without delta events (a non-streamed Response) the tokens wait as they
    are and are rendered once, at the end; a whole body's `TokenBatch` (see grouping.feed_all) is
    rendered from its flat arrays, no Token built.
    """

    def __init__(self, k: int, serialized: bool, table: tuple[bytes | None, ...] | None = None) -> None:
        self.k = k
        self.serialized = serialized
        self._dicts: list[dict[str, Any]] = []
        self._packed = PackedTokens(table)  # the tokens of the deltas sent so far (serialized)
        self._waiting: list[Token] = []
        self._batch: TokenBatch | None = None  # kept before any other token: stands for its visible tokens
        self._joined: orjson.Fragment | None = None
        self._joined_from: TokenBatch | None = None  # the batch `_joined` was rendered from, if one was

    def delta(self, tokens: list[Token] | TokenBatch) -> Logprobs:
        """The entries of one delta event; its tokens are also kept for the message. A TokenBatch (a stream
        chunk the grouper passed on whole: no special token) stays ids from its read to its JSON."""
        if not self.serialized:
            entries = render_responses(tokens if type(tokens) is list else tokens.tokens(), self.k)
            self._dicts.extend(entries)
            return entries
        return orjson.Fragment(self.delta_json(tokens))

    def delta_json(self, tokens: list[Token] | TokenBatch) -> bytes:
        """A serialized stream's `delta(tokens)`, as the JSON bytes (see ResponsesStream.text_frame)."""
        self._packed.extend(tokens)
        self._joined = self._joined_from = None
        return render_responses_json(tokens, self.k)

    def keep(self, tokens: list[Token]) -> None:
        """Tokens of text that gets no delta event: rendered with the rest when the list is asked for."""
        self._joined = self._joined_from = None
        if type(tokens) is TokenBatch:
            if self._batch is None and not self._waiting and not len(self._packed):
                self._batch = tokens
                return
            tokens = tokens.tokens(True)
        self._unbatch()
        self._waiting.extend(tokens)

    def _unbatch(self) -> None:
        if self._batch is not None:
            self._waiting[:0] = self._batch.tokens(True)
            self._batch = None

    def rendered_from(self) -> tuple[orjson.Fragment, TokenBatch, int] | None:
        """The list as `whole()` last gave it, with the batch it was rendered from (store.codec encodes the
        saved Response from that batch), or None when it was not rendered from one."""
        if self._joined is None or self._joined_from is None:
            return None
        return self._joined, self._joined_from, self.k

    def whole(self) -> Logprobs:
        if self._batch is not None and (not self.serialized or len(self._packed)):
            self._unbatch()
        if not self.serialized:
            if self._waiting:
                self._dicts.extend(render_responses(self._waiting, self.k))
                self._waiting = []
            return self._dicts
        if self._joined is None and self._batch is not None:
            self._joined = orjson.Fragment(self._batch.render_json(self.k, orjson.dumps))
            self._joined_from = self._batch
        if self._joined is None and not self._waiting:
            self._joined = orjson.Fragment(self._packed.render_json(self.k))
            self._joined_from = self._packed.batch
        if self._joined is None:
            tokens = self._packed.tokens() if len(self._packed) else []
            self._joined = orjson.Fragment(render_responses_json(tokens + self._waiting, self.k))
        return self._joined


class ResponsesStream:
    """One Responses stream (or non-streamed Response), built token by token.

    `serialized`: the message's logprobs come out as `orjson.Fragment`s (JSON written once), for a
    caller that only serializes what it gets (the server). `deltas`: False for a
    non-streamed Response: no `output_text.delta` events (text and tokens are only kept), and none of the
    message's other events but the terminal one (nobody would see them).
    """

    def __init__(self, settings: ResponseSettings, *, response_id: str | None = None,
                 created_at: int | None = None, vocab: Vocab | None = None, serialized: bool = False,
                 deltas: bool = True) -> None:
        self.settings = settings
        self.response_id = response_id or new_id("resp")
        self.message_id = new_id("msg")
        self.created_at = created_at if created_at is not None else int(time.time())
        self._sequence = 0
        self._text: list[str] = []
        table = id_table(vocab)[0] if vocab is not None and serialized and deltas else None
        self._logprobs = MessageLogprobs(settings.top_logprobs, serialized, table)
        self._with_deltas = deltas
        # The open message's `output_text.delta` frame as `text_frame` writes it: its fixed middle part,
        # set when the message opens (None: no frames, only events).
        self._frame_middle: bytes | None = None
        self._grouper = TextGrouper(vocab)
        # Output items in order: the message (as _MESSAGE), reasoning items and function calls.
        self._items: list[_Reasoning | _Call | str] = []
        self._open: _Reasoning | _Call | str | None = None
        self._message_index: int | None = None
        self._message_status: str | None = None
        self._calls: dict[int, _Call] = {}
        self._pending_calls: dict[int, list[ToolCallDelta]] = {}  # pieces that came before the name
        self.reasoning_tokens = 0
        self.finished = False

    @property
    def _message_open(self) -> bool:
        return self._message_index is not None

    # --- events -------------------------------------------------------------------------------

    def _event(self, event_type: str, **fields: Any) -> dict[str, Any]:
        event = {"type": event_type, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(self.settings, self.response_id, self.created_at, status,
                               extra.pop("output", []), **extra)

    def snapshot(self, status: str) -> dict[str, Any]:
        """The Response as it stands, under `status` (a background response's `queued` or `cancelled`)."""
        return self._snapshot(status, output=self._output("in_progress" if status == "in_progress" else "incomplete"))

    def start(self) -> list[dict[str, Any]]:
        if not self._with_deltas:  # a non-streamed Response: no event is sent, so none is built
            return []
        snapshot = self._snapshot("in_progress")
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def _add(self, item: _Reasoning | _Call | str) -> list[dict[str, Any]]:
        """Close the item being streamed, then make `item` the open one."""
        events = self._close_open("completed")
        self._items.append(item)
        self._open = item
        return events

    def _open_message(self) -> list[dict[str, Any]]:
        if self._message_open:
            return []
        events = self._add(_MESSAGE)
        self._message_index = len(self._items) - 1
        if not self._with_deltas:  # (as `start`)
            return events
        index = self._message_index
        if self._logprobs.serialized:
            self._frame_middle = b',"item_id":%s,"output_index":%d,"content_index":0,"delta":' % (
                orjson.dumps(self.message_id), index)
        events.append(self._event("response.output_item.added", output_index=index,
                                  item=message_item(self.message_id, "in_progress", [])))
        events.append(self._event("response.content_part.added", item_id=self.message_id, output_index=index,
                                  content_index=0, part=output_text_part("", [])))
        return events

    def _close_open(self, status: str) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        if item == _MESSAGE:
            return self._close_message(status)
        assert not isinstance(item, str)
        item.status = status
        index = item.output_index
        if isinstance(item, _Reasoning):
            text = "".join(item.text)
            return [
                self._event("response.reasoning_text.done", item_id=item.id, output_index=index, content_index=0,
                            text=text),
                self._event("response.content_part.done", item_id=item.id, output_index=index, content_index=0,
                            part={"type": "reasoning_text", "text": text}),
                self._event("response.output_item.done", output_index=index, item=item.item(status)),
            ]
        if item.custom is not None:
            whole, rest = item.custom.done()
            events = [self._event("response.custom_tool_call_input.delta", item_id=item.id, output_index=index,
                                  delta=rest)] if rest and self._with_deltas else []
            return [*events,
                    self._event("response.custom_tool_call_input.done", item_id=item.id, output_index=index,
                                input=whole),
                    self._event("response.output_item.done", output_index=index, item=item.item(status))]
        return [
            self._event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                        name=item.name, arguments="".join(item.arguments)),
            self._event("response.output_item.done", output_index=index, item=item.item(status)),
        ]

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        # Bytes still waiting for the rest of a character go out now, in a delta with no text.
        events = self._message_deltas(self._grouper.finish("length" if status == "incomplete" else None))
        self._message_status = status
        if not self._with_deltas:  # (as `start`) the message item is built once, by `_output`
            return events
        index = self._message_index
        logprobs = self.logprobs
        part = output_text_part(self.text, logprobs)
        events.append(self._event("response.output_text.done", item_id=self.message_id, output_index=index,
                                  content_index=0, text=self.text, logprobs=logprobs))
        events.append(self._event("response.content_part.done", item_id=self.message_id, output_index=index,
                                  content_index=0, part=part))
        events.append(self._event("response.output_item.done", output_index=index,
                                  item=message_item(self.message_id, status, [part])))
        return events

    def _keep_text(self, text: str) -> None:
        pieces = self._text
        pieces.append(text)
        if len(pieces) >= _TEXT_PIECES:  # one str per character costs ~50 bytes each in a long stream
            pieces[:] = ["".join(pieces)]

    def text_frame(self, upstream_text: str, batch: TokenBatch) -> bytes | None:
        """The usual chunk of a streamed message, straight to its `response.output_text.delta` frame (the
        bytes `sse.encode_events` writes for the event `feed` makes of it): one visible token, a TokenBatch,
        of the open message (`TextGrouper.feed_batch`); empty while it waits for the rest of its character.
        None, nothing changed, for any other chunk: `feed` it."""
        middle = self._frame_middle
        if middle is None or self._open is not _MESSAGE:
            return None
        groups = self._grouper.feed_batch(batch, upstream_text)
        if not groups:
            return None if groups is None else b""
        text, tokens = groups[0]
        self._keep_text(text)
        entries = self._logprobs.delta_json(tokens) if self.settings.include_logprobs else b"[]"
        sequence = self._sequence
        self._sequence = sequence + 1
        return b"".join((_DELTA_FRAME_HEAD, b"%d" % sequence, middle, orjson.dumps(text), b',"logprobs":', entries,
                         b"}\n\n"))

    def _delta(self, text: str, tokens: list[Token]) -> dict[str, Any] | None:
        self._keep_text(text)
        if not self._with_deltas:
            if self.settings.include_logprobs:
                self._logprobs.keep(tokens)
            return None
        if self.settings.include_logprobs:
            entries = self._logprobs.delta(tokens if type(tokens) in _TOKEN_SEQUENCES else list(tokens))
        else:
            entries = []
        # Built in place (one event per character of output): the same dict `_event` would build.
        event = {"type": "response.output_text.delta", "sequence_number": self._sequence, "item_id": self.message_id,
                 "output_index": self._message_index, "content_index": 0, "delta": text, "logprobs": entries}
        self._sequence += 1
        return event

    # --- input --------------------------------------------------------------------------------

    def feed(self, tokens: Iterable[Token], upstream_text: str = "") -> list[dict[str, Any]]:
        """Take one upstream step of message text: its tokens (exact bytes) and the text delta it reported."""
        if not self._with_deltas:  # only the sum of the groups is used: one per step where it can be
            return self._deltas(self._grouper.feed_all(tokens, upstream_text))
        groups = self._grouper.feed(tokens, upstream_text)
        if len(groups) == 1 and self._open is _MESSAGE:  # the usual step (one delta of the open message), directly
            text, grouped = groups[0]
            return [self._delta(text, grouped)]  # type: ignore[list-item]  # with deltas: always an event
        return self._deltas(groups) if groups else []

    def _deltas(self, groups: list[tuple[str, list[Token]]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for text, tokens in groups:
            if self._open != _MESSAGE:
                if self._calls and not text.strip():
                    continue  # line breaks a tool parser left between or after calls: no message of their own
                if self._message_status is not None:
                    raise UpstreamFormatError("message text continued after a tool call began")
                events.extend(self._open_message())
            event = self._delta(text, tokens)
            if event is not None:
                events.append(event)
        return events

    def _message_deltas(self, groups: list[tuple[str, list[Token]]]) -> list[dict[str, Any]]:
        events = [self._delta(text, tokens) for text, tokens in groups]
        return [event for event in events if event is not None]

    def feed_reasoning(self, text: str | None, tokens: Iterable[Token] = ()) -> list[dict[str, Any]]:
        """Thinking text from a reasoning parser. Its tokens are counted, never shown as logprobs."""
        self.reasoning_tokens += sum(1 for _ in tokens)
        if not text:
            return []
        events: list[dict[str, Any]] = []
        item = self._open
        if not isinstance(item, _Reasoning):
            item = _Reasoning(new_id("rs"), len(self._items))
            events += self._add(item)
            events += [
                self._event("response.output_item.added", output_index=item.output_index,
                            item=reasoning_item(item.id, "in_progress", None)),
                self._event("response.content_part.added", item_id=item.id, output_index=item.output_index,
                            content_index=0, part={"type": "reasoning_text", "text": ""}),
            ]
        item.text.append(text)
        events.append(self._event("response.reasoning_text.delta", item_id=item.id, output_index=item.output_index,
                                  content_index=0, delta=text))
        return events

    def feed_tool_calls(self, deltas: Iterable[ToolCallDelta]) -> list[dict[str, Any]]:
        """Tool calls, whole or in pieces; a call's item is added once its name is known."""
        events: list[dict[str, Any]] = []
        for delta in deltas:
            call = self._calls.get(delta.index)
            if call is None:
                pieces = self._pending_calls.setdefault(delta.index, [])
                pieces.append(delta)
                name = next((p.name for p in pieces if p.name), None)
                if name is None:
                    continue  # wait for the name: `output_item.added` must carry it
                del self._pending_calls[delta.index]
                call = self._new_call(name, next((p.id for p in pieces if p.id), None))
                self._calls[delta.index] = call
                events += self._add(call)
                events.append(self._event("response.output_item.added", output_index=call.output_index,
                                          item=call.item("in_progress")))
                arguments = "".join(p.arguments for p in pieces)
            elif call is not self._open:
                raise UpstreamFormatError(f"tool call {delta.index} continued after another output began")
            else:
                arguments = delta.arguments
            if not arguments:
                continue
            call.arguments.append(arguments)
            if call.custom is None:
                events.append(self._event("response.function_call_arguments.delta", item_id=call.id,
                                          output_index=call.output_index, delta=arguments))
                continue
            text = call.custom.feed(arguments)
            if text and self._with_deltas:
                events.append(self._event("response.custom_tool_call_input.delta", item_id=call.id,
                                          output_index=call.output_index, delta=text))
        return events

    def _new_call(self, upstream_name: str, upstream_id: str | None) -> _Call:
        """A call to the upstream function `upstream_name`, shaped as the client's tool is (a namespace
        member comes back with its own name and the namespace; a custom tool as `custom_tool_call`)."""
        shape = self.settings.tool_shapes.get(upstream_name)
        if shape is None:
            return _Call(new_id("fc"), len(self._items), _call_id(upstream_id), upstream_name)
        custom = shape.kind == "custom"
        return _Call(new_id("ctc" if custom else "fc"), len(self._items), _call_id(upstream_id), shape.name,
                     shape.namespace, InputStream() if custom else None)

    # --- output -------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def logprobs(self) -> Logprobs:
        """The message's entries so far (a Fragment of their JSON when `serialized`)."""
        return self._logprobs.whole()

    def logprob_lists(self) -> list[tuple[orjson.Fragment, TokenBatch, int]]:
        """The logprobs Fragment the last Response or event holds, with the batch it was rendered from
        (store.codec.LogprobList), when it was: saving the Response then reads no JSON back."""
        found = self._logprobs.rendered_from()
        return [] if found is None else [found]

    def _end(self, finish_reason: str | None) -> tuple[list[dict[str, Any]], str, str | None]:
        """Flush held tokens, make sure there is an output item, close the open one."""
        events = self._deltas(self._grouper.finish(finish_reason))
        if self._pending_calls:
            raise UpstreamFormatError("a tool call never got its name")
        if not self._items:
            events += self._open_message()  # an empty answer is still a message
        status, reason = status_for_finish(finish_reason)
        events += self._close_open("incomplete" if status == "incomplete" else "completed")
        return events, status, reason

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Close the output and end with `response.completed` or `response.incomplete`."""
        events, _, _ = self._end(finish_reason)
        final = self.final_response(finish_reason, usage)
        events.append(self._event(f"response.{final['status']}", response=final))
        self.finished = True
        return events

    def final_response(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        """The complete Response (also what a non-streamed request returns)."""
        self._end(finish_reason)
        status, reason = status_for_finish(finish_reason)
        return self._snapshot(status, output=self._output(), usage=self._usage(usage), incomplete_reason=reason,
                              completed_at=int(time.time()))

    def _output(self, open_status: str = "incomplete") -> list[dict[str, Any]]:
        """Every item so far; one never closed (a failure cut it short) gets `open_status`."""
        output = []
        for item in self._items:
            if item == _MESSAGE:
                status = self._message_status or open_status
                output.append(message_item(self.message_id, status, [output_text_part(self.text, self.logprobs)]))
            else:
                assert not isinstance(item, str)
                output.append(item.item(item.status or open_status))
        return output

    def _usage(self, usage: dict[str, Any] | None) -> dict[str, Any] | None:
        """The upstream's usage, with the reasoning tokens we counted when it did not count them."""
        if usage is None or not self.reasoning_tokens:
            return usage
        details = usage.get("output_tokens_details") or {}
        if details.get("reasoning_tokens"):
            return usage
        return {**usage, "output_tokens_details": {**details, "reasoning_tokens": self.reasoning_tokens}}

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        """End a stream whose upstream failed after it began: one terminal `response.failed`."""
        self.finished = True
        failed = self._snapshot("failed", output=self._output(), error={"code": code, "message": message})
        return [self._event("response.failed", response=failed)]
