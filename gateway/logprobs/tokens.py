"""The canonical token: exact bytes, a logprob, ranked alternatives.

Wire formats differ in how they *spell* a token (text, escapes, placeholders); the canonical
form holds only what is true of it, so every conversion goes through here.

Tokens and candidates are immutable named tuples rather than frozen dataclasses: the hot path
builds one token and up to 21 candidates per generated token, and a tuple is built several times
faster (a frozen dataclass sets each field through `object.__setattr__`).
"""

from __future__ import annotations

import math
from enum import Enum
from operator import attrgetter
from typing import NamedTuple

# OpenAI's documented "very unlikely" value; every other sentinel is mapped to it so that no
# output ever carries NaN, Infinity or float32-lowest.
SENTINEL_LOGPROB = -9999.0
_INF = math.inf


class Origin(Enum):
    """Where a token's bytes came from: how much to trust them."""

    EXACT = "exact"  # the upstream sent exact bytes (llama.cpp, OpenAI, or our own rendering)
    TOKEN_ID = "token_id"  # looked up by token id in the model's tokenizer
    TEXT = "text"  # the upstream string was already lossless UTF-8 text
    ALIGNED = "aligned"  # a lossy string, repaired by aligning against the final text
    AMBIGUOUS = "ambiguous"  # could not be pinned down; bytes are a best guess


class Candidate(NamedTuple):
    """One ranked alternative at a position."""

    bytes: bytes
    logprob: float
    token_id: int | None = None
    origin: Origin = Origin.EXACT


class Token(NamedTuple):
    """One generated (or prompt) token.

    `logprob` is None only for a position with no context (the first echoed prompt token).
    `top` holds the alternatives as given; call `normalized_top(k)` for the client's view.
    `top_absent` (the upstream sent no list at all, as completions echo does) is not part of a
    token's identity: it takes no part in equality or hashing.
    """

    bytes: bytes
    logprob: float | None
    top: tuple[Candidate, ...] = ()
    token_id: int | None = None
    special: bool = False
    origin: Origin = Origin.EXACT
    top_absent: bool = False

    def normalized_top(self, k: int) -> tuple[Candidate, ...]:
        return normalize_candidates(self.top, k)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Token):
            return NotImplemented
        return self[:6] == other[:6]

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, Token):
            return NotImplemented
        return self[:6] != other[:6]

    def __hash__(self) -> int:
        return hash(self[:6])


def normalize_logprob(value: float | None) -> float:
    """Map every 'no probability' spelling (null, -inf, NaN, float32 lowest, anything below the
    sentinel) to SENTINEL_LOGPROB; keep real values unchanged."""
    if type(value) is float and SENTINEL_LOGPROB < value < _INF:
        return value  # the common case, decided in one comparison chain
    if value is None or math.isnan(value) or value <= SENTINEL_LOGPROB:
        return SENTINEL_LOGPROB
    if math.isinf(value):  # +inf is not a logprob either
        return SENTINEL_LOGPROB
    return float(value)


_by_logprob = attrgetter("logprob")
_token_id = attrgetter("token_id")
_bytes_of = attrgetter("bytes")


def normalize_candidates(candidates: tuple[Candidate, ...] | list[Candidate], k: int) -> tuple[Candidate, ...]:
    """De-duplicate by token, sort by logprob descending, cut to k.

    A token is identified by its id when known, else by its bytes; duplicates keep their best
    logprob. The sort is stable, so equal logprobs keep upstream order. The sampled token is never
    injected: upstreams that force it in (vLLM) are asked for k+1 so the true top k survive the cut.
    """
    if k <= 0 or not candidates:
        return ()
    count = len(candidates)
    ids = set(map(_token_id, candidates))
    if None not in ids:
        unique = len(ids) == count
    elif len(ids) == 1:  # no ids at all: a candidate is its bytes
        unique = len(set(map(_bytes_of, candidates))) == count
    else:
        unique = False
    if unique:
        # No duplicates (the usual case): a stable sort on the logprob alone. `reverse=True` keeps
        # equal elements in their original order, like sorting on the negated key.
        ordered = sorted(candidates, key=_by_logprob, reverse=True)
        return tuple(ordered[:k]) if count > k else tuple(ordered)
    best: dict[object, Candidate] = {}
    for cand in candidates:
        key = ("id", cand.token_id) if cand.token_id is not None else ("bytes", cand.bytes)
        kept = best.get(key)
        if kept is None or cand.logprob > kept.logprob:
            best[key] = cand
    ordered = sorted(best.values(), key=lambda c: -c.logprob)
    return tuple(ordered[:k])


def settle_alternatives(top: tuple[Candidate, ...], guess: bytes, logprob: float | None, data: bytes,
                        token_id: int | None, origin: Origin) -> tuple[Candidate, ...]:
    """Alternatives once the sampled token's bytes are settled (`data`; `guess`: what its upstream
    string read as). The alternative that is the sampled token (same id; or, without ids, the same
    string and logprob) takes the sampled token's bytes: its string may hold the fragments before it
    (`" 根"` for b"\xb9") or none of its bytes (`"�"`). Any other alternative whose string cannot give
    its bytes (`"�"`, `""`: origin AMBIGUOUS) is left out: its bytes are unknown, never made up."""
    if not top or (data == guess and not any(c.origin is Origin.AMBIGUOUS for c in top)):
        return top
    out: list[Candidate] = []
    found = False
    for cand in top:
        if not found and (cand.token_id == token_id if cand.token_id is not None and token_id is not None
                          else cand.token_id is None and cand.bytes == guess and cand.logprob == logprob):
            out.append(Candidate(data, cand.logprob, token_id if cand.token_id is None else cand.token_id, origin))
            found = True
        elif cand.origin is not Origin.AMBIGUOUS:
            out.append(cand)
    return tuple(out)
