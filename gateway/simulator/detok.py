"""Token strings as vLLM shows them: per-id (lossy) and incremental (held back until complete).

vLLM decodes each logprob token on its own, so a token holding part of a UTF-8 character becomes
"�", and special tokens become "" (skip_special_tokens=True). The response *text* instead comes
from an incremental detokenizer that holds back bytes until a character completes.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from gateway.logprobs.vocab import Vocab


class TokenStrings:
    """Per-id decoded strings, the way vLLM's per-token decode spells them (cached)."""

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self._vocab.is_special(token_id):
                text = ""  # skip_special_tokens=True
            else:
                text = self._vocab.token_bytes(token_id).decode("utf-8", errors="replace")
            self._cache[token_id] = text
        return text


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas, holding back incomplete characters.

    Bytes that never complete (generation cut mid-character) are never emitted, as in vLLM, so
    the final text can be shorter than the tokens' bytes.
    """

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_ids: Iterable[int]) -> str:
        """The text that the given (next) tokens complete."""
        out: list[str] = []
        for token_id in token_ids:
            if self._vocab.is_special(token_id):
                continue
            out.append(self._decoder.decode(self._vocab.token_bytes(token_id)))
        return "".join(out)
