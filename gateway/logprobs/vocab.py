"""Tokenizer backends: token id -> exact bytes.

Servers spell tokens lossily; the model's own vocabulary is the ground truth for what each id is.
Every backend builds its id -> bytes table and its bytes -> id index once, when it loads, so the hot
path is plain list indexing. Only those tables are kept: an HF vocabulary loaded from files drops
its `tokenizers.Tokenizer` (~31 MB for Qwen2) once they are built and reloads it from the same files
on the first `encode` or raw-piece lookup (`require_encoder` loads it ahead, for routes that encode
per request). Its piece -> id table, wanted only by routes that read raw pieces, is likewise built
on its first lookup. Loaders read local files first and touch the network only for names that
cannot be local (`tiktoken.get_encoding`, the HF Hub), failing with a `VocabError` that says so.
`tiktoken` itself is imported only when a tiktoken vocabulary is loaded.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import re
import threading
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

if TYPE_CHECKING:
    import tiktoken


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


class VocabError(Exception):
    """A tokenizer could not be loaded or configured; the message says what to fix."""


# ----------------------------------------------------------------------------- shared tables


_ID_TYPECODE = "I" if array("I").itemsize >= 4 else "L"  # unsigned, at least 32 bits


class _TableVocab:
    """Lookups over tables built once by a subclass.

    `_bytes[id]` is the token's bytes or None for an id with no token (a hole in the id space);
    `_order` (the non-special ids sorted by their bytes) finds the id an encoder would most likely
    have produced for some bytes.
    Subclasses answer `id_for_piece` (raw vocabulary spellings) their own way.
    """

    name: str

    def _set_tables(
        self,
        table: list[bytes | None],
        special_ids: Iterable[int],
        rank: Callable[[int], int] | None = None,
    ) -> None:
        self._bytes = table
        self._special = frozenset(special_ids)
        # bytes -> id as the ids sorted by their bytes, searched by bisection: for Qwen2's 151k tokens
        # ~0.6 MB resident instead of the ~10 MB a dict kept (its entries and an int object per id), at
        # ~1 us per lookup (only alignment's fallback and raw-piece lookups ask; the hot path never does).
        # Two ids can share bytes (SentencePiece '▁' and '<0x20>'; an added token repeating a piece).
        # `rank` says which one an encoder emits (lower wins); ties go to the lower id.
        ids = [token_id for token_id, data in enumerate(table) if data is not None and token_id not in self._special]
        ids.sort(key=table.__getitem__)  # stable: equal bytes keep their ids in ascending order
        order = array(_ID_TYPECODE)
        previous: bytes | None = None
        for token_id in ids:
            data = table[token_id]
            if data != previous:
                order.append(token_id)
                previous = data
            elif rank is not None and rank(token_id) < rank(order[-1]):
                order[-1] = token_id  # a shared spelling (rare): the one an encoder emits
        self._order = order

    def __len__(self) -> int:
        """Size of the id space (ids 0..len-1; some may be holes)."""
        return len(self._bytes)

    def token_bytes(self, token_id: int) -> bytes:
        # Guard negatives: list indexing would silently count from the end.
        data = self._bytes[token_id] if 0 <= token_id < len(self._bytes) else None
        if data is None:
            raise KeyError(token_id)
        return data

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def id_for_bytes(self, data: bytes) -> int | None:
        order, table = self._order, self._bytes
        at = bisect_left(order, data, key=table.__getitem__)
        return order[at] if at < len(order) and table[order[at]] == data else None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ids={len(self)}>"


# ----------------------------------------------------------------------------- HF tokenizers

BYTE_LEVEL = "byte_level"
SENTENCEPIECE = "sentencepiece"
PLAIN = "plain"

_SPM_SPACE = "\u2581"  # '▁', SentencePiece's spelling of a space
_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_glyphs() -> list[str]:
    """GPT-2's byte-level alphabet: the character that spells each byte 0..255.

    Printable, non-space bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') spell themselves; the other 68 bytes
    take code points 256, 257, ... in byte order, so every byte gets a visible glyph ('Ġ' = space).
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    glyphs: list[str] = []
    next_extra = 256
    for byte in range(256):
        if byte in printable:
            glyphs.append(chr(byte))
        else:
            glyphs.append(chr(next_extra))
            next_extra += 1
    return glyphs


def _glyph_decode_table() -> dict[int, str]:
    """str.translate table: glyph -> chr(byte), so `.encode('latin-1')` yields the bytes.

    Raw characters below 256 that are not glyphs map to a non-latin-1 sentinel, so the encode
    fails instead of passing them through as if they were bytes.
    """
    table = {ord(glyph): chr(byte) for byte, glyph in enumerate(_gpt2_byte_glyphs())}
    for code in range(256):
        table.setdefault(code, "\U0010ffff")
    return table


_GLYPH_TO_BYTE = _glyph_decode_table()


def _byte_level_bytes(piece: str) -> bytes:
    try:
        return piece.translate(_GLYPH_TO_BYTE).encode("latin-1")
    except UnicodeEncodeError:
        # Outside the alphabet: HF's ByteLevel decoder emits such a piece as its UTF-8 text.
        return piece.encode("utf-8")


def _component_types(node: Any) -> set[str]:
    """Every `type` named in a normalizer/pre-tokenizer/decoder subtree (Sequences nest)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("type"), str):
                found.add(item["type"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _pipeline_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """The parts of `tokenizer`'s tokenizer.json document that `_detect_scheme` reads.

    Each pipeline component is serialized on its own: `tokenizer.to_str()` would also spell out the
    whole vocabulary and merges (for Qwen2, ~65 MB of parsed JSON and a second of CPU), a transient
    that leaves the heap fragmented.
    """

    def component(value: Any) -> Any:
        return None if value is None else json.loads(value.__getstate__())

    model = tokenizer.model
    byte_fallback = getattr(model, "byte_fallback", None)  # BPE has the attribute
    if byte_fallback is None and isinstance(model, models.Unigram):  # Unigram only in its JSON
        byte_fallback = json.loads(model.__getstate__()).get("byte_fallback")
    return {
        "normalizer": component(tokenizer.normalizer),
        "pre_tokenizer": component(tokenizer.pre_tokenizer),
        "decoder": component(tokenizer.decoder),
        "model": {"byte_fallback": bool(byte_fallback)},
    }


def _detect_scheme(config: dict[str, Any]) -> tuple[str, bool]:
    """(scheme, byte_fallback) from a tokenizer.json document (or `_pipeline_config`'s part of it)."""
    pre = _component_types(config.get("pre_tokenizer"))
    dec = _component_types(config.get("decoder"))
    if "ByteLevel" in pre or "ByteLevel" in dec:
        return BYTE_LEVEL, False
    model = config.get("model") or {}
    byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in dec
    # SentencePiece shows as Metaspace, or as Replace(' ' <-> '▁') normalizers/decoders (Llama-2).
    mentions_spm_space = _SPM_SPACE in json.dumps(
        [config.get("normalizer"), config.get("pre_tokenizer"), config.get("decoder")], ensure_ascii=False
    )
    if byte_fallback or "Metaspace" in pre or "Metaspace" in dec or mentions_spm_space:
        return SENTENCEPIECE, byte_fallback
    return PLAIN, False


class HFVocab(_TableVocab):
    """A Hugging Face `tokenizers.Tokenizer` as exact bytes.

    `scheme` is how vocabulary pieces spell bytes: BYTE_LEVEL (GPT-2, Qwen, Llama-3), SENTENCEPIECE
    (Llama-2, Mistral, Phi-3: '▁' = space, '<0xNN>' = one byte with byte fallback) or PLAIN (the
    piece's UTF-8). Added tokens always hold raw text. `tokenizer` is the underlying Tokenizer.

    The tables need the Tokenizer only while they are built. Given `loader` (a zero-argument
    function that builds the same Tokenizer again, as the file loaders below pass), the vocabulary
    lets it go afterwards and `tokenizer` reloads it on first use: `encode` and the first
    `id_for_piece`, which most gateways never call. For Qwen2 that keeps ~31 MB out of the resident
    set for a reload of about a second. A route that encodes per request calls `require_encoder()`
    at start-up so no request pays the reload. Without `loader` the Tokenizer is kept.

    The piece -> id table is built on the first `id_for_piece` (only routes with `pieces: true` and
    the simulator ask): for Qwen2's 151k pieces it costs ~15 MB that most gateways never use.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        name: str = "hf",
        *,
        extra_special_ids: Iterable[int] = (),
        loader: Callable[[], Tokenizer] | None = None,
    ):
        self.name = name
        self._loader = loader
        self._lock = threading.Lock()
        self._tokenizer: Tokenizer | None = tokenizer
        self.scheme, self.byte_fallback = _detect_scheme(_pipeline_config(tokenizer))

        pieces = tokenizer.get_vocab(with_added_tokens=False)
        added = tokenizer.get_added_tokens_decoder()
        size = max(max(pieces.values(), default=-1), max(added, default=-1)) + 1
        table: list[bytes | None] = [None] * size
        to_bytes = self._piece_decoder()
        for piece, token_id in pieces.items():
            table[token_id] = to_bytes(piece)
        for token_id, token in added.items():  # raw text, not in the piece alphabet
            table[token_id] = token.content.encode("utf-8")
            pieces[token.content] = token_id  # as `_piece_ids` builds it
        special = {i for i, token in added.items() if token.special}
        special.update(i for i in extra_special_ids if 0 <= i < size and table[i] is not None)

        byte_pieces = (
            {i for piece, i in pieces.items() if _SPM_BYTE.fullmatch(piece)} if self.byte_fallback else set()
        )

        def rank(token_id: int) -> int:
            # An encoder matches added tokens before the model, and uses '<0xNN>' only as a last resort.
            if token_id in added:
                return 0
            return 2 if token_id in byte_pieces else 1

        self._set_tables(table, special, rank)
        self._pieces: dict[str, int] | None = None  # `pieces` is dropped; `id_for_piece` rebuilds it
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)  # to check a reload against
        if loader is not None:
            self._tokenizer = None  # reloaded by `tokenizer` on first use

    @property
    def tokenizer(self) -> Tokenizer:
        """The underlying Tokenizer, reloaded (once, under a lock) if it was let go after loading.

        A reload reads the files again: VocabError if they are gone, or no longer the vocabulary
        the tables were built from.
        """
        tokenizer = self._tokenizer
        if tokenizer is None:
            with self._lock:
                tokenizer = self._tokenizer
                if tokenizer is None:
                    assert self._loader is not None  # only a vocabulary with a loader lets it go
                    tokenizer = self._loader()
                    if tokenizer.get_vocab_size(with_added_tokens=True) != self._vocab_size:
                        raise VocabError(f"{self.name}: the tokenizer files changed since they were loaded")
                    self._tokenizer = tokenizer
        return tokenizer

    @property
    def tokenizer_loaded(self) -> bool:
        """Whether the Tokenizer is in memory now (False: the next `encode` reloads it)."""
        return self._tokenizer is not None

    def require_encoder(self) -> HFVocab:
        """Load the Tokenizer now, so `encode` never reloads it later (e.g. on an event loop)."""
        _ = self.tokenizer
        return self

    def _piece_ids(self) -> dict[str, int]:
        """Raw vocabulary spelling -> id: the model's pieces, then added tokens by their text."""
        pieces = self.tokenizer.get_vocab(with_added_tokens=False)
        for token_id, token in self.tokenizer.get_added_tokens_decoder().items():
            pieces[token.content] = token_id
        return pieces

    def id_for_piece(self, piece: str) -> int | None:
        pieces = self._pieces
        if pieces is None:  # first use; a racing second build would only repeat the same work
            pieces = self._pieces = self._piece_ids()
        return pieces.get(piece)

    def _piece_decoder(self) -> Callable[[str], bytes]:
        if self.scheme == BYTE_LEVEL:
            return _byte_level_bytes
        if self.scheme == SENTENCEPIECE:
            byte_fallback = self.byte_fallback

            def spm_bytes(piece: str) -> bytes:
                match = _SPM_BYTE.fullmatch(piece) if byte_fallback else None
                if match:
                    return bytes([int(match.group(1), 16)])
                return piece.replace(_SPM_SPACE, " ").encode("utf-8")

            return spm_bytes
        return lambda piece: piece.encode("utf-8")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; added/special tokens spelled in the text are recognised."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids


# ----------------------------------------------------------------------------- tiktoken


class TiktokenVocab(_TableVocab):
    """A `tiktoken.Encoding` as exact bytes. Its rank space has holes (ids with no token).

    Pieces: tiktoken has no glyph spelling, so `id_for_piece` takes a special token's name or the
    UTF-8 text of a token.
    """

    def __init__(self, encoding: tiktoken.Encoding, name: str | None = None):
        self.name = name or encoding.name
        self.encoding = encoding
        table: list[bytes | None] = []
        for token_id in range(encoding.n_vocab):
            try:
                table.append(encoding.decode_single_token_bytes(token_id))
            except KeyError:
                table.append(None)
        specials = {text: encoding.encode_single_token(text) for text in encoding.special_tokens_set}
        self._set_tables(table, specials.values())
        self._pieces = specials

    def id_for_piece(self, piece: str) -> int | None:
        special = self._pieces.get(piece)
        return special if special is not None else self.id_for_bytes(piece.encode("utf-8"))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens spelled in the text are recognised, as HF does."""
        return self.encoding.encode(text, allowed_special="all")


# ----------------------------------------------------------------------------- known encodings

# Qwen2's pre-tokenizer split (transformers' Qwen2Converter) and its special tokens.
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN2_SPECIAL_TOKENS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
_QWEN2_BASE_VOCAB = 151643

_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# name -> (split pattern, special tokens): what a bare `.tiktoken` rank file does not carry.
TIKTOKEN_ENCODINGS: dict[str, tuple[str, dict[str, int]]] = {
    "cl100k_base": (
        _CL100K_PATTERN,
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": (_O200K_PATTERN, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
}


# ----------------------------------------------------------------------------- loaders


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise VocabError(f"{what} not found: {path}")
    return path


def _tokenizer_from_file(path: Path) -> Tokenizer:
    _require_file(path, "tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises bare Exception for malformed files
        raise VocabError(f"cannot read {path} as a tokenizer.json: {exc}") from exc


def load_tokenizer_json(path: str | os.PathLike[str], *, name: str | None = None) -> HFVocab:
    """A `tokenizer.json` file."""
    path = Path(path)
    loader = functools.partial(_tokenizer_from_file, path)
    return HFVocab(loader(), name or _name_of(path), loader=loader)


def _name_of(path: Path) -> str:
    # 'models/phi-2/tokenizer.json' reads better as 'phi-2' than as 'tokenizer'.
    return path.parent.name if path.name in ("tokenizer.json", "vocab.json") else path.stem


def _qwen2_pipeline(tokenizer: Tokenizer) -> None:
    """Qwen2's pipeline around a byte-level BPE: NFC, regex split (isolated), ByteLevel without regex."""
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)


def _special(tokens: Mapping[str, int]) -> list[tuple[int, AddedToken]]:
    return [(i, AddedToken(text, special=True, normalized=False)) for text, i in tokens.items()]


def _bpe_tokenizer(
    vocab_json: Path, merges_txt: Path, added: Iterable[tuple[int, AddedToken]] | None
) -> Tokenizer:
    """A Qwen2-style tokenizer from vocab.json + merges.txt, with added tokens at their exact ids.

    `added` None means Qwen2's special tokens when the vocabulary has Qwen2's size, else none.
    """
    _require_file(vocab_json, "vocab.json")
    _require_file(merges_txt, "merges.txt")
    try:
        vocab, merges = models.BPE.read_file(str(vocab_json), str(merges_txt))
    except Exception as exc:
        raise VocabError(f"cannot read {vocab_json} + {merges_txt} as a BPE vocabulary: {exc}") from exc
    if added is None:
        added = _special(QWEN2_SPECIAL_TOKENS) if len(vocab) == _QWEN2_BASE_VOCAB else []
    added = sorted(added, key=lambda item: item[0])
    # tokenizers numbers new added tokens itself (after the highest id); putting them in the model
    # vocab first pins each to its real id, gaps included, and the added vocabulary reuses that id.
    for token_id, token in added:
        existing = vocab.setdefault(token.content, token_id)
        if existing != token_id:
            raise VocabError(
                f"added token {token.content!r} has id {token_id} but vocab.json says {existing}"
            )
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    _qwen2_pipeline(tokenizer)
    for _, token in added:
        if token.special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
    return tokenizer


def load_bpe_files(
    vocab_json: str | os.PathLike[str],
    merges_txt: str | os.PathLike[str],
    special_tokens: Mapping[str, int] | None = None,
    *,
    name: str | None = None,
) -> HFVocab:
    """A byte-level BPE from `vocab.json` + `merges.txt`, with Qwen2's pre-tokenization.

    `special_tokens` None means Qwen2's three when the vocabulary has Qwen2's size (151,643), else none.
    """
    vocab_path = Path(vocab_json)
    added = None if special_tokens is None else _special(special_tokens)
    loader = functools.partial(_bpe_tokenizer, vocab_path, Path(merges_txt), added)
    return HFVocab(loader(), name or _name_of(vocab_path), loader=loader)


def _config_added_tokens(path: Path) -> list[tuple[int, AddedToken]] | None:
    """`added_tokens_decoder` of a tokenizer_config.json (None if the file or the key is absent)."""
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_bytes()).get("added_tokens_decoder")
        if entries is None:
            return None
        return [
            (
                int(token_id),
                AddedToken(
                    entry["content"],
                    special=bool(entry.get("special", False)),
                    normalized=bool(entry.get("normalized", not entry.get("special", False))),
                    lstrip=bool(entry.get("lstrip", False)),
                    rstrip=bool(entry.get("rstrip", False)),
                    single_word=bool(entry.get("single_word", False)),
                ),
            )
            for token_id, entry in entries.items()
        ]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise VocabError(f"{path}: malformed added_tokens_decoder ({exc!r})") from exc


def _apply_config_tokens(tokenizer: Tokenizer, entries: Iterable[tuple[int, AddedToken]]) -> list[int]:
    """Reconcile tokenizer_config.json's added tokens with a loaded tokenizer.json.

    Adds the ones it lacks (at their ids, or fails) and returns the ids the config alone marks special.
    """
    extra_special: list[int] = []
    for token_id, token in sorted(entries, key=lambda item: item[0]):
        have = tokenizer.id_to_token(token_id)
        if have is None:
            # tokenizers numbers the token itself, so only the next free id can be filled this way.
            add = tokenizer.add_special_tokens if token.special else tokenizer.add_tokens
            add([token])
            if tokenizer.token_to_id(token.content) != token_id:
                raise VocabError(
                    f"tokenizer_config.json adds {token.content!r} at id {token_id}, where tokenizer.json "
                    "cannot place it; add it to tokenizer.json instead"
                )
        elif have != token.content:
            raise VocabError(
                f"tokenizer_config.json says id {token_id} is {token.content!r}; tokenizer.json has {have!r}"
            )
        elif token.special:
            extra_special.append(token_id)
    return extra_special


def load_directory(path: str | os.PathLike[str]) -> HFVocab:
    """A model folder: `tokenizer.json` (preferred) or `vocab.json` + `merges.txt`.

    `tokenizer_config.json`, when present, contributes only its `added_tokens_decoder`: tokens the
    tokenizer lacks are added at their ids, and ids it marks special are treated as special.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise VocabError(f"model folder not found: {folder}")
    from_config = _config_added_tokens(folder / "tokenizer_config.json")
    if (folder / "tokenizer.json").is_file():

        def with_config_tokens() -> Tokenizer:  # the reload: the same file, the same tokens added
            tokenizer = _tokenizer_from_file(folder / "tokenizer.json")
            _apply_config_tokens(tokenizer, from_config or [])
            return tokenizer

        tokenizer = _tokenizer_from_file(folder / "tokenizer.json")
        extra_special = _apply_config_tokens(tokenizer, from_config or [])
        return HFVocab(tokenizer, folder.name, extra_special_ids=extra_special, loader=with_config_tokens)
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        loader = functools.partial(_bpe_tokenizer, folder / "vocab.json", folder / "merges.txt", from_config)
        return HFVocab(loader(), folder.name, loader=loader)
    raise VocabError(f"{folder} has neither tokenizer.json nor vocab.json + merges.txt")


def _read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A `.tiktoken` rank file (`base64 rank` per line), read here so old tiktoken needs no blobfile."""
    ranks: dict[bytes, int] = {}
    for line_no, line in enumerate(_require_file(path, "tiktoken rank file").read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise VocabError(f"{path}:{line_no}: expected 'base64 rank', got {line[:60]!r}") from exc
    return ranks


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or os.sep in spec or spec.endswith(".tiktoken")


def load_tiktoken(
    spec: str,
    *,
    pattern: str | None = None,
    special_tokens: Mapping[str, int] | None = None,
) -> TiktokenVocab:
    """A `.tiktoken` rank file, or a tiktoken encoding name.

    For a file, the split pattern and special tokens come from its stem when that is a known
    encoding (cl100k_base, o200k_base); otherwise `pattern` is required. A bare name goes through
    `tiktoken.get_encoding`, which needs the network or tiktoken's cache.
    """
    import tiktoken  # here, not at module level: most gateways load no tiktoken vocabulary

    path = Path(spec).expanduser()
    if path.is_file():
        known = TIKTOKEN_ENCODINGS.get(path.stem)
        if pattern is None:
            if known is None:
                raise VocabError(
                    f"{path}: cannot tell the split pattern from the file name (known: "
                    f"{', '.join(TIKTOKEN_ENCODINGS)}); give 'pattern' (and 'special_tokens')"
                )
            pattern = known[0]
        if special_tokens is None:
            special_tokens = known[1] if known else {}
        try:
            encoding = tiktoken.Encoding(
                name=path.stem,
                pat_str=pattern,
                mergeable_ranks=_read_tiktoken_ranks(path),
                special_tokens=dict(special_tokens),
            )
        except VocabError:
            raise
        except Exception as exc:  # bad pattern, special ids clashing with ranks, ...
            raise VocabError(f"{path}: tiktoken rejected the encoding: {exc}") from exc
        return TiktokenVocab(encoding)
    if _looks_like_path(spec):
        raise VocabError(f"tiktoken rank file not found: {path}")
    if pattern is not None or special_tokens is not None:
        raise VocabError(f"'pattern' and 'special_tokens' apply to a .tiktoken file, not the name {spec!r}")
    try:
        encoding = tiktoken.get_encoding(spec)
    except ValueError as exc:  # tiktoken's "Unknown encoding"
        raise VocabError(f"unknown tiktoken encoding {spec!r}: {exc}") from exc
    except Exception as exc:  # network or cache failure
        raise VocabError(
            f"tiktoken could not load {spec!r}: it downloads encodings on first use (or reads "
            f"TIKTOKEN_CACHE_DIR), and that failed ({type(exc).__name__}). Offline, point to a local "
            f"rank file instead, e.g. {{tiktoken: /path/to/{spec}.tiktoken}}"
        ) from exc
    return TiktokenVocab(encoding)


def load_hf_hub(repo_id: str, *, revision: str | None = None) -> HFVocab:
    """The `tokenizer.json` of a Hugging Face Hub repo: the local HF cache first, then the network."""
    try:
        from huggingface_hub import hf_hub_download  # a dependency of tokenizers

        cached = hf_hub_download(repo_id, "tokenizer.json", revision=revision, local_files_only=True)
    except Exception:  # not cached (or no huggingface_hub): go online below
        cached = None
    if cached:
        return load_tokenizer_json(cached, name=repo_id)
    try:
        tokenizer = Tokenizer.from_pretrained(repo_id, revision=revision or "main")
    except Exception as exc:
        raise VocabError(
            f"could not fetch the tokenizer of {repo_id!r} from the Hugging Face Hub and it is not in "
            f"the local HF cache ({type(exc).__name__}: {exc}). This needs network access; offline, "
            "download tokenizer.json and use {file: path/to/tokenizer.json} or {directory: ...}"
        ) from exc
    return HFVocab(tokenizer, repo_id)


# ----------------------------------------------------------------------------- config form

# form key -> the other keys it accepts
_SPEC_FORMS: dict[str, frozenset[str]] = {
    "file": frozenset(),
    "tiktoken": frozenset({"pattern", "special_tokens"}),
    "directory": frozenset(),
    "hf": frozenset({"revision"}),
    "vocab": frozenset({"merges", "special_tokens"}),
}


def load_vocab(spec: Mapping[str, Any], base_dir: str | os.PathLike[str]) -> Vocab:
    """A vocabulary from its config form; relative paths resolve against `base_dir`.

    Forms: {file: tokenizer.json}, {tiktoken: o200k_base.tiktoken | o200k_base},
    {directory: /models/qwen}, {hf: Qwen/Qwen2-0.5B}, {vocab: vocab.json, merges: merges.txt}.
    Loaded vocabularies are cached by resolved spec, so models sharing a tokenizer share one load.
    """
    if not isinstance(spec, Mapping):
        raise VocabError(f"a tokenizer spec is a mapping with one of {_quoted(_SPEC_FORMS)}, got {spec!r}")
    forms = [key for key in _SPEC_FORMS if key in spec]
    if len(forms) != 1:
        if not forms and "merges" in spec:
            raise VocabError("key 'merges' needs 'vocab' (the vocab.json next to it)")
        got = f"got {_quoted(forms)}" if forms else f"got keys {_quoted(spec)}"
        raise VocabError(f"a tokenizer spec needs exactly one of {_quoted(_SPEC_FORMS)}; {got}")
    form = forms[0]
    for key in spec:
        if key != form and key not in _SPEC_FORMS[form]:
            allowed = _quoted(sorted(_SPEC_FORMS[form])) or "no other keys"
            raise VocabError(f"unknown key {key!r} in a {form!r} tokenizer spec (allowed with it: {allowed})")

    base = Path(base_dir)
    options: dict[str, Any] = {}
    if form == "vocab":
        if "merges" not in spec:
            raise VocabError("key 'vocab' needs 'merges' (the merges.txt next to it)")
        target: str = _resolve_file(spec, "vocab", base)
        options["merges"] = _resolve_file(spec, "merges", base)
    elif form == "file":
        target = _resolve_file(spec, "file", base)
    elif form == "directory":
        target = str(_resolve(spec, "directory", base))
        if not Path(target).is_dir():
            raise VocabError(f"key 'directory': folder not found: {target}")
    elif form == "tiktoken":
        value = _string(spec, "tiktoken")
        candidate = _resolve(spec, "tiktoken", base)
        target = str(candidate) if candidate.is_file() or _looks_like_path(value) else value
        if "pattern" in spec:
            options["pattern"] = _string(spec, "pattern")
    else:
        target = _string(spec, "hf")
        if "revision" in spec:
            options["revision"] = _string(spec, "revision")
    if "special_tokens" in spec:
        options["special_tokens"] = _special_tokens(spec)
    try:
        return _load_resolved(form, target, tuple(sorted(options.items())))
    except VocabError as exc:
        raise VocabError(f"key {form!r}: {exc}") from exc


def _quoted(keys: Iterable[Any]) -> str:
    return ", ".join(repr(k) for k in keys)


def _string(spec: Mapping[str, Any], key: str) -> str:
    value = spec[key]
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise VocabError(f"key {key!r} must be a non-empty string, got {value!r}")
    return value


def _resolve(spec: Mapping[str, Any], key: str, base: Path) -> Path:
    # abspath, not resolve(): following symlinks would rename files (HF cache snapshots link to
    # hash-named blobs) and hide the '<encoding>.tiktoken' stem that tiktoken files are known by.
    return Path(os.path.abspath(base / Path(_string(spec, key)).expanduser()))


def _resolve_file(spec: Mapping[str, Any], key: str, base: Path) -> str:
    path = _resolve(spec, key, base)
    if not path.is_file():
        raise VocabError(f"key {key!r}: file not found: {path}")
    return str(path)


def _special_tokens(spec: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    value = spec["special_tokens"]
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
    ):
        raise VocabError(f"key 'special_tokens' must map token text to an integer id, got {value!r}")
    return tuple(sorted(value.items()))


def forget_loaded_vocabularies() -> None:
    """Empty the load cache: the next `load_vocab` reads its files again (a config reload)."""
    _load_resolved.cache_clear()


@functools.cache
def _load_resolved(form: str, target: str, options: tuple[tuple[str, Any], ...]) -> Vocab:
    opts = dict(options)
    special = dict(opts["special_tokens"]) if "special_tokens" in opts else None
    if form == "file":
        return load_tokenizer_json(target)
    if form == "directory":
        return load_directory(target)
    if form == "vocab":
        return load_bpe_files(target, opts["merges"], special)
    if form == "tiktoken":
        return load_tiktoken(target, pattern=opts.get("pattern"), special_tokens=special)
    return load_hf_hub(target, revision=opts.get("revision"))
