"""Bytes that are not UTF-8 and characters cut by a cap, end to end through the vLLM simulator with
Qwen2's real tokenizer (tokens like b" \\xf0\\x9f\\x91" hold a whole character and the start of the next).

The invariant for invalid bytes: the replace-decoding of the tokens' joined bytes is the text, which
has U+FFFD where the upstream wrote it; a valid character is never changed and a response is never a
502 because of them."""

import json
from pathlib import Path

import aiohttp
import pytest

from gateway.simulator.testing import shared_bpe_vocab
from tests.e2e import assert_bytes_spell, start_stack

QWEN2 = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "qwen2"
pytestmark = pytest.mark.skipif(not QWEN2.is_dir(), reason=f"Qwen2 tokenizer files not found at {QWEN2}")
TOKENIZER = {"vocab": str(QWEN2 / "vocab.json"), "merges": str(QWEN2 / "merges.txt")}
# Qwen2 ids: "Hi", 稏 as e7 a8 + 8f, then e7 a8 again, never completed, then 疤 as e7 96 + a4. The issue's
# measurement: the stream showed `稏���` for `稏�疤` and every non-streamed answer was a 502.
INVALID_IDS = [13048, 23687, 237, 23687, 99156, 97]
INVALID_TEXT = "Hi稏\ufffd疤"
SPLIT_REPLY = "Hi there 👋 根据 the plan 🦀."


@pytest.fixture(scope="module")
def qwen2():
    return shared_bpe_vocab(QWEN2 / "vocab.json", QWEN2 / "merges.txt")


async def _post(stack, path, body):
    async with aiohttp.ClientSession() as session, session.post(stack.url(path), json=body) as reply:
        raw = await reply.text()
        return reply.status, raw


def _frames(raw):
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]


def test_the_ids_spell_the_issues_text(qwen2):
    assert qwen2.token_bytes(INVALID_IDS[0]) == b"Hi"
    assert b"".join(map(qwen2.token_bytes, INVALID_IDS)).decode("utf-8", errors="replace") == INVALID_TEXT


async def test_the_simulator_writes_u_fffd_for_invalid_bytes_as_vllm_does(aiohttp_server, qwen2):
    stack = await start_stack(aiohttp_server, qwen2, model="qwen", tokenizer=TOKENIZER,
                              replies={"hello": {"token_ids": INVALID_IDS}})
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hello"}], "logprobs": True}
    async with aiohttp.ClientSession() as session:
        upstream = str(stack.simulator.make_url("/v1/chat/completions"))
        async with session.post(upstream, json=body) as reply:
            assert (await reply.json())["choices"][0]["message"]["content"] == INVALID_TEXT


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("k", [0, 3])
async def test_invalid_bytes_mid_text_are_u_fffd_and_the_next_character_survives(aiohttp_server, qwen2, stream, k):
    stack = await start_stack(aiohttp_server, qwen2, model="qwen", tokenizer=TOKENIZER,
                              replies={"hello": {"token_ids": INVALID_IDS}}, tokens_per_step=1)
    body = {"model": "qwen", "input": "hello", "stream": stream, "top_logprobs": k,
            "include": ["message.output_text.logprobs"]}
    status, raw = await _post(stack, "/v1/responses", body)
    assert status == 200, raw
    if stream:
        frames = _frames(raw)
        deltas = "".join(f["delta"] for f in frames if f["type"] == "response.output_text.delta")
        assert deltas == INVALID_TEXT
        payload = frames[-1]["response"]
    else:
        payload = json.loads(raw)
    assert payload["status"] == "completed"
    part = payload["output"][0]["content"][0]
    assert part["text"] == INVALID_TEXT
    assert [bytes(e["bytes"]) for e in part["logprobs"]] == [qwen2.token_bytes(i) for i in INVALID_IDS]
    assert_bytes_spell(b"".join(bytes(e["bytes"]) for e in part["logprobs"]), part["text"])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_invalid_bytes_on_the_chat_and_completions_front_doors(aiohttp_server, qwen2, path, stream):
    stack = await start_stack(aiohttp_server, qwen2, model="qwen", tokenizer=TOKENIZER,
                              replies={"hello": {"token_ids": INVALID_IDS}})
    body = {"model": "qwen", "stream": stream, "logprobs": True if path.endswith("chat/completions") else 2}
    body.update({"messages": [{"role": "user", "content": "hello"}]} if "chat" in path else {"prompt": "hello"})
    status, raw = await _post(stack, path, body)
    assert status == 200, raw
    choices = [c for f in _frames(raw) for c in f.get("choices", [])] if stream else json.loads(raw)["choices"]
    if "chat" in path:
        text = "".join((c.get("delta" if stream else "message") or {}).get("content") or "" for c in choices)
    else:
        text = "".join(c["text"] for c in choices)
    assert text == INVALID_TEXT


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_every_length_cap_inside_a_character_is_an_incomplete_200(aiohttp_server, qwen2, api, stream):
    # The issue's sweep: 4 of max_output_tokens 1..14 were 502 / response.failed, with no logprobs asked.
    stack = await start_stack(aiohttp_server, qwen2, model="qwen", tokenizer=TOKENIZER, api=api,
                              replies={"hello": SPLIT_REPLY})
    ids = qwen2.encode(SPLIT_REPLY)
    for cap in range(1, len(ids) + 2):
        status, raw = await _post(stack, "/v1/responses", {"model": "qwen", "input": "hello", "stream": stream,
                                                           "max_output_tokens": cap,
                                                           "include": ["message.output_text.logprobs"]})
        assert status == 200, (cap, raw)
        payload = _frames(raw)[-1]["response"] if stream else json.loads(raw)
        assert payload["status"] == ("incomplete" if cap <= len(ids) else "completed"), (cap, payload["status"])
        part = payload["output"][0]["content"][0]
        joined = b"".join(bytes(e["bytes"]) for e in part["logprobs"])
        assert joined == b"".join(map(qwen2.token_bytes, ids[:cap])), cap
        # Cut inside a character: the text is what vLLM's detokenizer let out, the bytes run on past it.
        assert joined.startswith(part["text"].encode()) and joined.decode("utf-8", "ignore").startswith(part["text"])


def test_the_simulators_detokenizer_is_tokenizers_decode_stream(qwen2):
    # vLLM's text comes from `tokenizers.decoders.DecodeStream` (v1 FastIncrementalDetokenizer): the
    # simulator's HoldingDetokenizer must emit the same text at the same tokens.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from gateway.simulator.detok import HoldingDetokenizer

    tokenizer = Tokenizer(models.BPE.from_file(str(QWEN2 / "vocab.json"), str(QWEN2 / "merges.txt")))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    for ids in (INVALID_IDS, qwen2.encode(SPLIT_REPLY), qwen2.encode("根据 👋🏽 a")):
        stream, ours = decoders.DecodeStream(skip_special_tokens=True), HoldingDetokenizer(qwen2)
        assert [ours.feed([i]) or None for i in ids] == [stream.step(tokenizer, i) for i in ids]
