"""Lossy upstream spellings recovered exactly with a real tokenizer (Qwen2, read in place)."""

import pytest

from gateway.logprobs.align import Piece, align
from gateway.logprobs.parse import ParseOptions, parse_chat, parse_completions
from gateway.logprobs.tokens import Origin
from gateway.logprobs.vocab import load_bpe_files


@pytest.fixture(scope="module")
def qwen2(shared_dir):
    return load_bpe_files(shared_dir / "qwen2" / "vocab.json", shared_dir / "qwen2" / "merges.txt")


def test_token_id_placeholders_give_exact_bytes_for_tokens_and_alternatives(qwen2):
    # vLLM return_tokens_as_token_ids: its own `bytes` are UTF-8 of the decoded string / placeholder.
    content = [{"token": "token_id:51461", "logprob": -0.5, "bytes": [32, 239, 191, 189],
                "top_logprobs": [{"token": "token_id:51461", "logprob": -0.5, "bytes": list(b"token_id:51461")},
                                 {"token": "token_id:117", "logprob": -2.0, "bytes": list(b"token_id:117")}]}]
    parsed = parse_chat(content, ParseOptions(vocab=qwen2))
    token = parsed.tokens[0]
    assert token.bytes == b" \xe6\xa0" and token.origin is Origin.TOKEN_ID and token.token_id == 51461
    assert [c.bytes for c in token.top] == [b" \xe6\xa0", b"\xb9"]
    assert parsed.report.from_ids == 1


def test_placeholder_of_a_special_token_is_flagged_special(qwen2):
    parsed = parse_chat([{"token": "token_id:151645", "logprob": -0.1}], ParseOptions(vocab=qwen2))
    assert parsed.tokens[0].special and parsed.tokens[0].bytes == b"<|im_end|>"


def test_raw_byte_level_pieces_map_back_to_bytes(qwen2):
    # Older vLLM sent convert_ids_to_tokens pieces: 'æĺ¯' is 是 (E6 98 AF), 'Ġworld' is b' world'.
    content = [{"token": "æĺ¯", "logprob": -0.1, "bytes": list("æĺ¯".encode())},
               {"token": "Ġworld", "logprob": -0.2, "top_logprobs": [{"token": "Ċ", "logprob": -3.0}]}]
    parsed = parse_chat(content, ParseOptions(vocab=qwen2, pieces=True, trust_bytes=False))
    assert [t.bytes for t in parsed.tokens] == ["是".encode(), b" world"]
    assert parsed.tokens[1].top[0].bytes == b"\n"


def test_legacy_completions_with_placeholders_are_exact(qwen2):
    lp = {"tokens": ["token_id:51461", "token_id:117"], "token_logprobs": [-0.5, -0.1],
          "top_logprobs": [{"token_id:51461": -0.5, "token_id:117": -1.5}, {"token_id:117": -0.1}],
          "text_offset": [0, 14]}
    parsed = parse_completions(lp, ParseOptions(vocab=qwen2))
    assert b"".join(t.bytes for t in parsed.tokens) == " 根".encode()


def test_tokenizer_settles_a_split_the_text_alone_leaves_open(qwen2):
    # TGI style: "" then the completing token spelled as the whole " 根". Without a tokenizer several
    # splits fit (1+3 bytes, 2+2, 3+1), so none is guessed: the one per-character spelling, counted.
    pieces = [Piece("x"), Piece(""), Piece(" 根")]
    text = "x 根".encode()
    unresolved = align(pieces, text)
    assert unresolved.spans == [b"x", b"", " 根".encode()]
    assert unresolved.per_character == 1
    resolved = align(pieces, text, qwen2)
    assert resolved.spans == [b"x", b" \xe6\xa0", b"\xb9"]
    assert not resolved.ambiguous


def test_replacement_strings_with_tokenizer_and_text(qwen2):
    ids = qwen2.encode("Hi 🦀 根据")
    content = [{"token": qwen2.token_bytes(i).decode("utf-8", errors="replace"), "logprob": -0.1} for i in ids]
    parsed = parse_chat(content, ParseOptions(vocab=qwen2), text="Hi 🦀 根据")
    assert [t.bytes for t in parsed.tokens] == [qwen2.token_bytes(i) for i in ids]
    assert parsed.report.ambiguous_positions == []


def test_tokens_of_a_stop_string_cut_from_the_text_are_set_aside(qwen2):
    ids = qwen2.encode("Hello world STOP")
    content = [{"token": f"token_id:{i}", "logprob": -0.1} for i in ids]
    parsed = parse_chat(content, ParseOptions(vocab=qwen2), text="Hello world")
    visible = [t for t in parsed.tokens if not t.special]
    assert b"".join(t.bytes for t in visible) == b"Hello world"
    assert len(parsed.tokens) == len(ids)


def test_bytes_of_a_character_left_unfinished_by_a_length_cap_are_kept(qwen2):
    ids = qwen2.encode("Hi 根")  # ..., ' \xe6\xa0', '\xb9': cut after the first half of 根
    content = [{"token": f"token_id:{i}", "logprob": -0.1} for i in ids[:-1]]
    parsed = parse_chat(content, ParseOptions(vocab=qwen2), text="Hi")
    assert [t.bytes for t in parsed.tokens] == [qwen2.token_bytes(i) for i in ids[:-1]]
    assert not any(t.special for t in parsed.tokens)


def test_a_replacement_char_for_the_unfinished_character_is_not_text(qwen2):
    ids = qwen2.encode("Hi 根")
    content = [{"token": f"token_id:{i}", "logprob": -0.1} for i in ids[:-1]]
    parsed = parse_chat(content, ParseOptions(vocab=qwen2), text="Hi\ufffd")
    assert [t.bytes for t in parsed.tokens] == [qwen2.token_bytes(i) for i in ids[:-1]]
