"""What the simulated model "generates": a scripted reply, cut or ended like vLLM would.

The output is the reply's token ids, then the EOS token (kept in token ids and logprobs, hidden
from the text) with finish_reason "stop" if everything fits in max_tokens; otherwise the first
max_tokens ids and "length". With ignore_eos the reply repeats until max_tokens.
Engine steps group the ids the way a streaming client sees them: the first step (prefill)
yields one token, later steps `tokens_per_step` each, or 1-3 when speculative decoding is mimicked.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DEFAULT_REPLY = "Hi there 👋 根据 the plan 🦀."

TokensPerStep = int | Literal["vary"]


@dataclass(frozen=True, slots=True)
class Output:
    """Generated token ids and why generation ended."""

    token_ids: tuple[int, ...]
    finish_reason: Literal["stop", "length"]


def plan_output(
    reply_ids: Sequence[int], max_tokens: int, eos_id: int | None, *, ignore_eos: bool, filler: Sequence[int]
) -> Output:
    """The ids a model would emit for this reply under the request's limits.

    `filler` is what to repeat when ignore_eos meets an empty reply.
    """
    if ignore_eos:
        source = list(reply_ids) or list(filler) or ([eos_id] if eos_id is not None else [])
        if not source:
            return Output((), "length")
        return Output(tuple(itertools.islice(itertools.cycle(source), max_tokens)), "length")
    complete = [*reply_ids, eos_id] if eos_id is not None else list(reply_ids)
    if len(complete) <= max_tokens:
        return Output(tuple(complete), "stop")
    return Output(tuple(reply_ids[:max_tokens]), "length")


def split_steps(count: int, tokens_per_step: TokensPerStep, rng_key: str) -> list[tuple[int, int]]:
    """(start, end) slices of the output per engine step."""
    if count <= 0:
        return []
    rng = random.Random(rng_key)
    steps = [(0, 1)]
    start = 1
    while start < count:
        size = rng.randint(1, 3) if tokens_per_step == "vary" else max(1, int(tokens_per_step))
        end = min(count, start + size)
        steps.append((start, end))
        start = end
    return steps
