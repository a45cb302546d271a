"""Upstream logprob payloads -> canonical `Token`s, undoing every lossy spelling.

A token's bytes are taken, in order of trust, from: a token id (`token_id:N`, or an id field)
looked up in the model's tokenizer; the `bytes:\\xNN` spelling; a `bytes` array that cannot be a
lossy decode; a raw vocabulary piece (`Ġhello`, `<0xE6>`) when the upstream sends those; the
string itself when it is clean text. Whatever stays lossy (`"�"`, `""`) is repaired by aligning
against the final text when the caller has it (see align.py).
"""

from __future__ import annotations

import codecs
import math
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, not_
from typing import Any

from gateway.logprobs.align import Alignment, Piece, align
from gateway.logprobs.compiled import TokenBatch, fastpath
from gateway.logprobs.report import TranslationReport
from gateway.logprobs.spellings import (
    REPLACEMENT_CHAR,
    TOKEN_ID_PREFIX,
    is_lossy_string,
    looks_like_special,
    parse_bytes_spelling,
    parse_token_id,
    unescape_chat_token,
)
from gateway.logprobs.tokens import (
    SENTINEL_LOGPROB,
    Candidate,
    Origin,
    Token,
    normalize_logprob,
    settle_alternatives,
)
from gateway.logprobs.vocab import Vocab

_REPLACED = "\ufffd".encode()
_INF = math.inf
_new = tuple.__new__  # builds a Token / Candidate without the keyword-handling constructor


class LogprobParseError(ValueError):
    """The upstream payload is not a logprob structure we can read."""


@dataclass(frozen=True, slots=True)
class ParseOptions:
    """How to read one upstream's token strings.

    trust_bytes: True for servers whose `bytes` are exact (OpenAI, llama.cpp, our own output);
      False to ignore them; None to judge per token (bytes that hold U+FFFD's encoding, or an empty
      list, are a lossy decode and are not trusted).
    pieces: token strings are raw vocabulary pieces (`Ġhello`, `▁the`, `<0xE6>`), as older vLLM sent.
    escapes: token strings use OpenAI's literal `\\xNN` escapes and `bytes` may be missing.
    read_ids: look up an entry's `id` field in the tokenizer; off where the server's `bytes` hold
      more than the id's own bytes (llama.cpp merges a split character into its completing token).
    leading_space_strippable: the text may lack the first token's leading space (SentencePiece
      decoders strip the "▁" their normalizer prepended); the first token's bytes then lose it too,
      so the bytes spell the text the server returned.
    """

    vocab: Vocab | None = None
    trust_bytes: bool | None = None
    pieces: bool = False
    escapes: bool = False
    leading_space_strippable: bool = True
    read_ids: bool = True


@dataclass(slots=True)
class Parsed:
    tokens: list[Token]
    report: TranslationReport = field(default_factory=TranslationReport)


@dataclass(frozen=True, slots=True)
class _Reading:
    """One token string read as far as it goes without the text."""

    string: str
    exact: bytes | None
    token_id: int | None
    special: bool
    origin: Origin


def _read(token: Any, raw_bytes: Any, options: ParseOptions, token_id: int | None = None) -> _Reading:
    if not isinstance(token, str):
        raise LogprobParseError(f"token must be a string, got {type(token).__name__}")
    vocab = options.vocab
    if token_id is None:
        token_id = parse_token_id(token)
        if token_id is not None and vocab is None:
            raise LogprobParseError(f"{token!r} is a token id placeholder but no tokenizer is configured")
    if token_id is not None and vocab is not None:
        try:
            data = vocab.token_bytes(token_id)
        except (KeyError, IndexError):
            raise LogprobParseError(f"token id {token_id} is not in the tokenizer {vocab.name!r}") from None
        return _Reading(token, data, token_id, vocab.is_special(token_id), Origin.TOKEN_ID)
    spelled = parse_bytes_spelling(token)
    if spelled is not None:
        return _Reading(token, spelled, None, False, Origin.EXACT)
    if raw_bytes is not None and options.trust_bytes is not False:
        data = _as_bytes(raw_bytes)
        if options.trust_bytes or not _is_valid_utf8(data):
            return _Reading(token, data, None, False, Origin.EXACT)
        if data and data.find(_REPLACED) < 0:  # (not `in`: for bytes it builds and drops a TypeError first)
            # Valid text: right unless the server merged neighbours into it; alignment checks.
            return _Reading(data.decode(), None, None, False, Origin.TEXT)
    if options.pieces and vocab is not None:
        piece_id = vocab.id_for_piece(token)
        if piece_id is not None:
            return _Reading(token, vocab.token_bytes(piece_id), piece_id, vocab.is_special(piece_id),
                            Origin.TOKEN_ID)
    if options.escapes and "\\x" in token:
        data = unescape_chat_token(token)
        if not _is_valid_utf8(data):
            return _Reading(token, data, None, False, Origin.EXACT)
    if is_lossy_string(token):
        return _Reading(token, None, None, False, Origin.AMBIGUOUS)
    return _Reading(token, None, None, False, Origin.TEXT)


def _as_bytes(raw: Any) -> bytes:
    if not isinstance(raw, list) or not all(isinstance(b, int) and 0 <= b <= 255 for b in raw):
        raise LogprobParseError("bytes must be a list of integers 0..255")
    return bytes(raw)


def _is_valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _logprob(value: Any, report: TranslationReport) -> float:
    if value is not None and not isinstance(value, int | float):
        raise LogprobParseError(f"logprob must be a number, got {type(value).__name__}")
    result = normalize_logprob(value)
    if result == SENTINEL_LOGPROB and (value is None or value != SENTINEL_LOGPROB):
        report.sentinels += 1
    return result


def _candidate(reading: _Reading, logprob: float, report: TranslationReport) -> Candidate:
    if reading.exact is not None:
        return Candidate(reading.exact, logprob, reading.token_id, reading.origin)
    if reading.origin is Origin.AMBIGUOUS:
        # An alternative has no text to align against: keep it, flagged, with its best-guess bytes.
        report.ambiguous_candidates += 1
    return Candidate(reading.string.encode(), logprob, None, reading.origin)


@dataclass(slots=True)
class _Entry:
    reading: _Reading
    logprob: float | None
    top: tuple[Candidate, ...]
    top_absent: bool


def _finish(entries: list[_Entry], text: str | None, options: ParseOptions, report: TranslationReport) -> Parsed:
    """Turn readings into Tokens, aligning lossy ones against `text` when given."""
    tokens: list[Token] = []
    report.from_ids += sum(1 for e in entries if e.reading.origin is Origin.TOKEN_ID)
    needs_alignment = any(e.reading.exact is None for e in entries) or text is not None
    if text is None or not needs_alignment:
        for index, entry in enumerate(entries):
            reading = entry.reading
            data = reading.exact if reading.exact is not None else reading.string.encode()
            top = entry.top
            if reading.origin is Origin.AMBIGUOUS:
                report.ambiguous_positions.append(index)  # its alternatives settle when it is aligned
                if options.vocab is None and reading.string == "":
                    report.per_character += 1  # what the stream's alignment will spell it (align.py)
            else:
                top = settle_alternatives(top, data, entry.logprob, data, reading.token_id, reading.origin)
            tokens.append(Token(data, entry.logprob, top, reading.token_id, reading.special,
                                reading.origin, entry.top_absent))
        return Parsed(tokens, report)

    # Tokens known to be special (by id) carry no text; the rest must tile it.
    visible = [i for i, e in enumerate(entries) if not e.reading.special]
    last_text = max((i for i in visible if entries[i].reading.string or entries[i].reading.exact), default=-1)
    pieces = []
    for i in visible:
        reading = entries[i].reading
        trailing_empty = reading.exact is None and reading.string == "" and i > last_text
        pieces.append(Piece(reading.string, reading.exact,
                            may_be_empty=trailing_empty or looks_like_special(reading.string),
                            may_drop_leading_space=i == visible[0] and options.leading_space_strippable))
    if text.endswith(REPLACEMENT_CHAR) and _ends_unfinished(pieces) and _flushed_tail(pieces, text):
        # The server wrote the unfinished character a length cap left as U+FFFD (SGLang decodes the
        # whole output once more); the tokens hold its real bytes, which stay dangling past the text
        # (see below). A U+FFFD for invalid bytes before it is text, and stays.
        text = text[:-1]
    beyond, stop_string = _beyond_text(pieces, text)
    # Exact tokens past the text: a matched stop string the server cut from the text (set aside),
    # or bytes of a character a length cap left unfinished (kept: the text cannot hold them).
    past_text = set(visible[len(visible) - beyond:]) if beyond and stop_string else set()
    dangling = {i: entries[i].reading.exact for i in visible[len(visible) - beyond:]} if beyond else {}
    if beyond:
        visible, pieces = visible[: len(visible) - beyond], pieces[: len(pieces) - beyond]
    if pieces and all(p.exact is not None for p in pieces) and _spelled_by(pieces, text):
        # Exact bytes that spell the text, invalid ones as the U+FFFD the server wrote: nothing to align.
        alignment = Alignment([p.exact for p in pieces], frozenset())  # type: ignore[misc]
    else:
        alignment = align(pieces, text.encode(), options.vocab)
    spans = dict(zip(visible, alignment.spans, strict=True))
    if not stop_string:
        spans.update(dangling)
    report.per_character += alignment.per_character
    ambiguous = {visible[j] for j in alignment.ambiguous}
    for index, entry in enumerate(entries):
        reading = entry.reading
        special = reading.special or index in past_text
        if special:
            data = reading.exact if reading.exact is not None else b""
            origin = reading.origin
        else:
            data = spans[index]
            origin = reading.origin
            if not data and reading.exact is None and (looks_like_special(reading.string) or index > last_text):
                # A control token (spelled as text, or "" after all text as vLLM decodes EOS): no text.
                special = True
            elif index in ambiguous:
                origin = Origin.AMBIGUOUS
            elif (reading.exact is None and data != reading.string.encode()) or reading.origin is Origin.AMBIGUOUS:
                origin = Origin.ALIGNED
        if origin is Origin.ALIGNED:
            report.aligned += 1
        if origin is Origin.AMBIGUOUS:
            report.ambiguous_positions.append(index)
        guess = reading.exact if reading.exact is not None else reading.string.encode()
        top = settle_alternatives(entry.top, guess, entry.logprob, data, reading.token_id, origin)
        tokens.append(Token(data, entry.logprob, top, reading.token_id, special, origin, entry.top_absent))
    return Parsed(tokens, report)


def _ends_unfinished(pieces: list[Piece]) -> bool:
    """The exact pieces end inside a character (a length cap stopped generation there)."""
    if not pieces or any(p.exact is None for p in pieces):
        return False
    tail = b"".join(p.exact for p in pieces)[-4:]  # type: ignore[misc]
    # Walk back over continuation bytes to the lead byte: does it promise more than is there?
    for back in range(1, len(tail) + 1):
        byte = tail[-back]
        if byte & 0xC0 != 0x80:
            needed = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
            return needed > back
    return False


def _spelled_by(pieces: list[Piece], text: str) -> bool:
    """The invariant for exact bytes: their replace-decoding is the text (U+FFFD where they are invalid)."""
    joined = b"".join(p.exact for p in pieces)  # type: ignore[misc]
    return joined == text.encode() or _replaced_is(joined, text)


def _replaced_is(joined: bytes, text: str) -> bool:
    """`joined`, with invalid bytes as U+FFFD, is `text`; an unfinished last character is not
    invalid (a cap cut it: it stays out of the text, see `_flushed_tail`)."""
    if REPLACEMENT_CHAR not in text:
        return False
    decoded, used = codecs.utf_8_decode(joined, "replace", False)
    return used == len(joined) and decoded == text


# How many trailing tokens a stop string or an unfinished character can hold, at most.
_MAX_BEYOND = 64


def _flushed_tail(pieces: list[Piece], text: str) -> bool:
    """`text`'s last U+FFFD is the one a final decode writes for the unfinished character the exact
    pieces end with (one maximal subpart: one U+FFFD), not one of the text's own."""
    joined = b"".join(p.exact for p in pieces)  # type: ignore[misc]
    head, used = codecs.utf_8_decode(joined, "replace", False)
    # The server may have held back whole characters with it (`Hi \xe6\xa0` -> "Hi\ufffd"), but
    # never invalid bytes before it: those were written as U+FFFD already.
    return used < len(joined) and head.startswith(text[:-1]) and REPLACEMENT_CHAR not in head[len(text) - 1:]


def _beyond_text(pieces: list[Piece], text: str) -> tuple[int, bool]:
    """How many trailing exact pieces lie wholly past the end of `text`, and whether they spell
    complete text (a stop string) rather than an unfinished character. (0, False): not that shape.

    The pieces before them spell the text as the invariant says (replace-decoded)."""
    if not pieces or any(p.exact is None for p in pieces):
        return 0, False
    joined = b"".join(p.exact for p in pieces)  # type: ignore[misc]
    if _spelled_by(pieces, text):
        return 0, False
    end = len(joined)
    for beyond in range(1, min(len(pieces), _MAX_BEYOND) + 1):
        end -= len(pieces[-beyond].exact)  # type: ignore[arg-type]
        head = joined[:end]
        if head != text.encode() and not _replaced_is(head, text):
            continue
        try:
            joined[end:].decode("utf-8")
        except UnicodeDecodeError:
            return beyond, False
        return beyond, True
    return 0, False


# --- fast paths ---------------------------------------------------------------------------------
# The gateway's hot path is one shape: vLLM with a tokenizer, every token and alternative a
# `token_id:N` placeholder (or, reading our own output back, exact `bytes`). These readers handle
# exactly that shape in one pass, with no intermediate objects, and give up (None) on the first
# entry that needs anything else; the general reader then starts over, so results and errors are
# the same either way. With the text given, exact tokens that already spell it are returned as
# they are (alignment could only confirm them); any other case is the general reader's.

_IdTable = tuple[tuple[bytes | None, ...], bytes]  # (bytes by id, None for holes; 1 per special id)
_ID_TABLES: weakref.WeakKeyDictionary[Any, _IdTable] = weakref.WeakKeyDictionary()
_LAST_TABLE: list[Any] = [None, ((), b"")]  # [weak reference to the vocabulary used last, its tables]


def id_table(vocab: Vocab) -> _IdTable:
    """The vocabulary's id -> bytes table (None for holes) and special-id flags, built once per vocabulary.

    A tuple, not a list: it holds no containers, so the garbage collector stops tracking it and
    never walks its ~150k entries again (a list would be walked on every full collection).
    """
    last_vocab, last_table = _LAST_TABLE
    if last_vocab is not None and last_vocab() is vocab:  # one upstream chunk after another: no lookup
        return last_table
    try:
        table = _ID_TABLES[vocab]
    except KeyError:
        table = _ID_TABLES[vocab] = _build_id_table(vocab)
    except TypeError:  # not weak-referenceable: build it each time (still correct)
        return _build_id_table(vocab)
    _LAST_TABLE[:] = [weakref.ref(vocab), table]
    return table


def _build_id_table(vocab: Vocab) -> _IdTable:
    table: list[bytes | None] = []
    for token_id in range(len(vocab)):
        try:
            table.append(vocab.token_bytes(token_id))
        except (KeyError, IndexError):
            table.append(None)
    flags = bytes(data is not None and vocab.is_special(token_id) for token_id, data in enumerate(table))
    return tuple(table), flags


def _placeholder_bytes(string: Any, table: tuple[bytes | None, ...]) -> tuple[int, bytes] | None:
    """(id, bytes) of a `token_id:N` string whose id is in the table; None for anything else."""
    if type(string) is not str or not string.startswith(TOKEN_ID_PREFIX):
        return None
    digits = string[9:]
    if not digits.isdecimal():
        return None
    token_id = int(digits)
    data = table[token_id] if token_id < len(table) else None
    return None if data is None else (token_id, data)


def _chat_from_ids(content: list[Any], vocab: Vocab, report: TranslationReport) -> list[Token] | None:
    table, special_flags = id_table(vocab)
    if fastpath is not None:
        compiled = fastpath.chat_from_ids(content, table, special_flags)
        if compiled is not None:
            report.from_ids += len(compiled)
            return compiled
    return _chat_from_ids_python(content, table, vocab, report)


def _chat_from_ids_python(content: list[Any], table: tuple[bytes | None, ...], vocab: Vocab,
                          report: TranslationReport) -> list[Token] | None:
    """The reference for `_fastpath.chat_from_ids`, and what runs when it was not built or declines."""
    size = len(table)
    is_special = vocab.is_special
    token_id_origin = Origin.TOKEN_ID
    tokens: list[Token] = []
    for item in content:
        if type(item) is not dict or "id" in item:
            return None
        string = item.get("token")
        if type(string) is not str or not string.startswith(TOKEN_ID_PREFIX):
            return None
        digits = string[9:]
        if not digits.isdecimal():
            return None
        token_id = int(digits)
        data = table[token_id] if token_id < size else None
        if data is None:
            return None
        special = is_special(token_id) or item.get("special") is True
        logprob = item.get("logprob")
        if type(logprob) is not float or not SENTINEL_LOGPROB < logprob < _INF:
            logprob = _logprob(logprob, report)
        top: list[Candidate] = []
        alternatives = item.get("top_logprobs")
        if alternatives:
            if type(alternatives) is not list:
                return None
            for alt in alternatives:
                if type(alt) is not dict or "id" in alt:
                    return None
                alt_string = alt.get("token")
                if type(alt_string) is not str or not alt_string.startswith(TOKEN_ID_PREFIX):
                    return None
                alt_digits = alt_string[9:]
                if not alt_digits.isdecimal():
                    return None
                alt_id = int(alt_digits)
                alt_data = table[alt_id] if alt_id < size else None
                if alt_data is None:
                    return None
                alt_logprob = alt.get("logprob")
                if type(alt_logprob) is not float or not SENTINEL_LOGPROB < alt_logprob < _INF:
                    alt_logprob = _logprob(alt_logprob, report)
                top.append(_new(Candidate, (alt_data, alt_logprob, alt_id, token_id_origin)))
        tokens.append(_new(Token, (data, logprob, tuple(top), token_id, special, token_id_origin, False)))
    report.from_ids += len(tokens)
    return tokens


def _chat_from_exact_bytes(content: list[Any], report: TranslationReport) -> list[Token] | None:
    """Entries whose `bytes` are exact by contract (our own Responses/chat output read back)."""
    exact = Origin.EXACT
    tokens: list[Token] = []
    for item in content:
        if type(item) is not dict or "id" in item:
            return None
        string = item.get("token")
        raw = item.get("bytes")
        # Placeholders and `bytes:` spellings outrank `bytes`; leave them to the general reader.
        if type(string) is not str or type(raw) is not list or string.startswith(("token_id:", "bytes:")):
            return None
        try:
            data = bytes(raw)
        except (TypeError, ValueError):
            return None
        logprob = item.get("logprob")
        if type(logprob) is not float or not SENTINEL_LOGPROB < logprob < _INF:
            logprob = _logprob(logprob, report)
        top: list[Candidate] = []
        alternatives = item.get("top_logprobs")
        if alternatives:
            if type(alternatives) is not list:
                return None
            for alt in alternatives:
                if type(alt) is not dict or "id" in alt:
                    return None
                alt_string = alt.get("token")
                alt_raw = alt.get("bytes")
                if (type(alt_string) is not str or type(alt_raw) is not list
                        or alt_string.startswith(("token_id:", "bytes:"))):
                    return None
                try:
                    alt_data = bytes(alt_raw)
                except (TypeError, ValueError):
                    return None
                alt_logprob = alt.get("logprob")
                if type(alt_logprob) is not float or not SENTINEL_LOGPROB < alt_logprob < _INF:
                    alt_logprob = _logprob(alt_logprob, report)
                top.append(_new(Candidate, (alt_data, alt_logprob, None, exact)))
        special = item.get("special") is True
        tokens.append(_new(Token, (data, logprob, tuple(top), None, special, exact, False)))
    return tokens


def _completions_from_ids(strings: list[Any], values: list[Any], tops: list[Any] | None, vocab: Vocab,
                          report: TranslationReport) -> list[Token] | None:
    table, special_flags = id_table(vocab)
    if fastpath is not None:
        compiled = fastpath.completions_from_ids(strings, values, tops, table, special_flags)
        if compiled is not None:
            report.from_ids += len(compiled)
            return compiled
    return _completions_from_ids_python(strings, values, tops, table, vocab, report)


def _completions_from_ids_python(strings: list[Any], values: list[Any], tops: list[Any] | None,
                                 table: tuple[bytes | None, ...], vocab: Vocab,
                                 report: TranslationReport) -> list[Token] | None:
    """The reference for `_fastpath.completions_from_ids`."""
    is_special = vocab.is_special
    token_id_origin = Origin.TOKEN_ID
    tokens: list[Token] = []
    for index, string in enumerate(strings):
        found = _placeholder_bytes(string, table)
        if found is None:
            return None
        token_id, data = found
        value = values[index]
        if value is None:
            logprob = None
        elif type(value) is float and SENTINEL_LOGPROB < value < _INF:
            logprob = value
        else:
            logprob = _logprob(value, report)
        top_dict = tops[index] if tops is not None else None
        top: list[Candidate] = []
        if top_dict is not None:
            if type(top_dict) is not dict:
                return None
            for key, alt_value in top_dict.items():
                alt = _placeholder_bytes(key, table)
                if alt is None:
                    return None
                if type(alt_value) is not float or not SENTINEL_LOGPROB < alt_value < _INF:
                    alt_value = _logprob(alt_value, report)
                top.append(_new(Candidate, (alt[1], alt_value, alt[0], token_id_origin)))
        tokens.append(_new(Token, (data, logprob, tuple(top), token_id, is_special(token_id), token_id_origin,
                                   top_dict is None)))
    report.from_ids += len(tokens)
    return tokens


_special_of = attrgetter("special")
_bytes_of = attrgetter("bytes")


def _spells(tokens: list[Token], text: str) -> bool:
    """The exact tokens spell `text` as they are: then aligning against it would change nothing."""
    specials = list(map(_special_of, tokens))  # C-level passes: a body has hundreds of tokens
    if True in specials:
        tokens = list(compress(tokens, map(not_, specials)))
    joined = b"".join(map(_bytes_of, tokens))
    # Invalid bytes (a character the next token never completed) are the U+FFFD the server wrote.
    return joined == text.encode() or _replaced_is(joined, text)


# --- general readers ------------------------------------------------------------------------------


def parse_chat(
    content: Sequence[Mapping[str, Any]] | TokenBatch | None, options: ParseOptions,
    text: str | None = None
) -> Parsed:
    """Chat `logprobs.content` entries `{token, logprob, bytes?, top_logprobs?}` (also llama.cpp's,
    whose entries add `id`) -> Tokens. `text` is the message text the tokens produced, if known."""
    if type(content) is TokenBatch:  # read from the body's JSON by the compiled reader (body_scan.py)
        return _parse_batch(content, options, text)
    if type(content) is list:
        report = TranslationReport()
        if options.vocab is not None:
            fast = _chat_from_ids(content, options.vocab, report)
        elif options.trust_bytes is True:
            fast = _chat_from_exact_bytes(content, report)
        else:
            fast = None
        if fast is not None:
            if text is None or _spells(fast, text):
                return Parsed(fast, report)
            if options.vocab is not None:
                report.from_ids = 0  # _finish counts them; the sentinels the id reader met stay counted
                return _finish(_exact_entries(fast), text, options, report)
    return _parse_chat_entries(content, options, text)


def _parse_batch(batch: TokenBatch, options: ParseOptions, text: str | None) -> Parsed:
    """The compiled body reader's tokens (chat or completions). Kept as the batch when they spell a whole
    answer's text exactly, as nearly every answer's do (the non-streamed Responses path then renders them
    from the batch, no Token built; other readers iterate it into Tokens); otherwise made Tokens, and read
    on as the id readers' are."""
    report = TranslationReport()
    if text is not None and batch.spells(text):
        report.from_ids += len(batch)
        return Parsed(batch, report)
    tokens = batch.tokens()  # (a stream chunk's, say: its text does not bound its tokens)
    if text is None or _spells(tokens, text):
        report.from_ids += len(tokens)
        return Parsed(tokens, report)
    return _finish(_exact_entries(tokens), text, options, report)


def _exact_entries(tokens: list[Token]) -> list[_Entry]:
    """The id readers' Tokens (chat or completions) as the general reader's entries for the same items
    would be (`_read` of a `token_id:N` string: the id's bytes, special flag and origin; the alternatives
    as `_candidate` makes them), so that `_finish` settles a text they do not spell as they are (a
    character a length cap left unfinished, a stop string cut from the text, a lossy text) without
    reading every entry again: against a real vLLM that reading cost ~6x the rest of the body's."""
    return [_Entry(_Reading(f"{TOKEN_ID_PREFIX}{token[3]}", token[0], token[3], token[4], token[5]), token[1],
                   token[2], token[6]) for token in tokens]


def _parse_chat_entries(
    content: Sequence[Mapping[str, Any]] | None, options: ParseOptions, text: str | None = None
) -> Parsed:
    """The general reader of chat entries, one at a time: any spelling `_read` knows."""
    report = TranslationReport()
    entries: list[_Entry] = []
    for item in content or ():
        if not isinstance(item, Mapping):
            raise LogprobParseError("each logprob entry must be an object")
        reading = _read(item.get("token"), item.get("bytes"), options,
                        _int_or_none(item.get("id")) if options.read_ids else None)
        if item.get("special") is True and not reading.special:
            reading = _Reading(reading.string, reading.exact, reading.token_id, True, reading.origin)
        logprob = _logprob(item.get("logprob"), report)
        top = tuple(_candidates_from_list(item.get("top_logprobs"), options, report))
        if not options.read_ids and top and _int_or_none(item.get("id")) is not None:
            top = _sampled_by_id(top, item, reading)
        entries.append(_Entry(reading, logprob, top, False))
    return _finish(entries, text, options, report)


def _candidates_from_list(
    items: Iterable[Mapping[str, Any]] | None, options: ParseOptions, report: TranslationReport
) -> Iterable[Candidate]:
    for item in items or ():
        if not isinstance(item, Mapping):
            raise LogprobParseError("each top_logprobs entry must be an object")
        reading = _read(item.get("token"), item.get("bytes"), options,
                        _int_or_none(item.get("id")) if options.read_ids else None)
        yield _candidate(reading, _logprob(item.get("logprob"), report), report)


def _sampled_by_id(top: tuple[Candidate, ...], item: Mapping[str, Any], reading: _Reading) -> tuple[Candidate, ...]:
    """llama.cpp: the alternative with the entry's `id` is the sampled token, whose entry may carry
    more bytes than the token's own (the fragments before it, merged into the completed character):
    it takes the entry's bytes, so it is recognised (and a completions dict does not list it twice)."""
    alternatives = item.get("top_logprobs") or ()
    if reading.exact is None or len(alternatives) != len(top):
        return top
    token_id = item["id"]
    return tuple(Candidate(reading.exact, cand.logprob, cand.token_id, reading.origin)
                 if isinstance(alt, Mapping) and alt.get("id") == token_id else cand
                 for cand, alt in zip(top, alternatives, strict=True))


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_completions(
    logprobs: Mapping[str, Any], options: ParseOptions, text: str | None = None
) -> Parsed:
    """Legacy completions `{tokens, token_logprobs, top_logprobs, text_offset}` -> Tokens.

    `text_offset` is ignored: it counts lossy strings and differs between servers; renderers
    recompute it. A null `token_logprobs[i]` (first echoed prompt token) stays None.
    """
    if type(logprobs) is TokenBatch:  # read from the body's JSON by the compiled reader (body_scan.py)
        return _parse_batch(logprobs, options, text)
    report = TranslationReport()
    token_strings = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs")
    if len(values) != len(token_strings) or (tops is not None and len(tops) != len(token_strings)):
        raise LogprobParseError("completions logprob arrays differ in length")
    if (options.vocab is not None and type(token_strings) is list and type(values) is list
            and (tops is None or type(tops) is list)):
        fast = _completions_from_ids(token_strings, values, tops, options.vocab, report)
        if fast is not None:
            if text is None or _spells(fast, text):
                return Parsed(fast, report)
            report.from_ids = 0  # as in parse_chat
            return _finish(_exact_entries(fast), text, options, report)
        report = TranslationReport()
    entries: list[_Entry] = []
    for index, token in enumerate(token_strings):
        reading = _read(token, None, options)
        value = values[index]
        logprob = None if value is None else _logprob(value, report)
        top_dict = tops[index] if tops is not None else None
        if top_dict is not None and not isinstance(top_dict, Mapping):
            raise LogprobParseError("completions top_logprobs entries must be objects")
        top = tuple(
            _candidate(_read(key, None, options), _logprob(lp, report), report)
            for key, lp in (top_dict or {}).items()
        )
        entries.append(_Entry(reading, logprob, top, top_dict is None))
    return _finish(entries, text, options, report)


def parse_responses(entries: Sequence[Mapping[str, Any]] | None, vocab: Vocab | None = None) -> Parsed:
    """Responses `output_text.logprobs` -> Tokens. `bytes` there is exact by contract."""
    return parse_chat(entries, ParseOptions(vocab=vocab, trust_bytes=True))

