"""Shared pytest fixtures."""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.vocab import Vocab
from gateway.simulator.testing import shared_bpe_vocab

# No timed assertions: Hypothesis' per-example deadline (200 ms) fails property tests on a loaded machine
# (the suite shares two cores with other jobs), which says nothing about the code under test.
settings.register_profile("gateway", deadline=None)
settings.load_profile("gateway")

# Real tokenizer files kept outside the repo (/work/shared/tokenizers), read in place, never copied.
SHARED_TOKENIZERS = Path(__file__).resolve().parents[2] / "shared" / "tokenizers"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared tokenizer folder; tests that use it skip when it is absent."""
    if not SHARED_TOKENIZERS.is_dir():
        pytest.skip(f"shared tokenizer files not found at {SHARED_TOKENIZERS}")
    return SHARED_TOKENIZERS


# --- simulator tests ---------------------------------------------------------------------------------
# A simulator's test module names what it tests with module globals: `create_app` (the dialect's
# factory), `MODEL` (the served model name) and, when the Qwen2 server's name differs, `QWEN2_MODEL`.


@pytest.fixture(scope="module")
def demo_vocab() -> Vocab:
    """The project's small demo BPE, built once per test module."""
    return build_demo_vocab()


@pytest.fixture(scope="module")
def qwen2_vocab(shared_dir: Path) -> Vocab:
    """Qwen2's real byte-level BPE from the shared tokenizer folder."""
    return shared_bpe_vocab(shared_dir / "qwen2" / "vocab.json", shared_dir / "qwen2" / "merges.txt")


@pytest.fixture
def make_client(
    request: pytest.FixtureRequest, aiohttp_client: Any, demo_vocab: Vocab
) -> Callable[..., Awaitable[Any]]:
    """`await make_client(vocab=None, model=None, **options)`: a test client of the module's simulator,
    `create_app(vocab or the demo vocabulary, model or MODEL, **options)`."""
    module = request.module

    async def make(vocab: Vocab | None = None, model: str | None = None, **options: Any) -> Any:
        return await aiohttp_client(module.create_app(vocab or demo_vocab, model or module.MODEL, **options))

    return make


@pytest.fixture
async def client(make_client: Callable[..., Awaitable[Any]]) -> Any:
    """The module's simulator serving MODEL with the demo vocabulary."""
    return await make_client()


@pytest.fixture
async def qwen_client(
    request: pytest.FixtureRequest, make_client: Callable[..., Awaitable[Any]], qwen2_vocab: Vocab
) -> Any:
    """The module's simulator with Qwen2's vocabulary, serving QWEN2_MODEL (default: MODEL)."""
    module = request.module
    return await make_client(qwen2_vocab, getattr(module, "QWEN2_MODEL", module.MODEL))
