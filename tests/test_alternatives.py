"""Alternatives whose bytes a lossy upstream hides: the sampled token is recognised among them, the
rest are left out, never given made-up bytes (the issue measured `[32, 239, 191, 189]`, the bytes of
" �", for an alternative that is not that token), and a completions dict never lists a token twice."""

import pytest

from gateway.logprobs.parse import ParseOptions, parse_chat
from gateway.logprobs.render import render_chat, render_completions
from gateway.logprobs.tokens import Origin
from gateway.logprobs.vocab import load_bpe_files

# TGI chat / SGLang chat shape: the lead token of " 根" is "" (TGI) and its completing token spells the
# whole character; alternatives are decoded one by one, so a partial one is "\ufffd".
CONTENT = [
    {"token": "Hi", "logprob": -0.1,
     "top_logprobs": [{"token": "Hi", "logprob": -0.1}, {"token": "Ho", "logprob": -2.0}]},
    {"token": "", "logprob": -0.2,
     "top_logprobs": [{"token": "", "logprob": -0.2}, {"token": " \ufffd", "logprob": -1.5},
                      {"token": " a", "logprob": -3.0}]},
    {"token": " 根", "logprob": -0.3, "top_logprobs": [{"token": "\ufffd", "logprob": -2.0},
                                                      {"token": " 根", "logprob": -0.3}]},
]


@pytest.fixture(scope="module")
def qwen2(shared_dir):
    return load_bpe_files(shared_dir / "qwen2" / "vocab.json", shared_dir / "qwen2" / "merges.txt")


def test_the_sampled_token_among_lossy_alternatives_takes_its_aligned_bytes(qwen2):
    tokens = parse_chat(CONTENT, ParseOptions(vocab=qwen2), text="Hi 根").tokens
    assert [t.bytes for t in tokens] == [b"Hi", b" \xe6\xa0", b"\xb9"]
    assert [[(c.bytes, c.logprob) for c in t.top] for t in tokens] == [
        [(b"Hi", -0.1), (b"Ho", -2.0)],
        [(b" \xe6\xa0", -0.2), (b" a", -3.0)],  # " \ufffd" is some token starting with a space: unknown, left out
        [(b"\xb9", -0.3)],
    ]


def test_no_rendered_alternative_carries_the_bytes_of_u_fffd(qwen2):
    tokens = parse_chat(CONTENT, ParseOptions(vocab=qwen2), text="Hi 根").tokens
    for entry in render_chat(tokens, 5):
        assert all(b"\xef\xbf\xbd" not in bytes(alt["bytes"]) for alt in entry["top_logprobs"])


def test_without_a_tokenizer_the_unknown_alternatives_are_still_left_out():
    tokens = parse_chat(CONTENT, ParseOptions(), text="Hi 根").tokens
    for token in tokens:
        assert all(c.origin is not Origin.AMBIGUOUS or c.bytes == token.bytes for c in token.top)
        assert sum(c.logprob == token.logprob for c in token.top) == 1


def test_a_completions_dict_never_lists_the_sampled_token_twice(qwen2):
    tokens = parse_chat(CONTENT, ParseOptions(vocab=qwen2), text="Hi 根").tokens
    for token, top in zip(tokens, render_completions(tokens, 5)["top_logprobs"], strict=True):
        assert list(top.values()).count(token.logprob) == 1
        assert list(top.values()) == sorted(top.values(), reverse=True)


def test_streamed_chunks_settle_the_alternatives_when_the_text_arrives(qwen2):
    from gateway.translate.grouping import TextGrouper

    grouper = TextGrouper(qwen2)
    groups = []
    for item, text in zip(CONTENT, ["Hi", "", " 根"], strict=True):
        groups += grouper.feed(parse_chat([item], ParseOptions(vocab=qwen2)).tokens, text)
    tokens = [t for _, group in groups for t in group]
    assert [t.bytes for t in tokens] == [b"Hi", b" \xe6\xa0", b"\xb9"]
    assert [[c.bytes for c in t.top] for t in tokens] == [[b"Hi", b"Ho"], [b" \xe6\xa0", b" a"], [b"\xb9"]]
