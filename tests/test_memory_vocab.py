"""Memory-saving start-up paths behave exactly like the tables and checks they replace.

An HF vocabulary loaded from files lets its `tokenizers.Tokenizer` go once its tables are built and
reloads it on first need (routes that encode per request keep it from the start), builds its piece
-> id table on the first `id_for_piece`, and reads the BPE scheme from the pipeline components
rather than from `json.loads(tokenizer.to_str())`; the server imports neither the response models
nor Jinja or tiktoken when no route needs them; and `serve` hands the memory freed by loading back
to the OS (glibc `malloc_trim`). Nothing here measures memory.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from gateway import cli
from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.vocab import (
    HFVocab,
    VocabError,
    _bpe_tokenizer,
    _detect_scheme,
    _pipeline_config,
    load_bpe_files,
    load_directory,
    load_tokenizer_json,
)
from gateway.routing import build_routes

REPO_ROOT = Path(__file__).resolve().parents[1]

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


# ----------------------------------------------------------------------------- tokenizer let go after loading

TEXTS = [
    "Hello, world!",
    "crab: 🦀 and 根据上下文 answer",
    "café naïve\nsecond line\n\n  indented\tand tabbed\r\n",
    "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
    "   leading and trailing spaces   ",
]


def _reference(name: str, shared_dir: Path) -> Tokenizer:
    """A Tokenizer loaded afresh from the same files, outside any vocabulary."""
    if name == "qwen2":
        return _bpe_tokenizer(shared_dir / "qwen2/vocab.json", shared_dir / "qwen2/merges.txt", None)
    return Tokenizer.from_file(str(shared_dir / name / "tokenizer.json"))


@pytest.mark.parametrize("name", ["qwen2", "phi-2", "phi-3.5-mini"])
def test_file_loaded_vocab_lets_the_tokenizer_go_and_reloads_it_with_the_same_answers(name, shared_dir):
    vocab = _fresh(name, shared_dir)
    assert not vocab.tokenizer_loaded  # released once the tables were built
    reference = _reference(name, shared_dir)
    for text in TEXTS:
        assert vocab.encode(text) == reference.encode(text, add_special_tokens=False).ids, text
    assert vocab.tokenizer_loaded  # reloaded by the first encode, then kept
    pieces = _eager_pieces(reference)
    assert all(vocab.id_for_piece(piece) == token_id for piece, token_id in pieces.items())
    assert vocab.id_for_piece("no such piece \u2603\u2603\u2603") is None


def test_piece_lookup_alone_reloads_the_tokenizer(shared_dir):
    vocab = _fresh("phi-2", shared_dir)
    assert not vocab.tokenizer_loaded
    assert vocab.id_for_piece("\u0120hello") == _reference("phi-2", shared_dir).token_to_id("\u0120hello")
    assert vocab.tokenizer_loaded


def test_directory_vocab_reloads_with_the_config_tokens_added(shared_dir, tmp_path):
    (tmp_path / "tokenizer.json").symlink_to(shared_dir / "phi-2/tokenizer.json")
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    next_id = reference.get_vocab_size(with_added_tokens=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {
        str(next_id): {"content": "<|tool|>", "special": True},
    }}))
    vocab = load_directory(tmp_path)
    assert not vocab.tokenizer_loaded
    assert vocab.is_special(next_id) and vocab.token_bytes(next_id) == b"<|tool|>"
    assert next_id in vocab.encode("call<|tool|>now")  # the reload added the token again
    assert vocab.id_for_piece("<|tool|>") == next_id


def test_a_reload_from_files_that_changed_or_vanished_fails_clearly(shared_dir, tmp_path):
    (tmp_path / "tokenizer.json").symlink_to(shared_dir / "phi-2/tokenizer.json")
    vocab = load_tokenizer_json(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(VocabError, match=r"tokenizer\.json not found"):
        vocab.encode("hi")
    (tmp_path / "tokenizer.json").symlink_to(shared_dir / "phi-3.5-mini/tokenizer.json")
    with pytest.raises(VocabError, match="changed since they were loaded"):
        vocab.encode("hi")
    assert not vocab.tokenizer_loaded


def test_a_vocab_without_a_loader_keeps_its_tokenizer():
    tokenizer = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    vocab = HFVocab(tokenizer, "tiny")
    assert vocab.tokenizer_loaded and vocab.tokenizer is tokenizer
    assert vocab.encode("ab") == [2]
    assert build_demo_vocab().tokenizer_loaded  # trained in memory: nothing to reload it from


def test_concurrent_first_uses_reload_the_tokenizer_once():
    def make() -> Tokenizer:
        return Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))

    calls: list[int] = []

    def slow_loader() -> Tokenizer:
        calls.append(1)
        time.sleep(0.05)  # wide enough for every thread to find the tokenizer missing
        return make()

    vocab = HFVocab(make(), "tiny", loader=slow_loader)
    assert not vocab.tokenizer_loaded
    barrier = threading.Barrier(8)
    results: list[list[int]] = []

    def use() -> None:
        barrier.wait()
        results.append(vocab.encode("abab"))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1] and results == [[2, 2]] * 8


def test_require_encoder_loads_now_and_later_uses_never_reload():
    calls: list[int] = []

    def loader() -> Tokenizer:
        calls.append(1)
        return Tokenizer(models.BPE({"a": 0}, []))

    vocab = HFVocab(Tokenizer(models.BPE({"a": 0}, [])), "tiny", loader=loader)
    assert vocab.require_encoder() is vocab and vocab.tokenizer_loaded and calls == [1]
    vocab.encode("a")
    vocab.id_for_piece("a")
    assert calls == [1]


def test_only_routes_that_encode_per_request_hold_their_tokenizer(shared_dir, tmp_path):
    # Own copies (symlinks) per route: load_vocab caches by path, and a shared vocabulary is one object.
    for name in ("generate", "chat", "sglang"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").symlink_to(shared_dir / "phi-2/tokenizer.json")
    config = parse_config({
        "upstreams": {
            "tgi-native": {"urls": ["http://127.0.0.1:1"], "dialect": "tgi", "api": "generate"},
            "tgi-chat": {"urls": ["http://127.0.0.1:1"], "dialect": "tgi", "api": "chat"},
            "sglang-native": {"urls": ["http://127.0.0.1:1"], "dialect": "sglang", "api": "generate"},
        },
        "models": {
            "a": {"upstream": "tgi-native", "tokenizer": {"file": "generate/tokenizer.json"}},
            "b": {"upstream": "tgi-chat", "tokenizer": {"file": "chat/tokenizer.json"}},
            "c": {"upstream": "sglang-native", "tokenizer": {"file": "sglang/tokenizer.json"}},
        },
    }, tmp_path)
    routes = build_routes(config)
    assert routes["a"].vocab.tokenizer_loaded  # TGI's /generate: the gateway counts prompt tokens
    assert not routes["b"].vocab.tokenizer_loaded
    assert not routes["c"].vocab.tokenizer_loaded


# ----------------------------------------------------------------------------- what the server imports


def test_the_server_does_not_import_what_a_typical_config_never_uses():
    # cryptography: only compaction items use it (~7 MB of RSS per worker for its Rust bindings).
    code = (
        "import sys, gateway.app, gateway.cli\n"
        "print(sorted(m for m in sys.modules if m in ('schemas.responses', 'jinja2', 'tiktoken', 'cryptography')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_split_response_schemas_are_the_same_classes_under_both_names():
    import schemas.responses
    import schemas.responses_common
    import schemas.responses_request

    for name in ("OutputText", "LogProb", "TopLogProb", "FunctionTool", "TextConfig", "TextFormatJsonSchema"):
        assert getattr(schemas.responses, name) is getattr(schemas.responses_common, name)
    assert schemas.responses_request.TextConfig is schemas.responses.TextConfig


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
