"""Streaming token grouping: split characters wait; lossy streams follow the upstream's text."""

import pytest

from gateway.logprobs.parse import ParseOptions, parse_chat
from gateway.logprobs.tokens import Origin, Token
from gateway.logprobs.vocab import load_bpe_files
from gateway.translate.grouping import TextGrouper


def test_a_split_character_waits_for_its_last_byte():
    grouper = TextGrouper()
    assert grouper.feed([Token(b"Hi", -0.1)]) == [("Hi", [Token(b"Hi", -0.1)])]
    assert grouper.feed([Token(b" \xf0\x9f", -0.2)]) == []
    [(text, tokens)] = grouper.feed([Token(b"\xa6\x80", -0.3), Token(b"!", -0.4)])[:1]
    assert text == " 🦀" and [t.bytes for t in tokens] == [b" \xf0\x9f", b"\xa6\x80"]


def test_dangling_bytes_at_a_length_cap_keep_their_logprobs_with_empty_text():
    grouper = TextGrouper()
    grouper.feed([Token(b"\xe6\xa0", -0.2)])
    assert grouper.finish("length") == [("", [Token(b"\xe6\xa0", -0.2)])]


def test_special_tokens_spell_no_text():
    grouper = TextGrouper()
    assert grouper.feed([Token(b"<|im_end|>", -0.1, special=True)]) == []


def _tgi_chunk(token: str) -> list[Token]:
    return parse_chat([{"token": token, "logprob": -0.5}], ParseOptions()).tokens


@pytest.fixture(scope="module")
def qwen2(shared_dir):
    return load_bpe_files(shared_dir / "qwen2" / "vocab.json", shared_dir / "qwen2" / "merges.txt")


def test_lossy_stream_follows_the_text_and_the_tokenizer_recovers_exact_bytes(qwen2):
    # TGI's chat stream: the first token of " 根" comes as "", the completing one as " 根".
    grouper = TextGrouper(qwen2)
    assert grouper.feed(_tgi_chunk(""), "") == []
    [(text, tokens)] = grouper.feed(_tgi_chunk(" 根"), " 根")
    assert text == " 根"
    assert [t.bytes for t in tokens] == [b" \xe6\xa0", b"\xb9"]
    assert all(t.origin is Origin.ALIGNED for t in tokens)


def test_lossy_stream_without_tokenizer_keeps_the_text_and_flags_the_split():
    grouper = TextGrouper()
    grouper.feed(_tgi_chunk(""), "")
    [(text, tokens)] = grouper.feed(_tgi_chunk(" 根"), " 根")
    assert text == " 根" and b"".join(t.bytes for t in tokens) == " 根".encode()
    assert [t.origin for t in tokens] == [Origin.AMBIGUOUS, Origin.AMBIGUOUS]
