"""Scripted replies with more than text: a reasoning parser's thinking and a tool parser's calls.

A reply in `replies` may be a string (plain text) or an object:

    {"reasoning": "Let me think.", "content": "It is 21 °C."}
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    {"content": "Checking.", "tool_calls": [{"name": ..., "arguments": "{...}"}, ...]}

The simulated model writes the thinking first, then the text, then each call as Hermes-style markup
(`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), then EOS, and every one of those tokens
gets a logprob, as vLLM gives with `--reasoning-parser` / `--tool-call-parser`. What the client
sees is what those parsers make of it: `reasoning` (or `reasoning_content`, older vLLM) before
`content`, and `tool_calls` with `finish_reason: "tool_calls"`. Pure functions; no I/O.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class Script:
    """A reply's parts, in the order the model writes them."""

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ScriptedCall, ...] = ()


def read_script(value: Any) -> Script | None:
    """A `replies` value as a Script; None for a plain string (the ordinary path)."""
    if not isinstance(value, Mapping):
        return None
    calls = list(value.get("tool_calls") or [])
    if value.get("tool_call") is not None:
        calls.insert(0, value["tool_call"])
    return Script(str(value.get("content") or ""), str(value.get("reasoning") or ""),
                  tuple(_call(call) for call in calls))


def _call(raw: Mapping[str, Any]) -> ScriptedCall:
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ScriptedCall(str(raw["name"]), arguments)


def markup(call: ScriptedCall) -> str:
    """What a Hermes-style model writes for one call (Qwen2.5 / Hermes chat templates)."""
    return f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n</tool_call>'


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each part of a scripted reply lies in the output ids: [0, reasoning_end) is the
    thinking, [reasoning_end, content_end) the text, then each call's markup span."""

    script: Script
    reasoning_end: int
    content_end: int
    calls: tuple[tuple[int, int], ...]
    call_ids: tuple[str, ...]


def layout(script: Script, encode: Callable[[str], list[int]]) -> tuple[list[int], Layout]:
    """The reply's ids (without EOS) and where each part lies."""
    ids = list(encode(script.reasoning)) if script.reasoning else []  # a copy: encoders may cache their lists
    reasoning_end = len(ids)
    ids += encode(script.content) if script.content else []
    content_end = len(ids)
    spans = []
    for call in script.tool_calls:
        start = len(ids)
        ids += encode(markup(call))
        spans.append((start, len(ids)))
    call_ids = tuple(f"chatcmpl-tool-{uuid.uuid4().hex}" for _ in script.tool_calls)
    return ids, Layout(script, reasoning_end, content_end, tuple(spans), call_ids)


def _overlap(start: int, end: int, lo: int, hi: int) -> tuple[int, int] | None:
    a, b = max(start, lo), min(end, hi)
    return (a, b) if a < b else None


def _arguments_slice(arguments: str, span: tuple[int, int], lo: int, hi: int) -> str:
    """The piece of a call's arguments streamed with its tokens [lo, hi): proportional to the tokens."""
    first, last = span
    size = last - first
    return arguments[len(arguments) * (lo - first) // size: len(arguments) * (hi - first) // size]


def completed_calls(plan: Layout, produced: int) -> list[JSON]:
    """The whole-message `tool_calls` for the calls whose markup was generated in full."""
    out = []
    for call, (_, end), call_id in zip(plan.script.tool_calls, plan.calls, plan.call_ids, strict=True):
        if end <= produced:
            function = {"name": call.name, "arguments": call.arguments}
            out.append({"id": call_id, "type": "function", "function": function})
    return out


def cut_markup(plan: Layout, produced: int, decode: Callable[[Sequence[int]], str], ids: Sequence[int]) -> str:
    """Markup of a call cut short by the length cap: the tool parser gives it back as text."""
    for start, end in plan.calls:
        if start < produced < end:
            return decode(ids[start:produced])
    return ""


def tool_call_pieces(plan: Layout, start: int, end: int) -> list[JSON]:
    """The `tool_calls` delta pieces for the engine step [start, end): id, type and name come with
    a call's first piece, then its arguments, a slice per step."""
    pieces = []
    for index, (call, span, call_id) in enumerate(zip(plan.script.tool_calls, plan.calls, plan.call_ids,
                                                      strict=True)):
        part = _overlap(start, end, *span)
        if part is None:
            continue
        piece: JSON = {"index": index}
        function: JSON = {"arguments": _arguments_slice(call.arguments, span, *part)}
        if part[0] == span[0]:
            piece.update(id=call_id, type="function")
            function = {"name": call.name, **function}
        piece["function"] = function
        pieces.append(piece)
    return pieces


class ScriptedTurn:
    """What the parsers make of a scripted reply's ids, step by step (stream) or at once (body).

    `decoder()` gives a fresh incremental detokenizer (text held back until a character completes);
    the thinking and the text each get their own, as each is its own channel on the wire.
    """

    def __init__(self, plan: Layout, ids: Sequence[int], decoder: Callable[[], Any], reasoning_field: str) -> None:
        self.plan = plan
        self.ids = list(ids)
        self.field = reasoning_field
        self._thinking = decoder()
        self._text = decoder()
        self._decode_all = decoder

    def delta(self, start: int, end: int) -> JSON:
        """The `delta` of the chunk for engine step [start, end)."""
        plan = self.plan
        delta: JSON = {}
        thinking = _overlap(start, end, 0, plan.reasoning_end)
        if thinking is not None:
            delta[self.field] = self._thinking.feed(self.ids[slice(*thinking)])
        text = _overlap(start, end, plan.reasoning_end, plan.content_end)
        if text is not None:
            delta["content"] = self._text.feed(self.ids[slice(*text)])
        pieces = tool_call_pieces(plan, start, end)
        if pieces:
            delta["tool_calls"] = pieces
        return delta or {"content": ""}  # the end-of-sequence step

    def finish_reason(self, finish: str, produced: int) -> str:
        return "tool_calls" if finish == "stop" and completed_calls(self.plan, produced) else finish

    def message(self, produced: int) -> JSON:
        """The message fields of a whole response that generated `produced` ids."""
        plan = self.plan
        reasoning = self._decode_all().feed(self.ids[: min(produced, plan.reasoning_end)])
        content = self._decode_all().feed(self.ids[plan.reasoning_end: min(produced, plan.content_end)])
        decoder = self._decode_all()
        content += cut_markup(plan, produced, decoder.feed, self.ids)
        calls = completed_calls(plan, produced)
        fields: JSON = {"content": content or (None if calls else ""), self.field: reasoning or None}
        if calls:
            fields["tool_calls"] = calls
        return fields
