"""Tokenizer backends: token id -> exact bytes.

INTERFACE ONLY (being implemented). See the Vocab protocol.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Vocab(Protocol):
    """A model's vocabulary as exact bytes. Tables are built once; lookups are O(1)."""

    name: str

    def __len__(self) -> int: ...

    def token_bytes(self, token_id: int) -> bytes:
        """Exact bytes of one token (KeyError for an unknown id)."""
        ...

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (EOS, <|im_end|>, ...) that a server hides from the text."""
        ...

    def id_for_bytes(self, data: bytes) -> int | None:
        """The non-special token whose bytes are exactly `data`, if any."""
        ...

    def id_for_piece(self, piece: str) -> int | None:
        """The token spelled `piece` in the raw vocabulary ('Ġhello', '<0xE6>', '▁the')."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with no special tokens added."""
        ...
