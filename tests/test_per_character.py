"""Without a tokenizer the split of a character's bytes across its tokens is unknowable: the gateway
spells it per character, as vLLM does itself (the lead tokens b"", the completing token the whole
character), counts it, and says so at start-up and in check-config. Against real vLLM the old guess
(shortest fragment) put the split 1+2 where the truth was 2+1 in 192 of 192 responses (issue 20)."""

import json
import logging
from pathlib import Path

import aiohttp
import pytest

from gateway.app import create_app
from gateway.check_config import run_checks
from gateway.config import parse_config
from gateway.simulator.testing import shared_bpe_vocab
from tests.e2e import start_stack

QWEN2 = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "qwen2"
REPLY = "Hi 根据 👋"


@pytest.mark.skipif(not QWEN2.is_dir(), reason=f"Qwen2 tokenizer files not found at {QWEN2}")
@pytest.mark.parametrize("stream", [False, True])
async def test_a_split_character_without_a_tokenizer_is_spelled_per_character(aiohttp_server, stream):
    vocab = shared_bpe_vocab(QWEN2 / "vocab.json", QWEN2 / "merges.txt")
    stack = await start_stack(aiohttp_server, vocab, model="qwen", tokenizer={}, replies={"hello": REPLY})
    body = {"model": "qwen", "input": "hello", "stream": stream, "include": ["message.output_text.logprobs"]}
    async with aiohttp.ClientSession() as session:
        async with session.post(stack.url("/v1/responses"), json=body) as reply:
            raw = await reply.text()
            assert reply.status == 200, raw
        async with session.get(stack.url("/metrics")) as reply:
            metrics = await reply.text()
    if stream:
        payload = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")][-1]["response"]
    else:
        payload = json.loads(raw)
    part = payload["output"][0]["content"][0]
    assert part["text"] == REPLY
    # Qwen2: "Hi", b" \xe6\xa0" + b"\xb9" (" 根"), "据", b" \xf0\x9f\x91" + b"\x8b" (" 👋").
    assert [bytes(e["bytes"]) for e in part["logprobs"]] == [b"Hi", b"", " 根".encode(), "据".encode(), b"",
                                                              " 👋".encode()]
    counted = [line for line in metrics.splitlines() if line.startswith("gateway_logprob_per_character_tokens_total")]
    # Streamed, a chunk's empty entry is counted before the stream shows whether it was a lead or EOS.
    series = 'gateway_logprob_per_character_tokens_total{model="qwen",upstream="sim"}'
    assert counted == [f"{series} {3.0 if stream else 2.0}"]


def _config(tmp_path: Path, tokenizer: bool) -> Path:
    model: dict = {"upstream": "v"}
    if tokenizer:
        model["tokenizer"] = {"builtin": "demo"}
    config = {"upstreams": {"v": {"urls": ["http://127.0.0.1:9"], "dialect": "vllm"},
                            "l": {"urls": ["http://127.0.0.1:9"], "dialect": "llamacpp"}},
              "models": {"m": model, "small": {"upstream": "l"}}, "store": {"backend": "memory"}}
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("tokenizer", [False, True])
def test_check_config_says_which_routes_bytes_are_per_character(tmp_path, tokenizer):
    rows, _ = run_checks(_config(tmp_path, tokenizer), timeout=0.5)
    notes = {row.subject: row.detail for row in rows if row.check == "logprob bytes"}
    assert notes["model small"].startswith("WARNING per character: llama.cpp")
    if tokenizer:
        assert notes["model m"] == "exact bytes from token ids"
    else:
        assert notes["model m"].startswith("WARNING per character (no tokenizer)")
    assert not any("lossy strings repaired" in row.detail or "exact bytes from ids" in row.detail for row in rows)


def test_start_up_warns_of_per_character_routes(tmp_path, caplog):
    config = parse_config(json.loads(_config(tmp_path, False).read_text()), base_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="responses_gateway"):
        create_app(config)
    warned = [json.loads(r.getMessage()) for r in caplog.records if "per_character" in r.getMessage()]
    assert {w["model"] for w in warned} == {"m", "small"}
