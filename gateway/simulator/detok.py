"""Token strings as servers show them: per-id (lossy), incremental (held back until complete), and TGI's offsets.

Servers decode each logprob token on its own, so a token holding part of a UTF-8 character becomes
"�"; special tokens become "" when skipped (vLLM) or keep their text (TGI, SGLang's `batch_decode`).
The response *text* instead comes from an incremental detokenizer that holds back bytes until a
character completes.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence

from gateway.logprobs.vocab import Vocab

REPLACEMENT = "\ufffd"


def decode_ids(vocab: Vocab, ids: Sequence[int], *, skip_special: bool) -> str:
    """`tokenizer.decode(ids)`: the joined bytes, undecodable ones as U+FFFD."""
    data = b"".join(b"" if skip_special and vocab.is_special(i) else vocab.token_bytes(i) for i in ids)
    return data.decode("utf-8", errors="replace")


class TokenStrings:
    """Per-id decoded strings, the way a per-token decode spells them (cached).

    skip_special=True is vLLM (`skip_special_tokens=True`: control tokens are ""); False is HF
    `batch_decode` with its default, as TGI and SGLang use for logprob tokens ("<|im_end|>").
    """

    def __init__(self, vocab: Vocab, *, skip_special: bool = True) -> None:
        self._vocab = vocab
        self._skip_special = skip_special
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = decode_ids(self._vocab, (token_id,), skip_special=self._skip_special)
        return text


class ContextualTokenStrings:
    """vLLM 0.32's logprob token strings (sampled and alternatives alike), read from its source
    (`vllm/v1/engine/logprobs.py`, `LogprobsProcessor._verify_tokens` / `_correct_decoded_token`):
    a token decoded on its own that ends in U+FFFD is decoded again after up to 4 preceding sampled
    tokens; the first decode that no longer ends in U+FFFD, minus the text of the context tokens
    that decode cleanly on their own, is its string; none: "". So the lead token of a split
    character is "" and the completing one spells the whole character with any text the lead held
    (Qwen2's b" \xe6\xa0" + b"\xb9" -> "", " 根"); a character never finished is "" too.
    """

    def __init__(self, vocab: Vocab, plain: TokenStrings) -> None:
        self._vocab = vocab
        self._plain = plain

    def at(self, token_id: int, context: Sequence[int]) -> str:
        text = self._plain(token_id)
        if not text.endswith(REPLACEMENT):
            return text
        recent = list(context[-4:])
        for count in range(1, len(recent) + 1):
            window = recent[-count:]
            full = decode_ids(self._vocab, [*window, token_id], skip_special=False)
            if full.endswith(REPLACEMENT):
                continue
            clean = len(window)
            while clean > 0 and self._plain(window[clean - 1]).endswith(REPLACEMENT):
                clean -= 1
            prefix = decode_ids(self._vocab, window[:clean], skip_special=False) if clean else ""
            if full.startswith(prefix):
                return full[len(prefix):]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas, holding back incomplete characters.

    Bytes that never complete (generation cut mid-character) are not emitted by `feed`, as in vLLM,
    so the final text can be shorter than the tokens' bytes; `flush` spells them as U+FFFD, as
    servers that decode the whole output once more at the end do (SGLang).
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

    def flush(self) -> str:
        """Whatever is held back, spelled as U+FFFD (end of generation)."""
        return self._decoder.decode(b"", final=True)


class HoldingDetokenizer:
    """vLLM's detokenizer (v1 `FastIncrementalDetokenizer`, over `tokenizers`' `DecodeStream`): the
    text of every token since the last emission is held while its decoding ends in U+FFFD, so a
    token holding a whole character and the start of the next (Qwen2's b" \xf0\x9f\x91") shows
    nothing until the character completes, the space included; a length cap there leaves both out of
    the text. Invalid bytes before a later complete character come out as U+FFFD with it (one per
    maximal invalid subpart, `String::from_utf8_lossy`). Same interface as IncrementalDetokenizer.
    """

    def __init__(self, vocab: Vocab) -> None:
        self._decoder = OffsetDecoder(vocab, skip_special=True)

    def feed(self, token_ids: Iterable[int]) -> str:
        return "".join([self._decoder.feed(token_id) for token_id in token_ids])


class OffsetDecoder:
    """TGI's `decode_token`: the text each generated token adds, decoded with prefix/read offsets.

    Each step decodes ids[prefix:] and ids[prefix:read] (special tokens kept); if the longer one
    grew and does not end in U+FFFD, the growth is the token's text and the offsets move on.
    Otherwise the token's text is "" and the offsets stay, so a character split over tokens shows
    as "" on the first ones and in full on the completing one, together with any complete text
    the earlier tokens held (Qwen2's b" \\xf0\\x9f\\x91" + b"\\x8b" -> "", " 👋").
    """

    def __init__(self, vocab: Vocab, *, skip_special: bool = False) -> None:
        self._vocab = vocab
        self._skip_special = skip_special
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def feed(self, token_id: int) -> str:
        self._ids.append(token_id)
        skip = self._skip_special
        prefix_text = decode_ids(self._vocab, self._ids[self._prefix : self._read], skip_special=skip)
        new_text = decode_ids(self._vocab, self._ids[self._prefix :], skip_special=skip)
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text) :]
        return ""
