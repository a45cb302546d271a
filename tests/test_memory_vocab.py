"""Memory-saving start-up paths behave exactly like the tables and checks they replace.

An HF vocabulary builds its piece -> id table on the first `id_for_piece`, the BPE scheme is read
from the pipeline components rather than from `json.loads(tokenizer.to_str())`, and `serve` hands
the memory freed by loading back to the OS (glibc `malloc_trim`). Nothing here measures memory.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from gateway import cli
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.vocab import (
    HFVocab,
    _detect_scheme,
    _pipeline_config,
    load_bpe_files,
    load_tokenizer_json,
)

# ----------------------------------------------------------------------------- lazy piece table


def _eager_pieces(tokenizer: Tokenizer) -> dict[str, int]:
    """The piece table as HFVocab used to build and keep at load time."""
    pieces = tokenizer.get_vocab(with_added_tokens=False)
    for token_id, token in tokenizer.get_added_tokens_decoder().items():
        pieces[token.content] = token_id
    return pieces


def _fresh(name: str, shared_dir: Path) -> HFVocab:
    # Direct loaders, not load_vocab: its cache may hold a vocabulary whose table is already built.
    if name == "qwen2":
        return load_bpe_files(shared_dir / "qwen2/vocab.json", shared_dir / "qwen2/merges.txt")
    return load_tokenizer_json(shared_dir / name / "tokenizer.json")


@pytest.mark.parametrize("name", ["qwen2", "phi-2", "phi-3.5-mini"])
def test_piece_table_is_built_on_first_lookup_and_answers_as_the_eager_one(name, shared_dir):
    vocab = _fresh(name, shared_dir)
    assert vocab._pieces is None  # nothing held until a route reads raw pieces
    eager = _eager_pieces(vocab.tokenizer)
    assert vocab.id_for_piece("no such piece \u2603\u2603\u2603") is None
    assert vocab._pieces == eager
    assert all(vocab.id_for_piece(piece) == token_id for piece, token_id in eager.items())


def test_lazy_piece_table_covers_added_tokens_and_the_demo_vocabulary():
    demo = build_demo_vocab()
    assert demo.id_for_piece("<|im_end|>") is not None and demo.is_special(demo.id_for_piece("<|im_end|>"))
    assert demo._pieces == _eager_pieces(demo.tokenizer)

    # An added token that repeats a model piece keeps the model's id, as before.
    tokenizer = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    tokenizer.add_tokens([AddedToken("ab", special=False), AddedToken("<x>", special=True)])
    vocab = HFVocab(tokenizer, "tiny")
    assert (vocab.id_for_piece("ab"), vocab.id_for_piece("<x>"), vocab.id_for_piece("c")) == (2, 3, None)
    assert vocab._pieces == _eager_pieces(tokenizer)


# ----------------------------------------------------------------------------- scheme detection


def _bpe(byte_fallback: bool = False) -> Tokenizer:
    return Tokenizer(models.BPE({"a": 0, "<0x41>": 1}, [], byte_fallback=byte_fallback))


def _with(tokenizer: Tokenizer, *, normalizer=None, pre_tokenizer=None, decoder=None) -> Tokenizer:
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    if pre_tokenizer is not None:
        tokenizer.pre_tokenizer = pre_tokenizer
    if decoder is not None:
        tokenizer.decoder = decoder
    return tokenizer


SYNTHETIC = {
    "bare BPE": lambda: _bpe(),
    "byte-level decoder only": lambda: _with(_bpe(), decoder=decoders.ByteLevel()),
    "byte-level inside a sequence": lambda: _with(_bpe(), pre_tokenizer=pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated"), pre_tokenizers.ByteLevel(use_regex=False)])),
    "BPE byte fallback": lambda: _with(_bpe(byte_fallback=True), decoder=decoders.ByteFallback()),
    "Metaspace": lambda: _with(_bpe(), pre_tokenizer=pre_tokenizers.Metaspace(), decoder=decoders.Metaspace()),
    "Llama-2 Replace": lambda: _with(
        _bpe(), normalizer=normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]),
        decoder=decoders.Sequence([decoders.Replace("\u2581", " "), decoders.Fuse()])),
    "Unigram byte fallback": lambda: Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0, byte_fallback=True)),
    "Unigram": lambda: Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0)),
    "WordLevel": lambda: _with(Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")),
                               pre_tokenizer=pre_tokenizers.WhitespaceSplit()),
    "WordPiece": lambda: Tokenizer(models.WordPiece({"a": 0, "[UNK]": 1}, unk_token="[UNK]")),
}


def _assert_same_as_full_document(tokenizer: Tokenizer) -> None:
    full = json.loads(tokenizer.to_str())
    part = _pipeline_config(tokenizer)
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        assert part[key] == full.get(key), key
    assert part["model"]["byte_fallback"] == bool(full["model"].get("byte_fallback"))
    assert _detect_scheme(part) == _detect_scheme(full)


@pytest.mark.parametrize("name", SYNTHETIC)
def test_pipeline_config_detects_the_scheme_the_whole_document_does(name):
    _assert_same_as_full_document(SYNTHETIC[name]())


def test_pipeline_config_of_the_real_tokenizers_matches_their_documents(shared_dir):
    for name in ("qwen2", "phi-2", "phi-3.5-mini"):
        _assert_same_as_full_document(_fresh(name, shared_dir).tokenizer)
    _assert_same_as_full_document(build_demo_vocab().tokenizer)


# ----------------------------------------------------------------------------- malloc_trim at start-up


def _glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):
        return False


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
def test_release_free_memory_calls_malloc_trim_on_glibc():
    assert cli.release_free_memory() is True


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_release_free_memory_is_skipped_off_linux(monkeypatch, platform):
    monkeypatch.setattr(cli.sys, "platform", platform)
    assert cli.release_free_memory() is False


def test_release_free_memory_is_skipped_on_a_linux_without_glibc(monkeypatch):
    import ctypes

    def no_gnu_confstr(name):  # musl: the name is unknown
        raise ValueError("unrecognized configuration name")

    def no_libc(*args, **kwargs):
        raise OSError("libc.so.6: cannot open shared object file")

    monkeypatch.setattr(cli.sys, "platform", "linux")
    monkeypatch.setattr(cli.os, "confstr", no_gnu_confstr)
    assert cli.release_free_memory() is False
    monkeypatch.setattr(cli.os, "confstr", lambda name: None)
    assert cli.release_free_memory() is False
    monkeypatch.setattr(cli.os, "confstr", lambda name: "glibc 2.36")
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert cli.release_free_memory() is False


def test_serve_trims_once_start_up_is_loaded_and_before_serving(monkeypatch, tmp_path):
    import gateway.server

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({  # JSON is YAML
        "upstreams": {"sim": {"urls": ["http://127.0.0.1:9"], "health_interval": 0}},
        "models": {"demo-model": {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
        "store": {"backend": "memory"},
    }))
    events: list[str] = []

    async def fake_serve(app, host, port, grace):
        events.append("serve")

    real_freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (events.append("freeze"), real_freeze())[1])
    monkeypatch.setattr(cli, "release_free_memory", lambda: events.append("trim") or True)
    monkeypatch.setattr(gateway.server, "serve", fake_serve)
    monkeypatch.setattr(gateway.server, "configure_logging", lambda level: None)
    try:
        assert cli.main(["serve", "--config", str(config)]) == 0
    finally:
        gc.unfreeze()
    assert events == ["freeze", "trim", "serve"]
