"""Token spellings: each format's string for a run of bytes, and reading it back."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.logprobs.spellings import (
    chat_token_string,
    completions_token_string,
    is_lossy_string,
    looks_like_special,
    parse_bytes_spelling,
    parse_token_id,
    unescape_chat_token,
)


def test_chat_string_escapes_only_undecodable_bytes():
    assert chat_token_string(b" \xeb") == " \\xeb"
    assert chat_token_string("根".encode()) == "根"
    assert chat_token_string(b"\xf0\x9f\x91") == "\\xf0\\x9f\\x91"


def test_completions_string_uses_bytes_prefix_for_partial_characters():
    assert completions_token_string(b"\xe2\x80") == "bytes:\\xe2\\x80"
    assert completions_token_string(b"Hello") == "Hello"


def test_completions_text_that_starts_with_the_prefix_is_escaped_so_it_reads_back():
    spelled = completions_token_string(b"bytes:\\x41")
    assert spelled.startswith("bytes:\\x62")
    assert parse_bytes_spelling(spelled) == b"bytes:\\x41"


@given(st.binary(max_size=12))
def test_completions_spelling_reads_back_exactly(data):
    spelled = completions_token_string(data)
    back = parse_bytes_spelling(spelled)
    assert (back if back is not None else spelled.encode()) == data


@given(st.binary(min_size=1, max_size=12), st.binary(min_size=1, max_size=12))
def test_completions_spelling_is_injective(a, b):
    if a != b:
        assert completions_token_string(a) != completions_token_string(b)


def test_token_id_placeholder():
    assert parse_token_id("token_id:1234") == 1234
    assert parse_token_id("token_id:") is None
    assert parse_token_id("hello") is None


def test_openai_escapes_read_back():
    assert unescape_chat_token("\\xf0\\x9f\\x91") == b"\xf0\x9f\x91"
    assert unescape_chat_token(" \\xeb") == b" \xeb"


@pytest.mark.parametrize("token", ["", "\ufffd", " \ufffd", "a\ufffdb"])
def test_lossy_strings(token):
    assert is_lossy_string(token)


@pytest.mark.parametrize("token", ["<|im_end|>", "</s>", "<｜end▁of▁sentence｜>", "<eos>"])
def test_special_spellings(token):
    assert looks_like_special(token)
    assert not looks_like_special("hello")
