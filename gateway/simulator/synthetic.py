"""Synthetic, deterministic per-position logprob distributions (no model involved).

Each position gets a ranked list of distinct candidate ids with strictly descending logprobs.
The layout is chosen to exercise every client-side quirk of vLLM's logprob output:

- the sampled token ranks 1st at most positions, 3rd-8th at every 3rd position, and 21st or
  lower (outside any allowed top-k, since --max-logprobs defaults to 20) at every 7th;
- lone bytes >= 0x80 (each decodes to "\ufffd" on its own) sit high in the list at even
  positions, two of them, so that two different ids collide on one string;
- special tokens (each decodes to "") sit high in the list at every 5th position.

Values depend only on (seed, key, index, sampled id), so a repeated request repeats exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.logprobs.vocab import Vocab
from gateway.simulator.floats import f32

NUM_CANDIDATES = 25  # alternatives per position besides the sampled token
OUTSIDE_TOP = 20  # vLLM's default --max-logprobs: ranks beyond it are never in a top-k list


@dataclass(frozen=True, slots=True)
class Position:
    """One position of a synthetic distribution.

    `ranked` holds (token id, logprob) by descending logprob and contains the sampled token at
    `sampled_rank` (1-based).
    """

    sampled: int
    sampled_logprob: float
    sampled_rank: int
    ranked: tuple[tuple[int, float], ...]

    def vllm_dict(self, k: int) -> dict[int, float]:
        """What vLLM's engine stores for this position when asked for k logprobs (-1 = all).

        The sampled token comes first, then the true top-k; a sampled token that is also in
        the top-k is not repeated, so the dict has k or k+1 entries. Values are what vLLM sends: the
        exact double of a float32 (`.tolist()` of its float32 tensor), full length, as in the real capture
        tests/captures/real/vllm-0.32.0-qwen2-tiny.json (not the 6-decimal values drawn here).
        """
        entries: dict[int, float] = {self.sampled: f32(self.sampled_logprob)}
        top = self.ranked if k < 0 else self.ranked[:k]
        for token_id, logprob in top:
            entries.setdefault(token_id, f32(logprob))
        return entries

    def top(self, n: int) -> tuple[tuple[int, float], ...]:
        """The n most likely (id, logprob) pairs, best first; the sampled token only if it ranks."""
        return self.ranked[: max(0, n)]

    def rank_of(self, token_id: int) -> int:
        for rank, (candidate, _) in enumerate(self.ranked, start=1):
            if candidate == token_id:
                return rank
        return len(self.ranked) + 1


class SyntheticLogprobs:
    """Builds `Position`s for a vocabulary; see the module docstring for the layout."""

    def __init__(self, vocab: Vocab, *, seed: int, special_ids: Sequence[int]) -> None:
        self._vocab = vocab
        self._seed = seed
        self._size = len(vocab)
        self._specials = tuple(dict.fromkeys(special_ids))
        # Lone high bytes: every one of them decodes to "\ufffd" by itself.
        lone = (vocab.id_for_bytes(bytes([b])) for b in range(0x80, 0x100))
        self._lone_bytes = tuple(i for i in lone if i is not None)

    def position(self, key: str, index: int, sampled: int, context: Sequence[int] = ()) -> Position:
        """The distribution at `index` of the sequence identified by `key` (e.g. a prompt hash).

        `context` lists nearby token ids of the same text; they make plausible alternatives.
        """
        rng = random.Random(f"{self._seed}|{key}|{index}|{sampled}")
        others = self._alternatives(rng, index, sampled, context)
        if index % 7 == 6:
            rank = rng.randint(OUTSIDE_TOP + 1, NUM_CANDIDATES + 1)
        elif index % 3 == 2:
            rank = rng.randint(3, 8)
        else:
            rank = 1
        rank = min(rank, len(others) + 1)  # tiny vocabularies
        order = [*others[: rank - 1], sampled, *others[rank - 1 :]]
        logprobs = _descending_logprobs(rng, len(order))
        ranked = tuple(zip(order, logprobs, strict=True))
        return Position(sampled, logprobs[rank - 1], rank, ranked)

    def output(self, key: str, ids: Sequence[int], start: int = 0, end: int | None = None) -> list[Position]:
        """Positions `start..end` of a generated sequence; neighbouring ids serve as alternatives."""
        stop = len(ids) if end is None else end
        return [
            self.position(key, i, ids[i], (*ids[i + 1 : i + 3], *ids[max(0, i - 1) : i])) for i in range(start, stop)
        ]

    def prompt(self, key: str, ids: Sequence[int]) -> list[Position | None]:
        """Positions of a prompt; the first token has no context, hence no distribution (None)."""
        return [None, *(self.position(key, j, ids[j], ids[j + 1 : j + 3]) for j in range(1, len(ids)))]

    def _alternatives(self, rng: random.Random, index: int, sampled: int, context: Sequence[int]) -> list[int]:
        slots: list[int | None] = [None] * NUM_CANDIDATES
        taken = {sampled}

        def place(slot: int, token_id: int) -> None:
            if token_id not in taken and slots[slot] is None:
                slots[slot] = token_id
                taken.add(token_id)

        if index % 2 == 0 and len(self._lone_bytes) >= 2:
            first, second = rng.sample(self._lone_bytes, 2)
            place(0, first)
            place(2, second)
        if index % 5 == 0 and self._specials:
            place(1, self._specials[0])
            if len(self._specials) > 1:
                place(3, self._specials[1])
        for slot, token_id in zip((4, 6, 9), context, strict=False):
            if not self._vocab.is_special(token_id):
                place(slot, token_id)

        free = [i for i, v in enumerate(slots) if v is None]
        for slot, token_id in zip(free, self._random_ids(rng, taken, len(free)), strict=True):
            slots[slot] = token_id
        return [s for s in slots if s is not None]

    def _random_ids(self, rng: random.Random, taken: set[int], count: int) -> list[int]:
        found: list[int] = []
        tries = 0
        while len(found) < count and tries < count * 50:
            tries += 1
            token_id = rng.randrange(self._size)
            if token_id in taken or not self._usable(token_id):
                continue
            taken.add(token_id)
            found.append(token_id)
        if len(found) < count:  # tiny vocabularies: walk the ids in order instead
            for token_id in range(self._size):
                if len(found) == count:
                    break
                if token_id not in taken and self._usable(token_id):
                    taken.add(token_id)
                    found.append(token_id)
        return found

    def _usable(self, token_id: int) -> bool:
        try:
            self._vocab.token_bytes(token_id)  # gaps in some id spaces (tiktoken)
        except KeyError:
            return False
        return not self._vocab.is_special(token_id)


def _descending_logprobs(rng: random.Random, count: int) -> list[float]:
    """Strictly descending logprobs of a proper distribution, from about -0.02 to about -12."""
    top = -rng.uniform(0.02, 0.9)
    rest = 1.0 - math.exp(top)  # probability mass left for the other ranks
    ratio = rng.uniform(0.65, 0.75)
    values = [top]
    prob = rest * (1.0 - ratio)
    for _ in range(count - 1):
        values.append(math.log(prob))
        prob *= ratio * rng.uniform(0.97, 1.0)  # jitter, still strictly decreasing
    return [round(v, 6) for v in values]


Ranking = list[tuple[int, float | None]]  # (token id, logprob or None for -inf), best first


def nucleus(position: Position, *, top_k: int | None, top_p: float | None) -> tuple[Ranking, float]:
    """The ranking after top-k / top-p truncation, renormalized; truncated entries get None (-inf).

    Servers that compute logprobs after the sampling warpers (TGI always, SGLang when the request
    truncates) show such values: the kept ones renormalized, the others -inf. The kept set always
    reaches down to the sampled token, which was drawn from it. Returns (ranking, sampled logprob).
    """
    probs = [math.exp(lp) for _, lp in position.ranked]
    total = sum(probs)  # the synthetic list is the whole distribution the simulator knows
    cut, mass = 0, 0.0
    for prob in probs:
        if (top_k is not None and 0 < top_k <= cut) or (top_p is not None and cut and mass >= top_p * total):
            break
        cut += 1
        mass += prob
    cut = max(cut, position.sampled_rank)
    norm = math.log(sum(probs[:cut]))
    ranking = [(i, (lp - norm) if rank < cut else None) for rank, (i, lp) in enumerate(position.ranked)]
    return ranking, position.sampled_logprob - norm
