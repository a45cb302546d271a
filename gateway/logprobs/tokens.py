"""The canonical token: exact bytes, a logprob, ranked alternatives.

Wire formats differ in how they *spell* a token (text, escapes, placeholders); the canonical
form holds only what is true of it, so every conversion goes through here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

# OpenAI's documented "very unlikely" value; every other sentinel is mapped to it so that no
# output ever carries NaN, Infinity or float32-lowest.
SENTINEL_LOGPROB = -9999.0


class Origin(Enum):
    """Where a token's bytes came from: how much to trust them."""

    EXACT = "exact"  # the upstream sent exact bytes (llama.cpp, OpenAI, or our own rendering)
    TOKEN_ID = "token_id"  # looked up by token id in the model's tokenizer
    TEXT = "text"  # the upstream string was already lossless UTF-8 text
    ALIGNED = "aligned"  # a lossy string, repaired by aligning against the final text
    AMBIGUOUS = "ambiguous"  # could not be pinned down; bytes are a best guess


@dataclass(frozen=True, slots=True)
class Candidate:
    """One ranked alternative at a position."""

    bytes: bytes
    logprob: float
    token_id: int | None = None
    origin: Origin = Origin.EXACT


@dataclass(frozen=True, slots=True)
class Token:
    """One generated (or prompt) token.

    `logprob` is None only for a position with no context (the first echoed prompt token).
    `top` holds the alternatives as given; call `normalized_top(k)` for the client's view.
    """

    bytes: bytes
    logprob: float | None
    top: tuple[Candidate, ...] = ()
    token_id: int | None = None
    special: bool = False
    origin: Origin = Origin.EXACT
    top_absent: bool = field(default=False, compare=False)  # upstream sent no list (completions echo)

    def normalized_top(self, k: int) -> tuple[Candidate, ...]:
        return normalize_candidates(self.top, k)


def normalize_logprob(value: float | None) -> float:
    """Map every 'no probability' spelling (null, -inf, NaN, float32 lowest, anything below the
    sentinel) to SENTINEL_LOGPROB; keep real values unchanged."""
    if value is None or math.isnan(value) or value <= SENTINEL_LOGPROB:
        return SENTINEL_LOGPROB
    if math.isinf(value):  # +inf is not a logprob either
        return SENTINEL_LOGPROB
    return float(value)


def normalize_candidates(candidates: tuple[Candidate, ...] | list[Candidate], k: int) -> tuple[Candidate, ...]:
    """De-duplicate by token, sort by logprob descending, cut to k.

    A token is identified by its id when known, else by its bytes; duplicates keep their best
    logprob. The sort is stable, so equal logprobs keep upstream order. The sampled token is never
    injected: upstreams that force it in (vLLM) are asked for k+1 so the true top k survive the cut.
    """
    if k <= 0 or not candidates:
        return ()
    best: dict[object, Candidate] = {}
    for cand in candidates:
        key = ("id", cand.token_id) if cand.token_id is not None else ("bytes", cand.bytes)
        kept = best.get(key)
        if kept is None or cand.logprob > kept.logprob:
            best[key] = cand
    ordered = sorted(best.values(), key=lambda c: -c.logprob)
    return tuple(ordered[:k])
