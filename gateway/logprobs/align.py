"""Repair lossy token strings by aligning them against the final text.

When an upstream gives no token ids, some token strings cannot stand for their bytes: `"�"`
(bytes replaced by `errors="replace"`), `""` (a fragment whose character completes later, TGI and
newer vLLM), or a completing token whose string also holds the fragments before it. The final
text bounds them: the tokens' bytes must tile its UTF-8 exactly. We search every tiling that fits
each token's string (a small dynamic programme over byte positions), keep the tokens whose span
is the same in all of them, and report the rest as ambiguous instead of guessing silently.
A tokenizer, when configured, rules out spans that are not a token of the model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gateway.logprobs.spellings import REPLACEMENT_CHAR
from gateway.logprobs.vocab import Vocab

# A fragment token ("" on the wire) holds part of one character plus perhaps a leading space or
# byte-level merge; real tokenizers never put more than this many bytes in such a token.
MAX_FRAGMENT_BYTES = 16
# A merged token (fragments dropped by the server) holds at most a few characters.
MAX_MERGED_BYTES = 64


class AlignmentError(ValueError):
    """The tokens cannot tile the text: the upstream's logprobs do not describe its own output."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


@dataclass(frozen=True, slots=True)
class Piece:
    """What is known of one token's bytes before alignment.

    `exact` is set when the bytes are certain (from an id, or bytes that are not even valid UTF-8);
    otherwise `string` is the upstream's decoded token string. `may_be_empty` lets a token carry
    no text at all (a control token such as an end-of-sequence marker).
    """

    string: str = ""
    exact: bytes | None = None
    may_be_empty: bool = False
    # First token of a SentencePiece text: its decoder drops the "▁" the normalizer prepended,
    # so the text may lack the token's leading space.
    may_drop_leading_space: bool = False
    # A token that may stand for a whole merged run (its fragments were dropped upstream): any span.
    any_span: bool = False


@dataclass(frozen=True, slots=True)
class Alignment:
    """The bytes of each token, and which tokens' spans were not pinned down by the text.

    `per_character`: how many fragments (`""`) were spelled per character: with no tokenizer to say
    how a character's bytes split across its tokens, the fragments carry only whole characters
    (mostly none: b"") and the completing token the whole character, as vLLM spells them itself."""

    spans: list[bytes]
    ambiguous: frozenset[int]
    per_character: int = 0


def _is_boundary(text: bytes, pos: int) -> bool:
    """True where a character starts (or at the end): no UTF-8 continuation byte at `pos`."""
    return pos >= len(text) or (text[pos] & 0xC0) != 0x80


def _ends(piece: Piece, prev_is_fragment: bool, text: bytes, pos: int) -> Iterator[int]:
    """Every end position this piece could reach if it starts at `pos`."""
    if piece.may_be_empty:
        yield pos
    if piece.any_span:
        yield from range(pos + 1, min(pos + MAX_MERGED_BYTES, len(text)) + 1)
        return
    face_value = piece.exact if piece.exact is not None else piece.string.encode()
    if (piece.may_drop_leading_space and pos == 0 and face_value.startswith(b" ")
            and text.startswith(face_value[1:], pos)):
        yield len(face_value) - 1
    if piece.exact is not None:
        if text.startswith(piece.exact, pos):
            yield pos + len(piece.exact)
        return
    string = piece.string
    if string == "":
        # A fragment leaves a character incomplete, so it must end inside one.
        for end in range(pos + 1, min(pos + MAX_FRAGMENT_BYTES, len(text)) + 1):
            if not _is_boundary(text, end):
                yield end
        return
    if REPLACEMENT_CHAR in string:
        literal = len(string.replace(REPLACEMENT_CHAR, "").encode())
        count = string.count(REPLACEMENT_CHAR)
        for end in range(pos + literal + count, min(pos + literal + 3 * count, len(text)) + 1):
            if text[pos:end].decode("utf-8", errors="replace") == string:
                yield end
        return
    encoded = string.encode()
    if text.startswith(encoded, pos):
        yield pos + len(encoded)
    if prev_is_fragment and not _is_boundary(text, pos):
        # The completing token's string also spells the fragments before it: it owns a suffix.
        for cut in range(1, len(encoded)):
            if text.startswith(encoded[cut:], pos):
                yield pos + len(encoded) - cut


def align(pieces: Sequence[Piece], text: bytes, vocab: Vocab | None = None) -> Alignment:
    """Assign each piece its exact span of `text`; raise AlignmentError if no tiling exists.

    Without a tokenizer, where the text leaves open how a character's bytes split across `""`
    fragments and the token that completes it, the one honest spelling (`_per_character`) is used,
    never a guess; other spans the text does not pin down are reported as ambiguous."""
    fast = _fast_path(pieces, text)
    if fast is not None:
        return Alignment(fast, frozenset())
    found = _search(pieces, text, vocab)
    return _per_character(pieces, found) if vocab is None and found.ambiguous else found


def _per_character(pieces: Sequence[Piece], found: Alignment) -> Alignment:
    """Each ambiguous run of `""` fragments and the token that completes them, spelled as vLLM itself
    spells them: the fragments b"", the completing token the run's bytes (whole characters, with any
    text the fragments held). The run's span is pinned by its unambiguous neighbours; only the split
    inside it was a guess. Runs of any other shape stay ambiguous."""
    spans = list(found.spans)
    ambiguous = set(found.ambiguous)
    spelled = 0
    # A run ends at its completing token: adjacent runs (a split character right after another, as real
    # vLLM writes "", "雖", "", " 오팀") are spelled one by one; the completing token's end is pinned by
    # its string, so each run's span is.
    runs: list[list[int]] = []
    for index in sorted(found.ambiguous):
        if not runs or index != runs[-1][-1] + 1 or pieces[runs[-1][-1]].exact is not None \
                or pieces[runs[-1][-1]].string != "":
            runs.append([])
        runs[-1].append(index)
    for members in runs:
        start, end = members[0], members[-1]
        run = pieces[start:end + 1]
        if end == start or any(p.exact is not None or p.string != "" for p in run[:-1]) or run[-1].string == "":
            continue
        spans[end] = b"".join(spans[start:end + 1])
        spans[start:end] = [b""] * (end - start)
        ambiguous -= set(range(start, end + 1))
        spelled += end - start
    return Alignment(spans, frozenset(ambiguous), spelled) if spelled else found


def _search(pieces: Sequence[Piece], text: bytes, vocab: Vocab | None) -> Alignment:

    count = len(pieces)
    # edges[i]: start position -> end positions for token i, kept only where the end is reachable.
    forward: list[set[int]] = [{0}]
    edges: list[dict[int, list[int]]] = []
    for index, piece in enumerate(pieces):
        prev_fragment = index > 0 and pieces[index - 1].exact is None and pieces[index - 1].string == ""
        step: dict[int, list[int]] = {}
        reached: set[int] = set()
        for start in forward[index]:
            ends = [
                end
                for end in _ends(piece, prev_fragment, text, start)
                if _vocab_allows(piece, text[start:end], vocab)
            ]
            if ends:
                step[start] = ends
                reached.update(ends)
        if not reached:
            raise AlignmentError(_describe_failure(pieces, index, text, forward[index]), index)
        edges.append(step)
        forward.append(reached)
    if len(text) not in forward[count]:
        raise AlignmentError(
            f"the {count} tokens cover at most {max(forward[count])} of the text's {len(text)} bytes",
            count - 1 if count else 0,
        )

    # Walk back from the end, keeping only positions that lead to a complete tiling.
    valid: list[set[int]] = [set() for _ in range(count + 1)]
    valid[count] = {len(text)}
    for index in range(count - 1, -1, -1):
        valid[index] = {
            start for start, ends in edges[index].items() if any(end in valid[index + 1] for end in ends)
        }

    spans: list[bytes] = []
    ambiguous: set[int] = set()
    pos = 0
    for index in range(count):
        choices = [end for end in edges[index][pos] if end in valid[index + 1]]
        live_edges = sum(
            1 for start in valid[index] for end in edges[index].get(start, ()) if end in valid[index + 1]
        )
        if live_edges > 1:
            ambiguous.add(index)
        # Prefer the shortest span for a fragment (it holds the least it can) and the upstream's own
        # reading otherwise: the first end yielded is the string taken at face value.
        end = min(choices) if pieces[index].string == "" and pieces[index].exact is None else choices[0]
        spans.append(text[pos:end])
        pos = end
    return Alignment(spans, frozenset(ambiguous))


def _fast_path(pieces: Sequence[Piece], text: bytes) -> list[bytes] | None:
    """Most tokens are exact or plain text: if taking each at face value tiles the text, done."""
    spans: list[bytes] = []
    for piece in pieces:
        if piece.exact is not None:
            spans.append(piece.exact)
        elif piece.string == "" or REPLACEMENT_CHAR in piece.string:
            return None
        else:
            spans.append(piece.string.encode())
    if b"".join(spans) == text:
        return spans
    if spans and pieces[0].may_drop_leading_space and spans[0].startswith(b" "):
        spans[0] = spans[0][1:]
        if b"".join(spans) == text:
            return spans
    return None


def _vocab_allows(piece: Piece, span: bytes, vocab: Vocab | None) -> bool:
    if vocab is None or piece.exact is not None or not span:
        return True
    return vocab.id_for_bytes(span) is not None


def _describe_failure(pieces: Sequence[Piece], index: int, text: bytes, starts: set[int]) -> str:
    piece = pieces[index]
    spelled = repr(piece.exact) if piece.exact is not None else repr(piece.string)
    at = min(starts)
    return f"token {index} ({spelled}) does not fit the text at byte {at}: {text[at : at + 12]!r}"
