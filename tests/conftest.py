"""Shared pytest fixtures."""

from pathlib import Path

import pytest

# Real tokenizer files kept outside the repo (/work/shared/tokenizers), read in place, never copied.
SHARED_TOKENIZERS = Path(__file__).resolve().parents[2] / "shared" / "tokenizers"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared tokenizer folder; tests that use it skip when it is absent."""
    if not SHARED_TOKENIZERS.is_dir():
        pytest.skip(f"shared tokenizer files not found at {SHARED_TOKENIZERS}")
    return SHARED_TOKENIZERS
