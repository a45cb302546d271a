"""Which of a generation's tokens spell its message text, and which its reasoning or tool calls.

A chat server with a reasoning parser (vLLM's `reasoning` / `reasoning_content`) or a tool parser
still returns logprobs for *every* generated token: the thinking first, then the answer, then any
tool-call markup. Only the answer's tokens belong to the message's logprobs. With exact bytes the
message text bounds them: they are the run of tokens whose bytes spell it, found at a token
boundary after the reasoning. Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.logprobs.tokens import Token

# How many bytes of a chunk's reasoning text may belong to tokens of an earlier chunk: a character
# held back by the server's detokenizer (at most 3 bytes of a 4-byte UTF-8 sequence).
HELD_BYTES = 3


@dataclass(frozen=True, slots=True)
class Segments:
    """`before` the message text (reasoning, markers), the text's own tokens, and what follows
    (tool-call markup). `exact` is False when the bytes did not spell the text and the split
    fell back to byte counts (lossy tokens; they are re-aligned against the text later)."""

    before: list[Token]
    content: list[Token]
    after: list[Token]
    exact: bool = True


def _offsets(tokens: Sequence[Token]) -> list[int]:
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token.bytes)
    return offsets


def split_content(tokens: Sequence[Token], content: str, *, skip: int = 0, last: bool = False) -> Segments:
    """Split `tokens` around the run whose bytes spell `content`, starting at byte `skip` or later.

    `last` prefers the latest run (a stream chunk, where the text ends the chunk) over the first
    (a whole message, where tool-call markup may follow the text). Special tokens right after the
    text (end of sequence) go with it; zero-width tokens right before it stay before it.
    """
    tokens = list(tokens)
    offsets = _offsets(tokens)
    target = content.encode()
    joined = b"".join(token.bytes for token in tokens)
    candidates = [i for i in range(len(tokens)) if offsets[i] >= skip and tokens[i].bytes]
    start = None
    if target:
        for i in reversed(candidates) if last else candidates:
            if joined.startswith(target, offsets[i]):
                start = i
                break
    exact = start is not None or not target
    if start is None:
        # No run spells the text (lossy guesses, or nothing to spell): split by byte counts.
        start = candidates[0] if candidates else len(tokens)
    end = start
    stop = offsets[start] + len(target) if start < len(tokens) else 0
    while end < len(tokens) and (offsets[end] < stop or (end == start and target)):
        end += 1
    if target and _cut_character(joined[stop:]):
        end = len(tokens)  # a length cap stopped inside a character the text never showed: still the text's
    while end < len(tokens) and tokens[end].special:
        end += 1
    return Segments(tokens[:start], tokens[start:end], tokens[end:], exact)


def _cut_character(rest: bytes) -> bool:
    """True when `rest` is only the first bytes of one UTF-8 character."""
    if not rest or len(rest) > HELD_BYTES:
        return False
    try:
        rest.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.reason == "unexpected end of data" and err.start == 0
    return False

