"""Group streamed tokens into text deltas, each carrying exactly the tokens whose text it adds.

A token that ends inside a character waits until the character completes. Without a tokenizer
(lossy strings), the upstream's own text leads and tokens ride with the text they came with.
Shared by every front door's streaming translator.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from itertools import compress
from operator import attrgetter, not_

from gateway.logprobs.compiled import TokenBatch
from gateway.logprobs.realign import realign
from gateway.logprobs.tokens import Origin, Token
from gateway.logprobs.vocab import Vocab

# A group's tokens: a list, or the step's own TokenBatch when the grouper passes a one-token chunk on whole.
Group = tuple[str, "list[Token] | TokenBatch"]


class TextMismatch(ValueError):
    """The upstream sent text its logprobs do not cover: the logprobs cannot describe the output."""


_AMBIGUOUS = Origin.AMBIGUOUS
_origin_of = attrgetter("origin")
_special_of = attrgetter("special")
_bytes_of = attrgetter("bytes")
_utf_8_decode = codecs.utf_8_decode
# Lead bytes whose second byte has a narrower range than 80..BF (RFC 3629), and that range.
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def _final_prefix(data: bytes | bytearray) -> tuple[str, int]:
    """(text, used): the replace-decoding of `data[:used]`, the longest prefix after which only an
    unfinished character is left (a later token may complete it). Invalid bytes before that become
    U+FFFD, one per maximal invalid subpart as vLLM's detokenizer (`String::from_utf8_lossy`) writes
    them, so `data[:used].decode(errors="replace")` is the upstream's text for those bytes.

    The incremental decoder stops before an unfinished last character without raising; it also
    stops before a few endings that can never complete (a surrogate's first two bytes, say): those
    are final, and decoded with the rest.
    """
    text, used = _utf_8_decode(data, "replace", False)
    if used == len(data):
        return text, used
    second = _SECOND_BYTE.get(data[used])
    if second is None or used + 1 == len(data) or second[0] <= data[used + 1] <= second[1]:
        return text, used
    return data.decode("utf-8", errors="replace"), len(data)


def _clean_cut(sizes: list[int], data: bytes | bytearray, text: str, used: int) -> tuple[int, int, str] | None:
    """(tokens, bytes, text) of the longest run of the pending tokens (`sizes`: each one's byte count) whose
    bytes end where one of `text`'s characters (or U+FFFD) ends, within the final prefix `data[:used]`;
    None if no token ends there."""
    boundary = len(data)
    for count in range(len(sizes) - 1, 0, -1):
        boundary -= sizes[count]
        if boundary > used:
            continue
        head = data[:boundary].decode("utf-8", errors="replace")
        if head + data[boundary:used].decode("utf-8", errors="replace") == text:
            return count, boundary, head
    return None


class TextGrouper:
    def __init__(self, vocab: Vocab | None = None) -> None:
        self._vocab = vocab
        self._pending: list[Token] = []
        # Or the tokens waiting, when each came as a one-token TokenBatch: joined in one batch, no Token made.
        self._pending_batch: TokenBatch | None = None
        self._pending_sizes: list[int] = []  # ... and each one's byte count
        self._pending_bytes = bytearray()
        # The upstream's text so far is only ever measured and its first character looked at:
        # keep those, not a string copied again at every step.
        self._upstream_chars = 0
        self._upstream_head = ""  # the first non-empty text the upstream reported
        self._upstream_tail = ""  # ... and its last character
        self._first_token_seen = False
        self._text_led = False
        self._held: list[Token] = []
        self._emitted_chars = 0

    def feed(self, tokens: Iterable[Token], upstream_text: str = "") -> list[Group]:
        """One upstream step: its tokens (exact bytes where known) and the text it reported. A TokenBatch
        of one visible token is grouped as a batch (`feed_batch`); any other is read as its Tokens."""
        if type(tokens) is TokenBatch:
            groups = self.feed_batch(tokens, upstream_text)
            if groups is not None:
                return groups
            tokens = tokens.tokens()  # type: ignore[attr-defined]
        elif type(tokens) is not list:
            tokens = list(tokens)
        self._count_upstream(upstream_text)
        if self._pending_batch is not None:
            self._unbatch_pending()
        if len(tokens) == 1 and self._first_token_seen and not self._pending and not self._text_led:
            # The usual step of a stream (one visible token ending where a character ends, nothing waiting):
            # its own group, directly; the loop below would decode it the same way.
            token = tokens[0]
            if token.origin is not _AMBIGUOUS and not token.special:
                text, used = _final_prefix(token.bytes)
                if used == len(token.bytes):
                    self._emitted_chars += len(text)
                    return [(text, [token])]
        if len(tokens) == 1:
            lossy = tokens[0].origin is _AMBIGUOUS
        else:
            lossy = any(token.origin is _AMBIGUOUS for token in tokens)
        if not self._pending and (lossy or self._text_led or (not tokens and upstream_text)):
            self._text_led = self._text_led or lossy
            self._held += [t for t in tokens if not t.special]
            if not upstream_text:
                return []
            tokens_for_text, _ = realign(self._held, upstream_text, self._vocab)
            self._held = []
            self._emitted_chars += len(upstream_text)
            return [(upstream_text, tokens_for_text)]
        groups: list[Group] = []
        for token in tokens:
            if token.special:
                continue  # control tokens spell no text
            if not self._first_token_seen:
                token = self._first_visible(token)
            pending = self._pending
            pending.append(token)
            if len(pending) == 1:
                data = token.bytes  # nothing waiting: decode the token's own bytes, no copy
                if data.isascii():
                    groups.append((data.decode(), pending))
                    self._emitted_chars += len(data)
                    self._pending = []
                    continue
            else:
                self._pending_bytes += token.bytes
                data = self._pending_bytes
            text, used = _final_prefix(data)
            if used == len(data):
                groups.append((text, pending))
                self._emitted_chars += len(text)
                self._pending = []
                if len(pending) > 1:
                    self._pending_bytes = bytearray()
                continue
            if len(pending) == 1:
                self._pending_bytes += data  # the character completes in a later token
            if used:
                # Bytes that no later token can make valid (U+FFFD in the upstream's text) come out now;
                # the unfinished character after them waits, so its start is never replaced.
                self._emit_final(groups, text, used)
        return groups

    def feed_batch(self, batch: TokenBatch, upstream_text: str) -> list[Group] | None:
        """`feed` of the usual stream chunk: one visible token as a TokenBatch, grouped as the loop in `feed`
        groups its Token, the batch kept whole. Its own group when its bytes end a character and nothing
        waits; else it waits, joined to the batch of the tokens before it, until a character ends (at most
        one group). None, nothing changed, for any other step: `feed` reads it as Tokens."""
        if self._pending or self._text_led or not self._first_token_seen:
            return None
        data = batch.sole_visible_bytes()  # type: ignore[attr-defined]
        if data is None:
            return None
        waiting = self._pending_batch
        if waiting is None:
            text, used = _final_prefix(data)
            if used == len(data):
                groups: list[Group] = [(text, batch)]
                self._emitted_chars += len(text)
            else:  # it waits whole (one token cannot be cut, even after bytes no token can mend: see _emit_final)
                self._pending_batch, self._pending_sizes = batch, [len(data)]
                self._pending_bytes += data
                groups = []
            self._count_upstream(upstream_text)
            return groups
        joined = self._pending_bytes + data
        text, used = _final_prefix(joined)
        sizes = self._pending_sizes
        if used == len(joined):
            if not waiting.extend(batch):  # type: ignore[attr-defined]
                return None
            self._pending_batch, self._pending_bytes = None, bytearray()
            self._emitted_chars += len(text)
            self._count_upstream(upstream_text)
            return [(text, waiting)]
        if used and _clean_cut([*sizes, len(data)], joined, text, used) is not None:
            return None  # the loop cuts the final bytes off (a U+FFFD's group) and keeps the rest waiting
        if not waiting.extend(batch):  # type: ignore[attr-defined]
            return None
        sizes.append(len(data))
        self._pending_bytes = joined
        self._count_upstream(upstream_text)
        return []

    def _unbatch_pending(self) -> None:
        """The waiting batch as the Tokens the loop in `feed` keeps (their bytes are in `_pending_bytes`)."""
        assert self._pending_batch is not None and not self._pending
        self._pending = self._pending_batch.tokens()  # type: ignore[attr-defined]
        self._pending_batch = None

    def _count_upstream(self, upstream_text: str) -> None:
        if upstream_text:
            if not self._upstream_chars:
                self._upstream_head = upstream_text
            self._upstream_chars += len(upstream_text)
            self._upstream_tail = upstream_text[-1]

    def _emit_final(self, groups: list[Group], text: str, used: int) -> None:
        cut = _clean_cut([len(token.bytes) for token in self._pending], self._pending_bytes, text, used)
        if cut is None:
            return  # one token holds both invalid bytes and the unfinished start: wait for it to complete
        count, boundary, head = cut
        groups.append((head, self._pending[:count]))
        self._emitted_chars += len(head)
        self._pending = self._pending[count:]
        self._pending_bytes = self._pending_bytes[boundary:]

    def feed_all(self, tokens: Iterable[Token], upstream_text: str = "") -> list[Group]:
        """`feed` for a caller that only needs the groups' sum (a non-streamed Response, no delta
        events): one group for the whole step when its bytes are complete, valid UTF-8; otherwise `feed`.
        The text and the tokens in order are what `feed`'s groups would hold, joined.

        A `TokenBatch` (a whole body's tokens, read by the compiled reader) whose visible tokens spell the
        text exactly is that one group as it is: the batch stands for its visible tokens (the caller renders
        it whole, `MessageLogprobs`); any other is made Tokens first."""
        if self._pending_batch is not None:
            self._unbatch_pending()
        if type(tokens) is TokenBatch:
            if self._pending or self._held or self._text_led or not tokens.spells(upstream_text):
                tokens = tokens.tokens()
            else:
                # Exact bytes of the text: no leading space to drop, nothing left unfinished.
                self._count_upstream(upstream_text)
                visible = tokens.visible
                self._first_token_seen = self._first_token_seen or bool(visible)
                self._emitted_chars += len(upstream_text)
                return [(upstream_text, tokens)] if visible else []
        if type(tokens) is not list:
            tokens = list(tokens)
        if self._pending or self._held or self._text_led or not tokens:
            return self.feed(tokens, upstream_text)
        # One C-level pass per attribute rather than a Python loop over the tokens (a hundred or more).
        if _AMBIGUOUS in list(map(_origin_of, tokens)):
            return self.feed(tokens, upstream_text)
        specials = list(map(_special_of, tokens))
        visible = list(compress(tokens, map(not_, specials))) if True in specials else tokens[:]
        head = self._upstream_head if self._upstream_chars else upstream_text
        if visible and not self._first_token_seen and self._drops_leading_space(visible[0], head):
            first = visible[0]
            visible[0] = Token(first.bytes[1:], first.logprob, first.top, first.token_id, first.special,
                               first.origin, first.top_absent)
        try:
            text = b"".join(map(_bytes_of, visible)).decode()
        except UnicodeDecodeError:  # an unfinished or broken character: the per-token path decides
            return self.feed(tokens, upstream_text)
        self._count_upstream(upstream_text)
        if visible:
            self._first_token_seen = True
        self._emitted_chars += len(text)
        return [(text, visible)] if visible else []

    @staticmethod
    def _drops_leading_space(token: Token, upstream_head: str) -> bool:
        return token.bytes.startswith(b" ") and bool(upstream_head) and not upstream_head.startswith(" ")

    def _first_visible(self, token: Token) -> Token:
        """SentencePiece decoders drop the space their normalizer put before the first token."""
        if self._first_token_seen:
            return token
        self._first_token_seen = True
        if self._drops_leading_space(token, self._upstream_head):
            return Token(token.bytes[1:], token.logprob, token.top, token.token_id, token.special, token.origin,
                         token.top_absent)
        return token

    def finish(self, finish_reason: str | None) -> list[Group]:
        """Tokens left inside an unfinished character keep their logprobs in a group with no text.

        In a text-led stream an empty string after the last text is the end-of-sequence token,
        unless generation was cut by length."""
        if self._pending_batch is not None:
            self._unbatch_pending()
        unfinished = self._upstream_chars - self._emitted_chars - len(self._pending_bytes)
        if unfinished > 0 and not (unfinished == 1 and self._upstream_tail == "\ufffd" and not self._pending):
            # More text than the logprobs spell (tokens beyond the text are tolerated: a stop string).
            raise TextMismatch(f"the upstream sent {self._upstream_chars} characters of text but logprobs "
                               f"for only {self._emitted_chars}")
        # Else one U+FFFD past the logprobs: the unfinished character a server stopped inside, written as
        # U+FFFD with no entry for any of its tokens (llama.cpp, non-streamed): its text, no logprobs.
        held = self._held if finish_reason == "length" else [t for t in self._held if t.bytes]
        # The tokens still waiting spell only what the upstream wrote for them: vLLM's detokenizer (as
        # tokenizers' DecodeStream) holds back a token ending inside a character with any whole character
        # or U+FFFD it also holds, and never writes them when generation stops there
        # (tests/real_engines/test_vllm_exact.py saw "久し" of b"\xe4\xb9\x85\xe3\x81\x97\xe3\x81" missing).
        text = _final_prefix(self._pending_bytes)[0] if self._pending else ""
        text = text[:max(0, self._upstream_chars - self._emitted_chars)]
        dangling = self._pending + held
        self._pending, self._held, self._pending_bytes = [], [], bytearray()
        groups = [(text, dangling)] if dangling else []
        if unfinished > 0:
            self._emitted_chars += 1
            groups.append(("\ufffd", []))
        return groups
