"""Responses `tools` -> chat functions, and back: namespaces, custom tools, hosted tools (pure).

A chat upstream knows one kind of tool, a function with JSON arguments. The Responses API has more:

- `namespace` tools group functions (and custom tools) under a name (Codex's `multi_agent_v1`).
  Each member is offered as its own function, named `<namespace>__<name>` (the flat spelling Codex
  itself uses where a namespace cannot be kept, `ToolName::canonical_flat_name`), its description
  led by the namespace's. A call to it comes back as OpenAI returns one: `name` the member's,
  `namespace` the group's.
- `custom` tools take free-form text (Codex's `apply_patch` can be one). Offered as a function with
  one string parameter, `input`; a call comes back as a `custom_tool_call` item whose `input` is
  that string. A grammar in the tool's `format` cannot be enforced by a chat upstream: the model
  is shown it in the parameter's description.
- hosted tools (`web_search`, `file_search`, `code_interpreter`, `mcp`, ...) run inside OpenAI; a
  chat upstream cannot run them. Each model's `hosted_tools` policy either drops them (the
  default: the rest of the request still works, and the drop is counted and reported) or refuses
  the request.

Names are a pure function of (namespace, name, kind), so a call sent back in a later turn's `input`
maps to the same upstream name without remembering anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.translate.request import CUSTOM_INPUT, RequestTranslationError, upstream_name
from schemas.responses_request import HOSTED_TOOL_TYPES

HostedPolicy = Literal["drop", "refuse"]

_HOSTED = frozenset(HOSTED_TOOL_TYPES)


@dataclass(frozen=True, slots=True)
class CallShape:
    """How a call to one upstream function comes back to the client."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSet:
    """The request's tools as the upstream sees them, and how their calls come back."""

    functions: list[dict[str, Any]] = field(default_factory=list)
    """Chat `tools` entries, in the request's order."""
    shapes: dict[str, CallShape] = field(default_factory=dict)
    """Upstream function name -> its call's shape, for every tool that is not a plain function."""
    dropped: tuple[str, ...] = ()
    """The hosted tool types left out of the upstream request, in the request's order."""
    offered: list[dict[str, Any]] = field(default_factory=list)
    """The request's tools the model was offered (the hosted ones left out), as given."""


def _custom_function(tool: Mapping[str, Any], flat: str, description: str | None) -> dict[str, Any]:
    parameter: dict[str, Any] = {"type": "string", "description": "The tool's input, as free-form text."}
    fmt = tool.get("format") or {}
    if fmt.get("type") == "grammar":
        parameter["description"] = (f"The tool's input, as free-form text that follows this {fmt.get('syntax')} "
                                    f"grammar:\n{fmt.get('definition')}")
    function: dict[str, Any] = {"name": flat, "parameters": {
        "type": "object", "properties": {CUSTOM_INPUT: parameter}, "required": [CUSTOM_INPUT],
        "additionalProperties": False}}
    if description:
        function["description"] = description
    return function


def _plain_function(tool: Mapping[str, Any], flat: str, description: str | None) -> dict[str, Any]:
    function = {key: tool[key] for key in ("parameters", "strict") if tool.get(key) is not None}
    return {"name": flat, **({"description": description} if description else {}), **function}


def _joined(first: str | None, second: str | None) -> str | None:
    return "\n\n".join(part for part in (first, second) if part) or None


def plan_tools(tools: Iterable[Mapping[str, Any]] | None, hosted: HostedPolicy = "drop") -> ToolSet:
    """The chat functions for a (validated) request's `tools`; RequestTranslationError for a hosted
    tool under the `refuse` policy, or for two tools that would share an upstream name."""
    out = ToolSet()
    seen: dict[str, str] = {}  # upstream name -> where it came from (for the collision error)

    def add(member: Mapping[str, Any], namespace: str | None, where: str, lead: str | None = None) -> None:
        kind = "custom" if member.get("type") == "custom" else "function"
        flat = upstream_name(member["name"], namespace)
        if flat in seen:
            raise RequestTranslationError(f"{where} and {seen[flat]} would both be the function {flat!r} upstream; "
                                          "rename one", f"{where}.name")
        seen[flat] = where
        description = _joined(lead, member.get("description"))
        make = _custom_function if kind == "custom" else _plain_function
        out.functions.append({"type": "function", "function": make(member, flat, description)})
        if kind == "custom" or namespace:
            out.shapes[flat] = CallShape(kind, member["name"], namespace)

    dropped: list[str] = []
    for index, tool in enumerate(tools or []):
        kind = tool.get("type", "function")
        where = f"tools[{index}]"
        if kind in _HOSTED:
            if hosted == "refuse":
                raise RequestTranslationError(
                    f"Tool type {kind!r} runs inside OpenAI; this model's upstream cannot run it (the model's "
                    "hosted_tools policy is 'refuse'; 'drop' would leave it out).", f"{where}.type")
            dropped.append(kind)
            continue
        out.offered.append(dict(tool))
        if kind == "namespace":
            for position, member in enumerate(tool.get("tools") or []):
                add(member, tool["name"], f"{where}.tools[{position}]", tool.get("description"))
        else:
            add(tool, None, where)
    return ToolSet(out.functions, out.shapes, tuple(dropped), out.offered)


# --- calls coming back --------------------------------------------------------------------------

_INPUT_START = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def custom_input(arguments: str) -> str:
    """A custom tool's input from the function arguments the upstream wrote: `{"input": "..."}`'s
    string; anything else (a model that wrote plain text) is the input as written."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return parsed[CUSTOM_INPUT]
    return arguments


class InputStream:
    """Decodes a custom call's `input` while its JSON arguments arrive in pieces, so the client gets
    `custom_tool_call_input.delta` events as the model writes (not all at the end).

    Only the expected `{"input": "...` opening is streamed; text that is not valid JSON string
    content so far stops the deltas, and `done` gives the whole input (`custom_input`).
    """

    def __init__(self) -> None:
        self._raw: list[str] = []
        self._start: int | None = None  # where the string's content begins in the raw text
        self._consumed = 0  # raw characters of the content decoded so far
        self._closed = False
        self.streamed: list[str] = []

    def feed(self, piece: str) -> str:
        """The input text that `piece` completes ("" while an escape or the opening is incomplete)."""
        self._raw.append(piece)
        if self._closed:
            return ""
        raw = "".join(self._raw)
        if self._start is None:
            match = _INPUT_START.match(raw)
            if match is None:
                if not _could_open(raw):
                    self._closed = True
                return ""
            self._start = match.end()
        text, used, closed = _decode_prefix(raw, self._start + self._consumed)
        self._consumed += used
        self._closed = closed
        if text:
            self.streamed.append(text)
        return text

    def done(self) -> tuple[str, str]:
        """(the whole input, what is left to send as a last delta so the deltas add up to it)."""
        whole = custom_input("".join(self._raw))
        sent = "".join(self.streamed)
        return whole, whole[len(sent):] if whole.startswith(sent) else ""


def _could_open(raw: str) -> bool:
    """Whether more text could still make `raw` the start of `{"input": "`."""
    compact = re.sub(r"\s+", "", raw)
    return '{"input":"'.startswith(compact)


def _decode_prefix(raw: str, at: int) -> tuple[str, int, bool]:
    """JSON string content from `at`: (decoded text, raw characters used, whether the string ended).
    Stops before an escape that is not complete yet."""
    out: list[str] = []
    index = at
    while index < len(raw):
        char = raw[index]
        if char == '"':
            return "".join(out), index - at, True
        if char != "\\":
            out.append(char)
            index += 1
            continue
        if index + 1 >= len(raw):
            break
        code = raw[index + 1]
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            index += 2
            continue
        if code != "u":
            return "".join(out), index - at, True  # not JSON: stop streaming, `done` sorts it out
        if index + 6 > len(raw):
            break
        unit = _hex(raw[index + 2:index + 6])
        if unit is None:
            return "".join(out), index - at, True
        if 0xD800 <= unit < 0xDC00:  # a surrogate pair: wait for its second half
            if index + 12 > len(raw):
                break
            low = _hex(raw[index + 8:index + 12]) if raw[index + 6:index + 8] == "\\u" else None
            if low is None or not 0xDC00 <= low < 0xE000:
                return "".join(out), index - at, True
            out.append(chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)))
            index += 12
            continue
        out.append(chr(unit))
        index += 6
    return "".join(out), index - at, False


def _hex(digits: str) -> int | None:
    return int(digits, 16) if re.fullmatch(r"[0-9a-fA-F]{4}", digits) else None
