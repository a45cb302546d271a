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
    assert text == " 根" and [t.bytes for t in tokens] == [b"", " 根".encode()]  # per character, not a guess
    assert [t.origin for t in tokens] == [Origin.ALIGNED, Origin.TEXT]


def _texts(grouper, tokens, finish="stop"):
    groups = [g for t in tokens for g in grouper.feed([t])] + grouper.finish(finish)
    return [(text, [t.bytes for t in toks]) for text, toks in groups]


def test_invalid_bytes_come_out_as_u_fffd_and_the_next_characters_start_waits():
    # The stream: 稏, then e7 a8 never completed, then 疤 (e7 96 + a4). Decoding the whole
    # pending buffer with replacement had turned 疤's first bytes into U+FFFD too: 稏��� for 稏�疤.
    tokens = [Token(b"\xe7\xa8\x8f", -0.1), Token(b"\xe7\xa8", -0.2), Token(b"\xe7\x96", -0.3), Token(b"\xa4", -0.4)]
    assert _texts(TextGrouper(), tokens) == [("稏", [b"\xe7\xa8\x8f"]), ("\ufffd", [b"\xe7\xa8"]),
                                             ("疤", [b"\xe7\x96", b"\xa4"])]


def test_a_token_holding_invalid_bytes_and_the_next_characters_start_waits_for_it():
    # No token ends between the invalid e7 a8 and 疤's start: the group waits until 疤 completes.
    tokens = [Token(b"\xe7", -0.1), Token(b"\xa8\xe7", -0.2), Token(b"\x96\xa4", -0.3)]
    assert _texts(TextGrouper(), tokens) == [("\ufffd疤", [b"\xe7", b"\xa8\xe7", b"\x96\xa4"])]


def test_a_cap_after_invalid_bytes_keeps_the_dangling_tail_with_the_text_the_upstream_wrote():
    # vLLM (as tokenizers' DecodeStream) holds e7 + a8 e7 back whole (its decoding ends in U+FFFD) and writes
    # nothing for them when a cap stops there; an upstream that wrote U+FFFD for the invalid bytes gets it.
    tokens = [Token(b"\xe7", -0.1), Token(b"\xa8\xe7", -0.2)]
    assert _texts(TextGrouper(), tokens, "length") == [("", [b"\xe7", b"\xa8\xe7"])]
    grouper = TextGrouper()
    assert grouper.feed(tokens[:1], "") == [] and grouper.feed(tokens[1:], "\ufffd") == []
    assert grouper.finish("length") == [("\ufffd", tokens)]


def test_a_cap_inside_a_token_holding_a_whole_character_leaves_that_character_out_as_vllm_does():
    # Real vLLM 0.32 (tests/real_engines/test_vllm_exact.py): "久し" + the start of the next character in
    # one last token is not in its text; the token keeps its entry, in a group with no text.
    grouper = TextGrouper()
    assert grouper.feed([Token("有两个".encode(), -0.1)], "有两个") == [("有两个", [Token("有两个".encode(), -0.1)])]
    assert grouper.feed([Token(b"\xe4\xb9\x85\xe3\x81\x97\xe3\x81", -0.2)], "") == []
    assert grouper.finish("length") == [("", [Token(b"\xe4\xb9\x85\xe3\x81\x97\xe3\x81", -0.2)])]
