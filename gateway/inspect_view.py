"""`responses-gateway inspect`: what the model saw, token by token, in a terminal or as JSON.

Everything here but `stream_events` (the one network call, at the bottom) is a pure function of a
Responses stream's events, so every view is a unit test. Tokens are read back into the canonical
`Token` (exact bytes, logprob, ranked candidates). A character split across tokens is shown as the
byte chips each token really holds, joined by the character they spell, never as text a token lacks.
The browser playground (`gateway/playground/static/playground.js`) draws the same view.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.logprobs.spellings import chat_token_string, unescape_chat_token
from gateway.logprobs.tokens import SENTINEL_LOGPROB, Candidate, Token

# --- probabilities -----------------------------------------------------------------------------

# Shading buckets, lowest bound first match: (lower bound, legend label, xterm-256 background).
# The playground's CSS uses the same bounds (classes p0 .. p4), so both views read alike.
BUCKETS: tuple[tuple[float, str, int], ...] = (
    (0.9, "≥90%", 151),
    (0.6, "60–90%", 229),
    (0.3, "30–60%", 222),
    (0.1, "10–30%", 216),
    (0.0, "<10%", 210),
)
LEAST_CONFIDENT = 5


def probability(logprob: float | None) -> float:
    """exp(logprob); the 'no probability' sentinel (-9999.0) and None are 0."""
    if logprob is None or logprob <= SENTINEL_LOGPROB:
        return 0.0
    return math.exp(min(logprob, 0.0))


def bucket(p: float) -> int:
    """Index into BUCKETS: 0 is the most confident."""
    for index, (lower, _, _) in enumerate(BUCKETS):
        if p >= lower:
            return index
    return len(BUCKETS) - 1


def format_probability(p: float) -> str:
    """48.1%, 0.0026%, 0%: small numbers keep two significant digits instead of rounding to 0."""
    if p >= 0.001:
        return f"{p:.1%}"
    if p <= 0.0:
        return "0%"
    return f"{p * 100:.2g}%"


# --- reading the stream -----------------------------------------------------------------------


def token_from_entry(entry: dict[str, Any]) -> Token:
    """A Responses logprob entry -> the canonical Token. `bytes` wins over the `token` spelling."""

    def exact(item: dict[str, Any]) -> bytes:
        raw = item.get("bytes")
        return bytes(raw) if raw is not None else unescape_chat_token(item.get("token", ""))

    top = tuple(Candidate(exact(c), float(c["logprob"])) for c in entry.get("top_logprobs") or ())
    return Token(exact(entry), float(entry["logprob"]), top)


@dataclass(slots=True)
class Inspection:
    """Everything one streamed response showed, accumulated event by event with `feed`."""

    model: str | None = None
    text: str = ""
    tokens: list[Token] = field(default_factory=list)
    status: str = "in_progress"  # completed | incomplete | failed, once the stream ends
    incomplete_reason: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None

    def feed(self, event: dict[str, Any]) -> list[Token]:
        """Take one event; return the tokens it added (for live rendering)."""
        kind = event.get("type")
        if kind == "response.output_text.delta":
            self.text += event.get("delta") or ""
            added = [token_from_entry(entry) for entry in event.get("logprobs") or ()]
            self.tokens += added
            return added
        if kind == "error":
            self.status, self.error = "failed", event.get("message") or "error event without a message"
        elif kind in ("response.created", "response.completed", "response.incomplete", "response.failed"):
            response = event.get("response") or {}
            self.model = response.get("model") or self.model
            if kind != "response.created":
                self.status = response.get("status") or kind.removeprefix("response.")
                self.usage = response.get("usage")
                self.incomplete_reason = (response.get("incomplete_details") or {}).get("reason")
                self.error = (response.get("error") or {}).get("message")
        return []


# --- laying tokens out: whole characters and split ones ----------------------------------------


@dataclass(frozen=True, slots=True)
class Fragment:
    """Bytes of a character that does not fit in one token."""

    data: bytes
    character: str | None  # the character they help spell; None when the bytes never form one
    closes: bool = False  # the last bytes of that character: views name the character right after them


Piece = str | Fragment


@dataclass(frozen=True, slots=True)
class SplitCharacter:
    """A character whose bytes are not whole in one token: spread over several, or never completed."""

    text: str | None  # None: the bytes form no character (a length cap stopped it, or invalid UTF-8)
    data: bytes
    tokens: tuple[int, ...]  # indices of the tokens that hold its bytes


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """One token as shown: whole characters as text, the rest as fragments."""

    index: int
    token: Token
    pieces: tuple[Piece, ...]
    group: int | None  # index of the first token of the tokens sharing a split character


def _sequence_length(lead: int) -> int:
    """Bytes in the UTF-8 sequence that `lead` starts; 0 for a byte that cannot start one."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte <= 0xBF


def _character_spans(data: bytes) -> list[tuple[int, int, str | None]]:
    """(start, end, character) over `data`; a run of bytes that forms no character gets None."""
    spans: list[tuple[int, int, str | None]] = []
    i = 0
    while i < len(data):
        length = _sequence_length(data[i])
        if length:
            try:
                spans.append((i, i + length, data[i : i + length].decode("utf-8")))
                i += length
                continue
            except UnicodeDecodeError:
                pass
        end = i + 1  # a cut or broken sequence: its lead byte and the continuation bytes after it
        while length and end < min(len(data), i + length) and _is_continuation(data[end]):
            end += 1
        spans.append((i, end, None))
        i = end
    return spans


def ends_inside_character(data: bytes) -> bool:
    """True when `data` ends with the start of a character that later bytes could still complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if not _is_continuation(byte):
            return _sequence_length(byte) > back
    return False


def lay_out(tokens: Sequence[Token], start: int = 0) -> tuple[list[TokenLayout], list[SplitCharacter]]:
    """Split each token's bytes into whole characters and fragments of characters shared with
    neighbours (or never completed). `start` is the index of the first token in the stream."""
    offsets = [0]
    for token in tokens:
        offsets.append(offsets[-1] + len(token.bytes))
    data = b"".join(token.bytes for token in tokens)
    pieces: list[list[Piece]] = [[] for _ in tokens]
    links = [False] * len(tokens)  # links[i]: token i shares a character with token i + 1
    splits: list[SplitCharacter] = []
    first = 0  # the first token that may overlap the current span
    for begin, end, char in _character_spans(data):
        while offsets[first + 1] <= begin:
            first += 1
        last = first
        while offsets[last + 1] < end:
            last += 1
        if char is not None and first == last:
            _add_text(pieces[first], char)
            continue
        for t in range(first, last + 1):
            chunk = data[max(begin, offsets[t]) : min(end, offsets[t + 1])]
            if chunk:  # a token with no bytes (none in practice) only links its neighbours
                pieces[t].append(Fragment(chunk, char, t == last))
            links[t] = links[t] or t < last
        splits.append(SplitCharacter(char, data[begin:end], tuple(range(start + first, start + last + 1))))
    layouts: list[TokenLayout] = []
    group: int | None = None
    for t, token in enumerate(tokens):
        joined_to_previous = t > 0 and links[t - 1]
        if not joined_to_previous:
            group = start + t if links[t] else None
        layouts.append(TokenLayout(start + t, token, tuple(pieces[t]), group))
    return layouts, splits


def _add_text(pieces: list[Piece], char: str) -> None:
    if pieces and isinstance(pieces[-1], str):
        pieces[-1] += char
    else:
        pieces.append(char)


class LiveLayout:
    """Lays tokens out as they stream; a token that ends inside a character waits for the rest."""

    def __init__(self) -> None:
        self._pending: list[Token] = []
        self._next = 0

    def feed(self, tokens: Iterable[Token]) -> tuple[list[TokenLayout], list[SplitCharacter]]:
        self._pending += tokens
        if not self._pending or ends_inside_character(b"".join(t.bytes for t in self._pending)):
            return [], []
        return self.finish()

    def finish(self) -> tuple[list[TokenLayout], list[SplitCharacter]]:
        """Lay out whatever is left, dangling fragments included."""
        result = lay_out(self._pending, self._next)
        self._next += len(self._pending)
        self._pending = []
        return result


# --- summary ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    count: int
    total_logprob: float
    mean_probability: float
    perplexity: float | None  # exp(-mean logprob); inf when a token had no probability; None: no tokens
    least_confident: tuple[int, ...]  # token indices, least likely first


def summarize(tokens: Sequence[Token], least: int = LEAST_CONFIDENT) -> Summary:
    if not tokens:
        return Summary(0, 0.0, 0.0, None, ())
    logprobs = [token.logprob if token.logprob is not None else SENTINEL_LOGPROB for token in tokens]
    total = math.fsum(logprobs)
    mean = total / len(tokens)
    perplexity = math.exp(-mean) if -mean < 700 else math.inf
    order = sorted(range(len(tokens)), key=lambda i: (logprobs[i], i))[:least]
    mean_p = math.fsum(probability(lp) for lp in logprobs) / len(tokens)
    return Summary(len(tokens), total, mean_p, perplexity, tuple(order))


def chosen_rank(token: Token) -> int | None:
    """1-based rank of the sampled token among its alternatives; None when it is not among them."""
    for rank, candidate in enumerate(token.top, 1):
        if candidate.bytes == token.bytes:
            return rank
    return None


# --- text for people -----------------------------------------------------------------------------

_RESET = "\x1b[0m"
_DIM = "\x1b[2m"
_BOLD = "\x1b[1m"
# Control characters and bidi overrides in model output must not drive the terminal.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape_char(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _safe_text(text: str) -> str:
    """Text for the flowing line: newlines shown (↵) and kept, other controls escaped."""
    out = []
    for char in text:
        if char == "\n":
            out.append("↵\n")
        elif char == "\t":
            out.append(char)
        elif unicodedata.category(char) == "Cc" or char in _BIDI:
            out.append(_escape_char(char))
        else:
            out.append(char)
    return "".join(out)


def quoted(data: bytes) -> str:
    """A token for a table cell, like a Python literal: every byte visible, nothing ambiguous."""
    out = []
    for begin, end, char in _character_spans(data):
        if char is None:
            out.extend(f"\\x{b:02x}" for b in data[begin:end])
        elif char in "\\'":
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(_escape_char(char))
        else:
            out.append(char)
    return "'" + "".join(out) + "'"


def _width(text: str) -> int:
    """Terminal cells: wide (CJK, most emoji) count two, combining marks none."""
    cells = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        cells += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return cells


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _width(text))


def _clip(text: str, width: int) -> str:
    if _width(text) <= width:
        return text
    out = ""
    for char in text:
        if _width(out + char) > width - 1:
            break
        out += char
    return out + "…"


def _shade(text: str, p: float, color: bool) -> str:
    if not color:
        return text
    background = BUCKETS[bucket(p)][2]
    # Close and reopen the colour around line breaks so the next line does not start shaded.
    lines = text.split("\n")
    return "\n".join(f"\x1b[38;5;16;48;5;{background}m{line}{_RESET}" if line else "" for line in lines)


def _chips(data: bytes) -> str:
    return "".join(f"‹{b:02x}›" for b in data)


def render_run(layouts: Sequence[TokenLayout], *, color: bool) -> str:
    """The flowing text of some tokens: each shaded by its probability; split characters as byte
    chips ‹f0›‹9f›… with the character they spell, (👋), or (incomplete), after the last one."""
    out = []
    for layout in layouts:
        p = probability(layout.token.logprob)
        for piece in layout.pieces:
            if isinstance(piece, str):
                out.append(_shade(_safe_text(piece), p, color))
                continue
            out.append(_shade(_chips(piece.data), p, color))
            if piece.closes:
                label = f"({_safe_text(piece.character)})" if piece.character is not None else "(incomplete)"
                out.append(f"{_DIM}{label}{_RESET}" if color else label)
    return "".join(out)


def render_legend(*, color: bool) -> str:
    cells = [_shade(f" {label} ", lower + 0.0001, color) if color else label for lower, label, _ in BUCKETS]
    return "probability: " + " ".join(cells) + "   ‹f0› = one byte of a character split across tokens"


def render_table(layouts: Sequence[TokenLayout], splits: Sequence[SplitCharacter], *, color: bool,
                 token_width: int = 20) -> str:
    """One row per token: index, group bracket, token, bytes, probability, logprob, alternatives."""
    by_first = {split.tokens[0]: split for split in splits if len(split.tokens) > 1}
    last_in_group = {layouts[i].index for i in range(len(layouts))
                     if layouts[i].group is not None
                     and (i + 1 == len(layouts) or layouts[i + 1].group != layouts[i].group)}
    rows = [f"{'#':>4}    {_pad('token', token_width)} {'bytes':<12} {'prob':>7} {'logprob':>9}  alternatives"]
    for layout in layouts:
        token = layout.token
        p = probability(token.logprob)
        if layout.group is None:
            mark = "  "
        elif layout.index == layout.group:
            mark = "┌ "
        else:
            mark = "└ " if layout.index in last_in_group else "│ "
        split = by_first.get(layout.index)
        note = f"  {_DIM if color else ''}→ {_split_label(split)}{_RESET if color else ''}" if split else ""
        raw = " ".join(f"{b:02x}" for b in token.bytes)
        cell = _pad(_clip(quoted(token.bytes), token_width), token_width)
        prob = _shade(f"{format_probability(p):>7}", p, color)
        logprob = f"{token.logprob:>9.4f}" if token.logprob is not None else f"{'—':>9}"
        rows.append(f"{layout.index:>4}  {mark}{cell} {_clip(raw, 12):<12} {prob} {logprob}  "
                    f"{_alternatives(token, color)}{note}")
    return "\n".join(rows)


def _split_label(split: SplitCharacter) -> str:
    what = repr(split.text) if split.text is not None else "no character (incomplete)"
    return f"{what} = {split.data.hex(' ')} over tokens {split.tokens[0]}–{split.tokens[-1]}"


def _alternatives(token: Token, color: bool) -> str:
    if not token.top:
        return "—"
    cells = []
    for candidate in token.top:
        cell = f"{quoted(candidate.bytes)} {format_probability(probability(candidate.logprob))}"
        if candidate.bytes == token.bytes:
            cell = f"{_BOLD}*{cell}{_RESET}" if color else f"*{cell}"
        cells.append(cell)
    if chosen_rank(token) is None:
        cells.append(f"(sampled token not in top {len(token.top)})")
    return "  ".join(cells)


def render_summary(inspection: Inspection, *, color: bool) -> str:
    summary = summarize(inspection.tokens)
    perplexity = "—" if summary.perplexity is None else (
        "∞" if math.isinf(summary.perplexity) else f"{summary.perplexity:.3f}")
    lines = [f"tokens {summary.count} · total logprob {summary.total_logprob:.4f} · perplexity {perplexity}"
             f" · mean probability {format_probability(summary.mean_probability)}"]
    if summary.least_confident:
        cells = []
        for index in summary.least_confident:
            token = inspection.tokens[index]
            p = probability(token.logprob)
            cells.append(f"#{index} {quoted(token.bytes)} {_shade(format_probability(p), p, color)}")
        lines.append("least confident: " + " · ".join(cells))
    _, splits = lay_out(inspection.tokens)
    if splits:
        lines.append("split characters: " + " · ".join(_split_label(split) for split in splits))
    status = inspection.status
    if inspection.incomplete_reason:
        status += f" ({inspection.incomplete_reason})"
    if inspection.error:
        status += f": {inspection.error}"
    if inspection.usage:
        status += (f" · usage: {inspection.usage.get('input_tokens')} in, "
                   f"{inspection.usage.get('output_tokens')} out")
    lines.append(f"status: {status}")
    return "\n".join(lines)


def render_report(inspection: Inspection, *, color: bool) -> str:
    """Everything after the flowing text: legend, the per-token table and the summary."""
    layouts, splits = lay_out(inspection.tokens)
    return "\n\n".join([render_legend(color=color), render_table(layouts, splits, color=color),
                        render_summary(inspection, color=color)])


def render(inspection: Inspection, *, color: bool) -> str:
    """The whole terminal view at once (the CLI prints the text live, then `render_report`)."""
    layouts, _ = lay_out(inspection.tokens)
    header = f"model {inspection.model or '?'}"
    return "\n\n".join([header, render_run(layouts, color=color), render_report(inspection, color=color)])


# --- JSON for scripts ----------------------------------------------------------------------------


def _json_number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


def to_json(inspection: Inspection) -> dict[str, Any]:
    """The same view as data: tokens with bytes and alternatives, split characters, the summary."""
    layouts, splits = lay_out(inspection.tokens)
    summary = summarize(inspection.tokens)
    tokens = []
    for layout in layouts:
        token = layout.token
        tokens.append({
            "index": layout.index,
            "token": chat_token_string(token.bytes),
            "bytes": list(token.bytes),
            "logprob": token.logprob,
            "probability": probability(token.logprob),
            "split_group": layout.group,
            "chosen_rank": chosen_rank(token),
            "top_logprobs": [{"token": chat_token_string(c.bytes), "bytes": list(c.bytes), "logprob": c.logprob,
                              "probability": probability(c.logprob)} for c in token.top],
        })
    return {
        "model": inspection.model,
        "status": inspection.status,
        "incomplete_reason": inspection.incomplete_reason,
        "error": inspection.error,
        "text": inspection.text,
        "usage": inspection.usage,
        "tokens": tokens,
        "split_characters": [{"text": s.text, "bytes": list(s.data), "tokens": list(s.tokens)} for s in splits],
        "summary": {
            "tokens": summary.count,
            "total_logprob": summary.total_logprob,
            "mean_probability": summary.mean_probability,
            "perplexity": _json_number(summary.perplexity),  # null when infinite or without tokens
            "least_confident": list(summary.least_confident),
        },
    }


# --- the one network call -----------------------------------------------------------------------


class GatewayRequestError(Exception):
    """The gateway refused the request or could not be reached; the message says which."""


def request_body(model: str, prompt: str, *, top_logprobs: int, max_output_tokens: int | None,
                 instructions: str | None, temperature: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "input": prompt, "stream": True, "top_logprobs": top_logprobs,
                            "include": ["message.output_text.logprobs"]}
    if max_output_tokens is not None:
        body["max_output_tokens"] = max_output_tokens
    if instructions:
        body["instructions"] = instructions
    if temperature is not None:
        body["temperature"] = temperature
    return body


async def stream_events(base_url: str, body: dict[str, Any], api_key: str | None = None,
                        timeout: float = 600.0) -> AsyncIterator[dict[str, Any]]:
    """POST a streaming /v1/responses request and yield its events as dicts."""
    import aiohttp
    import orjson

    from gateway.sse import data_payloads

    url = base_url.rstrip("/") + ("/responses" if base_url.rstrip("/").endswith("/v1") else "/v1/responses")
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
                session.post(url, data=orjson.dumps(body), headers=headers) as reply:
            if reply.status >= 400:
                raise GatewayRequestError(f"{url} answered HTTP {reply.status}: {_error_text(await reply.read())}")
            async for data in data_payloads(reply.content):
                yield orjson.loads(data)
    except aiohttp.ClientError as exc:
        raise GatewayRequestError(f"cannot reach {url}: {exc}") from None
    except TimeoutError:
        raise GatewayRequestError(f"{url} did not finish within {timeout:g}s") from None


def _error_text(raw: bytes) -> str:
    import orjson

    try:
        return str(orjson.loads(raw)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return raw.decode("utf-8", errors="replace")[:300]


async def inspect(base_url: str, body: dict[str, Any], *, api_key: str | None = None,
                  on_text: Callable[[str], None] | None = None, color: bool = False) -> Inspection:
    """Stream one request; hand each settled run of tokens, rendered, to `on_text` as it arrives."""
    inspection = Inspection(model=body.get("model"))
    live = LiveLayout()
    async for event in stream_events(base_url, body, api_key):
        added = inspection.feed(event)
        if on_text is not None and added:
            text = render_run(live.feed(added)[0], color=color)
            if text:
                on_text(text)
    if on_text is not None:
        text = render_run(live.finish()[0], color=color)
        if text:
            on_text(text)
    if inspection.status == "in_progress":
        inspection.status, inspection.error = "failed", "the stream ended without a final event"
    return inspection
