"""Tokenizer backends: every token id maps to its exact bytes, on five real tokenizers and the demo one.

The real files live in /work/shared/tokenizers (see its SOURCES.md) and are read in place; tests that
need them skip when that folder is absent. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.vocab import (
    BYTE_LEVEL,
    PLAIN,
    SENTENCEPIECE,
    TIKTOKEN_ENCODINGS,
    HFVocab,
    TiktokenVocab,
    Vocab,
    VocabError,
    load_bpe_files,
    load_directory,
    load_tiktoken,
    load_tokenizer_json,
    load_vocab,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

# Config specs of the five real tokenizers, relative to the shared folder.
SPECS = {
    "qwen2": {"vocab": "qwen2/vocab.json", "merges": "qwen2/merges.txt"},
    "phi-2": {"file": "phi-2/tokenizer.json"},
    "phi-3.5-mini": {"file": "phi-3.5-mini/tokenizer.json"},
    "cl100k_base": {"tiktoken": "openai/cl100k_base.tiktoken"},
    "o200k_base": {"tiktoken": "openai/o200k_base.tiktoken"},
}

TEXTS = [
    "Hello, world!",
    "crab: 🦀",
    "🦀",
    "wave 👋🏽 with a skin tone",
    "根据",
    "根据上下文 answer",
    "café naïve",
    "first line\nsecond line\n\n  indented\tand tabbed\n",
    "Mixed: 日本語, emoji 🎉, accents é, and newlines\r\n",
]


def real(name: str, shared_dir: Path) -> Vocab:
    # load_vocab caches by resolved spec, so each file is loaded once per session.
    return load_vocab(SPECS[name], shared_dir)


def joined(vocab: Vocab, text: str) -> bytes:
    return b"".join(vocab.token_bytes(i) for i in vocab.encode(text))


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def run_python(code: str, **env: str) -> str:
    """Run `code` in a fresh interpreter (fresh caches, env read at import); skip rather than hang."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=90,
            cwd=REPO_ROOT,
            env={**os.environ, **env},
        )
    except subprocess.TimeoutExpired:
        pytest.skip("subprocess did not finish in 90 s (a network call hanging?)")
    assert done.returncode == 0, done.stderr
    return done.stdout


# ----------------------------------------------------------------------------- exact bytes


@pytest.mark.parametrize("name", [n for n in SPECS if n != "phi-3.5-mini"])
@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_join_to_the_exact_utf8_of_the_text(name, text, shared_dir):
    vocab = real(name, shared_dir)
    if name == "qwen2":
        text = unicodedata.normalize("NFC", text)  # Qwen2's normalizer is NFC
    assert joined(vocab, text) == text.encode("utf-8")


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_token_bytes_join_to_a_space_then_the_text(text, shared_dir):
    # The SentencePiece normalizer prepends '▁' to the input; its decoder strips that space again.
    vocab = real("phi-3.5-mini", shared_dir)
    assert joined(vocab, text) == b" " + text.encode("utf-8")


# name -> (text, id of a token in its encoding, that token's bytes); ids from SOURCES.md / verify.py
SPLIT_CHARACTER = {
    "cl100k_base": (" 🦀", 11410, b" \xf0\x9f"),
    "o200k_base": (" 🦀", 9552, b" \xf0\x9f"),
    "qwen2": (" 🦀", 11162, b" \xf0\x9f"),
    "phi-2": ("🦀 根据", 10545, b" \xe6"),
    "phi-3.5-mini": ("🦀", 243, b"\xf0"),
}


@pytest.mark.parametrize("name", SPECS)
def test_a_character_split_across_tokens_gives_a_token_that_is_not_utf8_alone(name, shared_dir):
    vocab = real(name, shared_dir)
    text, token_id, data = SPLIT_CHARACTER[name]
    ids = vocab.encode(text)
    assert token_id in ids
    assert vocab.token_bytes(token_id) == data
    assert not is_utf8(data)
    assert not all(is_utf8(vocab.token_bytes(i)) for i in ids)


def test_sample_sentence_matches_the_reference_ids(shared_dir):
    sample = "Hello, world! 🦀 根据\nnext line"
    assert real("cl100k_base", shared_dir).encode(sample) == [
        9906, 11, 1917, 0, 11410, 99, 222, 52561, 117, 16423, 198, 3684, 1584,
    ]  # fmt: skip
    assert real("qwen2", shared_dir).encode(sample) == [
        9707, 11, 1879, 0, 11162, 99, 222, 51461, 117, 16038, 198, 3600, 1555,
    ]  # fmt: skip
    assert real("phi-3.5-mini", shared_dir).encode(sample) == [
        15043, 29892, 3186, 29991, 29871, 243, 162, 169, 131, 29871, 31393, 30763, 13, 4622, 1196,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "piece", "token_id", "data"),
    [
        ("qwen2", "æĺ¯", None, b"\xe6\x98\xaf"),  # byte-level glyphs of 是
        ("qwen2", "ĠðŁ", 11162, b" \xf0\x9f"),
        ("qwen2", "Ġworld", 1879, b" world"),
        ("qwen2", "Ċ", 198, b"\n"),
        ("qwen2", "<|im_end|>", 151645, b"<|im_end|>"),
        ("phi-2", "Ġworld", 995, b" world"),
        ("phi-2", " " * 8, 50280, b" " * 8),  # added tokens are spelled in raw text
        ("phi-3.5-mini", "<0xF0>", 243, b"\xf0"),
        ("phi-3.5-mini", "▁world", 3186, b" world"),
        ("phi-3.5-mini", "<|end|>", 32007, b"<|end|>"),
        ("cl100k_base", "<|endoftext|>", 100257, b"<|endoftext|>"),
        ("cl100k_base", " world", 1917, b" world"),
    ],
)
def test_id_for_piece_reads_the_raw_vocabulary_spelling(name, piece, token_id, data, shared_dir):
    vocab = real(name, shared_dir)
    found = vocab.id_for_piece(piece)
    assert found is not None
    if token_id is not None:
        assert found == token_id
    assert vocab.token_bytes(found) == data


@pytest.mark.parametrize("name", SPECS)
def test_id_for_piece_is_none_for_a_spelling_not_in_the_vocabulary(name, shared_dir):
    assert real(name, shared_dir).id_for_piece("no such piece \u2603\u2603\u2603") is None


# ----------------------------------------------------------------------------- specials and added tokens


def test_phi2_added_whitespace_tokens_are_raw_spaces_not_glyphs(shared_dir):
    vocab = real("phi-2", shared_dir)
    assert vocab.token_bytes(50280) == b" " * 8
    assert vocab.encode("def f():\n        return 1") == [4299, 277, 33529, 198, 50280, 7783, 352]
    assert not vocab.is_special(50280)
    assert vocab.id_for_bytes(b" " * 8) == 50280
    assert vocab.is_special(50256) and vocab.token_bytes(50256) == b"<|endoftext|>"


def test_qwen2_special_tokens_are_flagged_and_parsed_from_text(shared_dir):
    vocab = real("qwen2", shared_dir)
    assert len(vocab) == 151646
    for token_id, text in [(151643, "<|endoftext|>"), (151644, "<|im_start|>"), (151645, "<|im_end|>")]:
        assert vocab.is_special(token_id)
        assert vocab.token_bytes(token_id) == text.encode()
        assert vocab.id_for_bytes(text.encode()) is None  # only non-special tokens
    assert not vocab.is_special(9707)
    assert vocab.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]


def test_phi35_special_flags_come_from_the_added_tokens(shared_dir):
    vocab = real("phi-3.5-mini", shared_dir)
    assert vocab.is_special(32007) and vocab.token_bytes(32007) == b"<|end|>"
    assert vocab.is_special(1)  # <s>
    assert not vocab.is_special(2)  # tokenizer.json marks </s> special=false
    assert not vocab.is_special(29871)


def test_tiktoken_special_tokens_are_flagged(shared_dir):
    cl100k = real("cl100k_base", shared_dir)
    o200k = real("o200k_base", shared_dir)
    assert cl100k.is_special(100257) and cl100k.is_special(100276)
    assert o200k.is_special(199999) and o200k.is_special(200018)
    assert not cl100k.is_special(15339)
    assert cl100k.encode("a<|endoftext|>") == [64, 100257]


# ----------------------------------------------------------------------------- id_for_bytes, holes


def _plain_tokens(vocab: Vocab, step: int = 1) -> Iterator[tuple[int, bytes]]:
    """(id, bytes) of every `step`-th id that is a token and not a special one."""
    for token_id in range(0, len(vocab), step):
        try:
            data = vocab.token_bytes(token_id)
        except KeyError:
            continue
        if not vocab.is_special(token_id):
            yield token_id, data


@pytest.mark.parametrize("name", SPECS)
def test_id_for_bytes_round_trips_every_sampled_token(name, shared_dir):
    vocab = real(name, shared_dir)
    checked = 0
    for token_id, data in _plain_tokens(vocab, 97):
        found = vocab.id_for_bytes(data)
        assert found is not None and vocab.token_bytes(found) == data
        if name != "phi-3.5-mini":  # no two ids share bytes in these vocabularies
            assert found == token_id
        checked += 1
    assert checked > 300


@pytest.mark.parametrize("name", SPECS)
def test_id_for_bytes_answers_for_every_token_as_a_full_table_would(name, shared_dir):
    # The bytes -> id index is a sorted array searched by bisection (not a dict): check it against a
    # table built here from the vocabulary's own rules, over every id and bytes no token has.
    vocab = real(name, shared_dir)
    rank = {}
    if isinstance(vocab, HFVocab):
        added = set(vocab.tokenizer.get_added_tokens_decoder())
        byte_pieces = {i for piece, i in vocab.tokenizer.get_vocab(with_added_tokens=False).items()
                       if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece)} if vocab.byte_fallback else set()
        rank = {i: 0 for i in added} | {i: 2 for i in byte_pieces}
    expected: dict[bytes, int] = {}
    for token_id, data in _plain_tokens(vocab):
        kept = expected.setdefault(data, token_id)
        if rank.get(token_id, 1) < rank.get(kept, 1):
            expected[data] = token_id
    assert len(expected) > 30_000
    assert all(vocab.id_for_bytes(data) == token_id for data, token_id in expected.items())
    for data in list(expected)[::501]:
        for other in (data + b"\x00\xff\x00", b"\xff\xfe\xfd" + data):
            assert vocab.id_for_bytes(other) == expected.get(other)
    assert vocab.id_for_bytes(b"") is None


def test_sentencepiece_shared_bytes_resolve_to_the_token_the_encoder_emits(shared_dir):
    # '<0x20>' (35) and '▁' (29871) are both a space; the encoder only falls back to bytes.
    vocab = real("phi-3.5-mini", shared_dir)
    assert vocab.token_bytes(35) == vocab.token_bytes(29871) == b" "
    assert vocab.id_for_bytes(b" ") == 29871
    assert vocab.id_for_bytes(b"\xf0") == 243


@pytest.mark.parametrize(
    ("name", "holes"),
    [("cl100k_base", [100256, *range(100261, 100276)]), ("o200k_base", [199998, *range(200000, 200018)])],
)
def test_tiktoken_rank_holes_raise_key_error(name, holes, shared_dir):
    vocab = real(name, shared_dir)
    for token_id in holes:
        with pytest.raises(KeyError):
            vocab.token_bytes(token_id)
        assert not vocab.is_special(token_id)
    assert len(vocab) == max(holes) + 2  # the last id is a special token


@pytest.mark.parametrize("name", SPECS)
def test_ids_outside_the_vocabulary_raise_key_error(name, shared_dir):
    vocab = real(name, shared_dir)
    for token_id in (-1, -len(vocab), len(vocab), 10**12):
        with pytest.raises(KeyError):
            vocab.token_bytes(token_id)


@pytest.mark.parametrize("name", SPECS)
def test_every_backend_satisfies_the_vocab_protocol(name, shared_dir):
    vocab = real(name, shared_dir)
    assert isinstance(vocab, Vocab)
    assert isinstance(vocab, TiktokenVocab if "base" in name else HFVocab)
    assert vocab.name == name


# ----------------------------------------------------------------------------- scheme detection


def test_scheme_is_detected_from_the_tokenizer_json(shared_dir):
    assert real("qwen2", shared_dir).scheme == BYTE_LEVEL
    assert real("phi-2", shared_dir).scheme == BYTE_LEVEL
    phi35 = real("phi-3.5-mini", shared_dir)
    assert phi35.scheme == SENTENCEPIECE and phi35.byte_fallback


def test_plain_scheme_spells_pieces_as_utf8():
    tokenizer = Tokenizer(models.WordLevel({"héllo": 0, "<unk>": 1, "wörld": 2}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    vocab = HFVocab(tokenizer, "plain")
    assert vocab.scheme == PLAIN
    assert vocab.token_bytes(0) == "héllo".encode()
    assert vocab.encode("héllo wörld") == [0, 2]


def test_byte_level_piece_outside_the_alphabet_is_its_utf8_text():
    # HF's ByteLevel decoder does the same for a piece it cannot map glyph by glyph.
    tokenizer = Tokenizer(models.BPE({"a": 0, "日本": 1, "Ġ": 2}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    vocab = HFVocab(tokenizer, "odd")
    assert vocab.scheme == BYTE_LEVEL
    assert vocab.token_bytes(1) == "日本".encode()
    assert vocab.token_bytes(2) == b" "


# ----------------------------------------------------------------------------- loaders


def test_direct_loaders_match_the_config_form(shared_dir):
    qwen2 = load_bpe_files(shared_dir / "qwen2/vocab.json", shared_dir / "qwen2/merges.txt")
    assert qwen2.encode("Hello world") == [9707, 1879] and qwen2.is_special(151645)
    phi2 = load_tokenizer_json(shared_dir / "phi-2/tokenizer.json")
    assert phi2.name == "phi-2" and phi2.encode("hello world") == [31373, 995]
    o200k = load_tiktoken(str(shared_dir / "openai/o200k_base.tiktoken"))
    assert o200k.name == "o200k_base" and o200k.encode("hello world") == [24912, 2375]


def test_bpe_files_without_qwen2_size_get_no_default_special_tokens(shared_dir, tmp_path):
    # Same vocab minus its last entry: not Qwen2's size, so no Qwen2 specials are assumed.
    vocab_json = json.loads((shared_dir / "qwen2/vocab.json").read_bytes())
    last = max(vocab_json, key=vocab_json.__getitem__)
    del vocab_json[last]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab_json), encoding="utf-8")
    merges = [
        line
        for line in (shared_dir / "qwen2/merges.txt").read_text(encoding="utf-8").splitlines()
        if "".join(line.split(" ")) != last
    ]
    (tmp_path / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    vocab = load_bpe_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert len(vocab) == 151642 and not any(vocab.is_special(i) for i in range(151640, 151642))
    explicit = load_bpe_files(tmp_path / "vocab.json", tmp_path / "merges.txt", {"<|eot|>": 151700})
    assert explicit.is_special(151700) and explicit.encode("hi<|eot|>")[-1] == 151700


def test_directory_with_vocab_and_merges_gets_qwen2_specials(shared_dir):
    vocab = load_directory(shared_dir / "qwen2")
    assert vocab.name == "qwen2"
    assert vocab.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]


def test_directory_prefers_tokenizer_json(shared_dir):
    vocab = load_directory(shared_dir / "phi-2")
    assert vocab.scheme == BYTE_LEVEL and vocab.token_bytes(50280) == b" " * 8


def _link(folder: Path, target: Path) -> None:
    # A symlink, so the shared files are read in place rather than copied.
    (folder / target.name).symlink_to(target)


def test_directory_tokenizer_config_adds_tokens_at_their_ids_with_gaps(shared_dir, tmp_path):
    _link(tmp_path, shared_dir / "qwen2/vocab.json")
    _link(tmp_path, shared_dir / "qwen2/merges.txt")
    decoder = {
        "151643": {"content": "<|endoftext|>", "special": True},
        "151644": {"content": "<|im_start|>", "special": True},
        "151645": {"content": "<|im_end|>", "special": True},
        "151657": {"content": "<tool_call>", "special": False, "normalized": False},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    vocab = load_directory(tmp_path)
    assert len(vocab) == 151658
    assert vocab.token_bytes(151657) == b"<tool_call>" and not vocab.is_special(151657)
    assert vocab.id_for_bytes(b"<tool_call>") == 151657
    assert vocab.encode("<tool_call>x<|im_end|>") == [151657, 87, 151645]
    with pytest.raises(KeyError):
        vocab.token_bytes(151650)  # a gap between added tokens


def test_directory_tokenizer_config_marks_extra_special_ids(shared_dir, tmp_path):
    _link(tmp_path, shared_dir / "phi-3.5-mini/tokenizer.json")
    decoder = {
        "2": {"content": "</s>", "special": True},
        "32011": {"content": "<|extra|>", "special": True},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    vocab = load_directory(tmp_path)
    assert vocab.is_special(2)
    assert vocab.is_special(32011) and vocab.token_bytes(32011) == b"<|extra|>"
    assert vocab.encode("<|extra|>") == [32011]


def test_directory_tokenizer_config_that_contradicts_tokenizer_json_is_an_error(shared_dir, tmp_path):
    _link(tmp_path, shared_dir / "phi-2/tokenizer.json")
    decoder = {"50256": {"content": "<|im_end|>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    with pytest.raises(VocabError, match="50256"):
        load_directory(tmp_path)


def test_directory_without_tokenizer_files_is_an_error(tmp_path):
    with pytest.raises(VocabError, match=r"neither tokenizer\.json"):
        load_directory(tmp_path)


def test_tiktoken_file_with_an_unknown_name_needs_a_pattern(shared_dir, tmp_path):
    _link(tmp_path, shared_dir / "openai/cl100k_base.tiktoken")
    custom = tmp_path / "custom.tiktoken"
    custom.symlink_to(shared_dir / "openai/cl100k_base.tiktoken")
    with pytest.raises(VocabError, match="pattern"):
        load_tiktoken(str(custom))
    with pytest.raises(VocabError, match=r"'tiktoken'.*pattern"):
        load_vocab({"tiktoken": "custom.tiktoken"}, tmp_path)
    pattern = TIKTOKEN_ENCODINGS["cl100k_base"][0]
    vocab = load_vocab({"tiktoken": "custom.tiktoken", "pattern": pattern}, tmp_path)
    assert vocab.name == "custom" and vocab.encode("hello world") == [15339, 1917]
    assert len(vocab) == 100256  # no special tokens unless given


def test_malformed_tiktoken_file_names_the_line(tmp_path):
    bad = tmp_path / "cl100k_base.tiktoken"
    bad.write_bytes(b"IQ== 0\nnot*base64 1\n")
    with pytest.raises(VocabError, match=r":2: expected 'base64 rank'"):
        load_tiktoken(str(bad))


def test_tiktoken_name_loads_offline_from_a_prepared_cache(shared_dir, tmp_path, monkeypatch):
    # tiktoken looks for sha1(download URL) in TIKTOKEN_CACHE_DIR before downloading (SOURCES.md).
    (tmp_path / "9b5ad71b2ce5302211f9c61530b329a4922fc6a4").symlink_to(
        shared_dir / "openai/cl100k_base.tiktoken"
    )
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    vocab = load_tiktoken("cl100k_base")
    assert vocab.encode("hello world") == [15339, 1917]
    assert vocab.token_bytes(11410) == b" \xf0\x9f"


def test_tiktoken_name_without_network_or_cache_is_a_clear_error(tmp_path):
    # A proxy on a closed local port makes the download fail at once, network or not.
    out = run_python(
        "from pathlib import Path\n"
        "from gateway.logprobs.vocab import VocabError, load_vocab\n"
        "try:\n"
        "    load_vocab({'tiktoken': 'o200k_base'}, Path('.'))\n"
        "except VocabError as exc:\n"
        "    print(exc)\n",
        TIKTOKEN_CACHE_DIR=str(tmp_path),
        HTTPS_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        NO_PROXY="",
        no_proxy="",
    )
    assert "'tiktoken'" in out and "local rank file" in out and "o200k_base.tiktoken" in out


def test_hf_hub_without_network_is_a_clear_error(tmp_path):
    # HF_HUB_OFFLINE makes huggingface_hub fail at once instead of retrying for ~25 s.
    out = run_python(
        "from pathlib import Path\n"
        "from gateway.logprobs.vocab import VocabError, load_vocab\n"
        "try:\n"
        "    load_vocab({'hf': 'responses-gateway-tests/no-such-repo'}, Path('.'))\n"
        "except VocabError as exc:\n"
        "    print(exc)\n",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path),
    )
    assert "'hf'" in out and "Hugging Face Hub" in out and "network" in out


# ----------------------------------------------------------------------------- load_vocab


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({}, "file"),
        ({"tokenizer": "x.json"}, "tokenizer"),
        ({"file": "missing/tokenizer.json"}, "file"),
        ({"file": 42}, "file"),
        ({"file": "phi-2/tokenizer.json", "tiktoken": "o200k_base"}, "tiktoken"),
        ({"file": "phi-2/tokenizer.json", "merges": "qwen2/merges.txt"}, "merges"),
        ({"vocab": "qwen2/vocab.json"}, "merges"),
        ({"merges": "qwen2/merges.txt"}, "vocab"),
        ({"vocab": "qwen2/vocab.json", "merges": "missing.txt"}, "merges"),
        (
            {"vocab": "qwen2/vocab.json", "merges": "qwen2/merges.txt", "special_tokens": {"<x>": "1"}},
            "special_tokens",
        ),
        ({"directory": "no-such-folder"}, "directory"),
        ({"tiktoken": "openai/missing.tiktoken"}, "tiktoken"),
        ({"tiktoken": "no_such_encoding"}, "tiktoken"),
        ({"hf": ""}, "hf"),
    ],
)
def test_load_vocab_errors_name_the_key(spec, key, shared_dir):
    with pytest.raises(VocabError, match=f"'{key}'"):
        load_vocab(spec, shared_dir)


def test_load_vocab_rejects_a_non_mapping_spec(shared_dir):
    with pytest.raises(VocabError, match="mapping"):
        load_vocab("phi-2/tokenizer.json", shared_dir)  # type: ignore[arg-type]


def test_load_vocab_loads_a_shared_tokenizer_once(shared_dir, tmp_path):
    relative = load_vocab({"file": "phi-2/tokenizer.json"}, shared_dir)
    absolute = load_vocab({"file": str(shared_dir / "phi-2" / "tokenizer.json")}, tmp_path)
    dotted = load_vocab({"file": "openai/../phi-2/tokenizer.json"}, shared_dir)
    assert relative is absolute is dotted
    assert load_vocab({"directory": "phi-2"}, shared_dir) is load_vocab({"directory": "./phi-2/"}, shared_dir)


# ----------------------------------------------------------------------------- property


# phi-3.5 is left out of the byte-exact property: '▁' in the input comes back as a space (SentencePiece).
@pytest.mark.parametrize("name", ["qwen2", "phi-2", "cl100k_base", "o200k_base"])
@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80))
def test_random_text_round_trips_through_token_bytes(name, text, shared_dir):
    vocab = real(name, shared_dir)
    if name == "qwen2":
        text = unicodedata.normalize("NFC", text)
    assert joined(vocab, text) == text.encode("utf-8")


@settings(max_examples=150, deadline=None)
@given(text=st.text(min_size=1, max_size=80))
def test_random_text_round_trips_through_sentencepiece_with_its_leading_space(text, shared_dir):
    assume("\u2581" not in text)
    vocab = real("phi-3.5-mini", shared_dir)
    assert joined(vocab, text) == b" " + text.encode("utf-8")


# ----------------------------------------------------------------------------- demo vocabulary


def test_demo_vocab_splits_cjk_and_emoji_into_single_bytes():
    vocab = build_demo_vocab()
    ids = vocab.encode("根据")
    assert len(ids) >= 6
    assert [vocab.token_bytes(i) for i in ids] == [bytes([b]) for b in "根据".encode()]
    crab = vocab.encode("🦀")
    assert len(crab) == 4 and not any(is_utf8(vocab.token_bytes(i)) for i in crab)


def test_demo_vocab_shape():
    vocab = build_demo_vocab()
    assert isinstance(vocab, Vocab) and isinstance(vocab.tokenizer, Tokenizer)
    assert vocab.scheme == BYTE_LEVEL
    assert 1000 <= len(vocab) <= 2000
    assert [vocab.token_bytes(i) for i in range(3)] == [b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>"]
    assert all(vocab.is_special(i) for i in range(3)) and not vocab.is_special(3)
    text = "<|im_start|>user\nHello, world! 🦀 根据 café<|im_end|>"
    assert joined(vocab, text) == text.encode()
    assert len(vocab.encode("The model said hello.")) < len("The model said hello.")  # it did learn merges


_DEMO_FINGERPRINT = (
    "import hashlib, json\n"
    "from gateway.logprobs.demo_vocab import build_demo_vocab\n"
    "v = build_demo_vocab()\n"
    "print(json.dumps([hashlib.sha256(v.tokenizer.to_str().encode()).hexdigest(),"
    " v.encode('The lighthouse keeper said: def add(a, b) 🦀')]))\n"
)


def test_demo_vocab_is_deterministic_across_processes():
    vocab = build_demo_vocab()
    assert build_demo_vocab() is vocab  # built once per process
    here = run_python(_DEMO_FINGERPRINT, PYTHONHASHSEED="1")
    there = run_python(_DEMO_FINGERPRINT, PYTHONHASHSEED="2")
    assert here == there
    digest = hashlib.sha256(vocab.tokenizer.to_str().encode()).hexdigest()
    assert json.loads(here) == [digest, vocab.encode("The lighthouse keeper said: def add(a, b) 🦀")]
