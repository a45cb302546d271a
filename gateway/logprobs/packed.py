"""Tokens kept compactly until they are rendered: what a long stream holds for its final message.

A streamed message sends each token's logprob entry in its delta and must repeat every entry at the
end (`output_text.done`, the part, the item, the final Response). Keeping the rendered JSON costs
~600 bytes per token at k=5 (~150 MB for 256 streams of 1,000 tokens); keeping the Tokens costs
more. `PackedTokens` keeps only what rendering reads, verbatim, in flat arrays — each token's bytes
and logprob, each alternative's bytes, logprob and id: ~20 bytes per entry — and gives back Tokens
that render to the same entries byte for byte (`tokens()`), so the list is rendered once, at the end.

Rendering reads a token's `bytes`, `logprob` and `top`, and of each alternative its `bytes`,
`logprob` and `token_id` (de-duplication); the rest (origin, `special`, the token's own id) is not
kept. A token of another shape (a logprob that is not a float, an id beyond 32 bits) is kept whole.

Given the vocabulary's id table, and with the compiled twin built, tokens whose bytes are the table's
(what the id readers make of vLLM's `token_id:N`) are kept as ids alone, in a `TokenBatch`, appended
in C and rendered from it in C (`render_json`): no Token is built again at the end. The first token
that is not of that shape moves them all to the arrays above, which then keep the rest.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from itertools import accumulate, chain
from operator import itemgetter

import orjson

from gateway.logprobs.compiled import TokenBatch, fastpath
from gateway.logprobs.render import render_responses_json
from gateway.logprobs.tokens import Candidate, Origin, Token

_ID_MAX = 2**32 - 2  # ids are kept + 1 in 32 bits
_NONE_LOGPROB = math.nan  # a token with no logprob (the first echoed prompt token): renders the same


class PackedTokens:
    """A growing list of tokens, as compact as their rendering allows (see the module docstring).

    Tokens are packed 32 at a time, with whole-batch operations (a loop in Python per alternative
    would cost more than rendering them); a batch holding a token of another shape goes one by one.
    """

    __slots__ = ("_alt_data", "_alt_ends", "_alt_ids", "_alt_values", "_counts", "_data", "_ends", "_ids",
                 "_recent", "_table", "_values", "_whole")

    def __init__(self, table: tuple[bytes | None, ...] | None = None) -> None:
        # The vocabulary's id -> bytes table (parse.id_table): tokens of it are kept as ids (`_ids`) while
        # every token so far is; `_table` None once they are not (or with no table or no compiled twin).
        self._table = table if _token_batch is not None else None
        self._ids = None
        self._data = bytearray()  # the tokens' bytes, one after another
        self._ends = array("I")  # where each token's bytes end in `_data`
        self._values = array("d")  # each token's logprob, as given (NaN: None)
        self._alt_data = bytearray()  # the same for every alternative, in order
        self._alt_ends = array("I")
        self._alt_values = array("d")
        self._alt_ids = array("I")  # each alternative's token id + 1 (0: none)
        self._counts = bytearray()  # alternatives per token (255: a token kept whole, in `_whole`)
        self._whole: dict[int, Token] = {}  # position -> a token of another shape, as given
        self._recent: list[Token] = []  # not packed yet

    def __len__(self) -> int:
        return len(self._counts) + len(self._recent) + (0 if self._ids is None else len(self._ids))

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (tokens kept whole or not packed yet not counted)."""
        arrays = (self._ends, self._values, self._alt_ends, self._alt_values, self._alt_ids)
        return (len(self._data) + len(self._alt_data) + len(self._counts)
                + sum(a.itemsize * len(a) for a in arrays) + (0 if self._ids is None else self._ids.nbytes))

    def extend(self, tokens: Iterable[Token]) -> None:
        if self._table is not None:
            if self._ids is None:
                self._ids = _token_batch(self._table)
            if type(tokens) is list and self._ids.append(tokens):
                return
            if type(tokens) is TokenBatch and self._ids.extend(tokens):
                return
            # Not all of the table's: every token from here on goes to the arrays, the ids' first.
            self._table = None
            tokens = [*self._ids.tokens(), *tokens]
            self._ids = None
        recent = self._recent
        recent.extend(tokens)
        if len(recent) >= _BATCH:
            self._pack()

    def _pack(self) -> None:
        batch, self._recent = self._recent, []
        if not batch:
            return
        sizes = (len(self._data), len(self._ends), len(self._values), len(self._alt_data), len(self._alt_ends),
                 len(self._alt_values), len(self._alt_ids), len(self._counts))
        try:
            self._pack_batch(batch)
        except (TypeError, ValueError, OverflowError):  # some token is of another shape
            self._truncate(sizes)
            for token in batch:
                self._pack_one(token)

    def _pack_batch(self, batch: list[Token]) -> None:
        # The arrays and b"".join refuse what they cannot hold (None, str, a negative id): TypeError,
        # OverflowError. An int logprob is kept as its float, which renders the same.
        tops = list(map(_top, batch))
        candidates = list(chain.from_iterable(tops))
        values = [_NONE_LOGPROB if v is None else v for v in map(_logprob, batch)]
        ids = [0 if i is None else i + 1 for i in map(_token_id, candidates)]
        counts = list(map(len, tops))
        if counts and max(counts) >= 255:
            raise ValueError("too many alternatives")
        self._alt_ids.extend(ids)  # may raise OverflowError: before anything else grows
        _append_pieces(self._data, self._ends, map(_bytes, batch))
        self._values.extend(values)
        _append_pieces(self._alt_data, self._alt_ends, map(_bytes, candidates))
        self._alt_values.extend(map(_logprob, candidates))
        self._counts.extend(counts)

    def _truncate(self, sizes: tuple[int, ...]) -> None:
        parts = (self._data, self._ends, self._values, self._alt_data, self._alt_ends, self._alt_values,
                 self._alt_ids, self._counts)
        for part, size in zip(parts, sizes, strict=True):
            del part[size:]

    def _pack_one(self, token: Token) -> None:
        raw, logprob, top = token[:3]
        if logprob is None:
            logprob = _NONE_LOGPROB
        if type(raw) is not bytes or type(logprob) is not float or len(top) >= 255 or not _plain(top):
            self._whole[len(self._counts)] = token
            self._counts.append(255)
            return
        self._data += raw
        self._ends.append(len(self._data))
        self._values.append(logprob)
        for cand_bytes, cand_logprob, cand_id, _ in top:
            self._alt_data += cand_bytes
            self._alt_ends.append(len(self._alt_data))
            self._alt_values.append(cand_logprob)
            self._alt_ids.append(0 if cand_id is None else cand_id + 1)
        self._counts.append(len(top))

    @property
    def batch(self) -> TokenBatch | None:
        """The TokenBatch that holds every token so far (they are all the table's ids), else None."""
        return self._ids

    def render_json(self, k: int) -> bytes:
        """`render_responses_json(tokens, k)` of the tokens given, byte for byte."""
        if self._ids is not None:
            return self._ids.render_json(k, orjson.dumps)
        return render_responses_json(self.tokens(), k)

    def tokens(self) -> list[Token]:
        """The tokens, each as it renders (`render_responses` gives the entries the originals gave)."""
        if self._ids is not None:
            return self._ids.tokens()
        self._pack()
        new = tuple.__new__
        ids = [i - 1 if i else None for i in self._alt_ids]
        candidates = [new(Candidate, (raw, value, token_id, _EXACT)) for raw, value, token_id in
                      zip(_pieces(self._alt_data, self._alt_ends), self._alt_values.tolist(), ids, strict=True)]
        tops: list[tuple[Candidate, ...]] = []
        start = 0
        for count in self._counts:
            if count != 255:
                tops.append(tuple(candidates[start:start + count]))
                start += count
        sampled = [new(Token, (raw, None if value != value else value, top, None, False, _EXACT, False))
                   for raw, value, top in zip(_pieces(self._data, self._ends), self._values.tolist(), tops,
                                              strict=True)]
        if not self._whole:
            return sampled
        rest = iter(sampled)
        return [self._whole[position] if count == 255 else next(rest) for position, count in enumerate(self._counts)]


_BATCH = 32
# (getattr: an extension built before token_batch existed, e.g. a tree rebased but not rebuilt, packs in Python)
_token_batch = getattr(fastpath, "token_batch", None)
_EXACT = Origin.EXACT
_bytes = itemgetter(0)
_logprob = itemgetter(1)
_top = itemgetter(2)
_token_id = itemgetter(2)  # of a Candidate


def _append_pieces(data: bytearray, ends: array, pieces: Iterable[bytes]) -> None:
    chunks = list(pieces)
    ends.extend(accumulate(map(len, chunks), initial=len(data)))
    del ends[len(ends) - len(chunks) - 1]  # the initial value
    data += b"".join(chunks)


def _pieces(data: bytearray, ends: array) -> list[bytes]:
    whole = bytes(data)
    bounds = ends.tolist()
    return list(map(whole.__getitem__, map(slice, [0, *bounds[:-1]], bounds)))


def _plain(top: tuple[Candidate, ...]) -> bool:
    """Every alternative is bytes, a float logprob and no id or a 32-bit one (what the arrays hold)."""
    for cand_bytes, cand_logprob, cand_id, _ in top:
        if type(cand_bytes) is not bytes or type(cand_logprob) is not float:
            return False
        if cand_id is not None and not (type(cand_id) is int and 0 <= cand_id <= _ID_MAX):
            return False
    return True
