"""Re-align a run of already-parsed tokens against the text they arrived with (streaming).

A stream without token ids (TGI chat, SGLang chat, vLLM without a tokenizer) cannot align a chunk
against the final text, which does not exist yet; but each text delta bounds the tokens that came
with it. Lossy tokens keep their upstream string as their best-guess bytes, so it can be read back.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.logprobs.align import AlignmentError, Piece, align
from gateway.logprobs.tokens import Origin, Token, settle_alternatives
from gateway.logprobs.vocab import Vocab


def _piece(token: Token) -> Piece:
    if token.origin in (Origin.AMBIGUOUS, Origin.TEXT):
        return Piece(token.bytes.decode("utf-8", errors="replace"))
    return Piece(exact=token.bytes)


def realign(tokens: Sequence[Token], text: str, vocab: Vocab | None = None) -> tuple[list[Token], int]:
    """Tokens with bytes re-cut to tile `text`; returns them and how many stay ambiguous.

    If no tiling fits, the tokens are returned unchanged and all lossy ones count as ambiguous.
    """
    lossy = [t for t in tokens if t.origin is Origin.AMBIGUOUS]
    if not lossy:
        return list(tokens), 0
    pieces = [_piece(t) for t in tokens]
    try:
        alignment = align(pieces, text.encode(), vocab)
    except AlignmentError:
        # The server dropped some tokens' entries (SGLang streams a chunk only when text grows):
        # the lossy tokens left stand for the whole merged run, like llama.cpp's completing token.
        merged = [Piece(p.string, p.exact, any_span=True) if t.origin is Origin.AMBIGUOUS else p
                  for t, p in zip(tokens, pieces, strict=True)]
        try:
            alignment = align(merged, text.encode())
        except AlignmentError:
            return [_settled(t, t.bytes) for t in tokens], len(lossy)
        alignment = type(alignment)(alignment.spans, frozenset(
            i for i, t in enumerate(tokens) if t.origin is Origin.AMBIGUOUS) | alignment.ambiguous)
    out = []
    for index, (token, span) in enumerate(zip(tokens, alignment.spans, strict=True)):
        if index in alignment.ambiguous:
            origin = Origin.AMBIGUOUS
        elif token.origin in (Origin.AMBIGUOUS, Origin.TEXT) and span != token.bytes:
            origin = Origin.ALIGNED
        else:
            origin = Origin.ALIGNED if token.origin is Origin.AMBIGUOUS else token.origin
        top = settle_alternatives(token.top, token.bytes, token.logprob, span, token.token_id, origin)
        out.append(type(token)(span, token.logprob, top, token.token_id, token.special, origin, token.top_absent))
    return out, len(alignment.ambiguous)


def _settled(token: Token, guess: bytes) -> Token:
    """The token's alternatives settled against its own (unaligned) bytes."""
    top = settle_alternatives(token.top, guess, token.logprob, token.bytes, token.token_id, token.origin)
    return token if top is token.top else token._replace(top=top)
