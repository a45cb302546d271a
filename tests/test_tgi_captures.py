"""Real TGI responses (../shared/captures, read in place) through the TGI parser."""

import json
from pathlib import Path

import pytest

from gateway.logprobs.parse import ParseOptions, parse_chat
from gateway.logprobs.render import visible_tokens
from gateway.logprobs.tokens import Origin
from gateway.upstreams.tgi import parse_generate_details

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures"
needs_captures = pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"TGI captures not found at {CAPTURES}")


def _captures(pattern: str) -> list[Path]:
    return sorted(CAPTURES.glob(pattern)) if CAPTURES.is_dir() else []


@needs_captures
@pytest.mark.parametrize("path", _captures("tgi-generate-*.json"), ids=lambda p: p.stem)
def test_generate_capture_bytes_spell_the_text_once_special_tokens_are_set_aside(path):
    body = json.loads(path.read_text())
    text, parsed = parse_generate_details(body, ParseOptions())
    visible = visible_tokens(parsed.tokens)
    assert b"".join(t.bytes for t in visible) == text.encode()
    assert len(parsed.tokens) == len(body["details"]["tokens"])
    assert all(t.logprob is not None and t.logprob <= 0 for t in parsed.tokens)
    assert parsed.report.ambiguous_positions == []
    specials = [t for t in parsed.tokens if t.special]
    assert len(specials) == sum(1 for t in body["details"]["tokens"] if t["special"])


@needs_captures
def test_full_text_capture_splits_off_the_echoed_prompt():
    body = json.loads((CAPTURES / "tgi-generate-deepseekv2lite-1.json").read_text())
    text, _ = parse_generate_details(body, ParseOptions())
    assert body["generated_text"] == "Test request sent successfully."
    assert text == " sent successfully."


@needs_captures
def test_seq2seq_capture_first_token_loses_the_space_its_decoder_strips():
    body = json.loads((CAPTURES / "tgi-generate-mt0base-1.json").read_text())
    text, parsed = parse_generate_details(body, ParseOptions())
    assert text == "To sell things."
    assert parsed.tokens[0].bytes == b"To" and parsed.tokens[1].bytes == b" sell"


@needs_captures
def test_multibyte_single_tokens_are_text_not_guesses():
    body = json.loads((CAPTURES / "tgi-generate-mistral7b-1.json").read_text())
    _, parsed = parse_generate_details(body, ParseOptions())
    quote = [t for t in parsed.tokens if "’".encode() in t.bytes]
    assert quote and all(t.origin is Origin.TEXT for t in quote)


@needs_captures
@pytest.mark.parametrize("path", _captures("tgi-c*.json"), ids=lambda p: p.stem)
def test_openai_route_captures_carry_no_logprobs(path):
    body = json.loads(path.read_text())
    chunks = body if isinstance(body, list) else [body]
    for chunk in chunks:
        for choice in chunk["choices"]:
            # TGI's /v1/completions never sends logprobs; its chat sends them only when asked.
            assert choice["logprobs"] is None
            assert parse_chat(None, ParseOptions()).tokens == []
