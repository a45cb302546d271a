"""The TGI simulator reproduces the TGI wire quirks the gateway has to undo.

Each test targets one quirk and is written so that a simulator without it would fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.logprobs.vocab import Vocab
from gateway.simulator.floats import f32_shortest
from gateway.simulator.script import DEFAULT_REPLY
from gateway.simulator.testing import is_descending, parse_sse, post_json, read_sse
from gateway.simulator.tgi import SIMULATOR_KEY, create_app

MODEL = "sim/tgi-model"
QWEN2_MODEL = "Qwen/Qwen2-0.5B-Instruct"
CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures"


async def generate(client: Any, inputs: str = "hello", **parameters: Any) -> dict[str, Any]:
    return await post_json(client, "/generate", {"inputs": inputs, "parameters": parameters})


def chat(text: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"model": "tgi", "messages": [{"role": "user", "content": text}], **fields}


# --- native /generate ----------------------------------------------------------------------------


async def test_details_tokens_carry_ids_and_the_eos_as_a_special_token(client: Any, demo_vocab: Vocab) -> None:
    body = await generate(client, details=True)
    assert body["generated_text"] == DEFAULT_REPLY
    details = body["details"]
    assert details["finish_reason"] == "eos_token"
    tokens = details["tokens"]
    assert all(set(t) == {"id", "text", "logprob", "special"} for t in tokens)
    assert [t["id"] for t in tokens] == [*demo_vocab.encode(DEFAULT_REPLY), demo_vocab.id_for_piece("<|endoftext|>")]
    assert tokens[-1]["special"] is True and tokens[-1]["text"] == "<|endoftext|>"
    assert not any(t["special"] for t in tokens[:-1])
    assert details["generated_tokens"] == len(tokens)
    assert details["prefill"] == [] and "top_tokens" not in details and "best_of_sequences" not in details
    assert all(t["logprob"] == f32_shortest(t["logprob"]) for t in tokens), "float32, printed the shortest way"


async def test_without_details_only_the_text_comes_back(client: Any) -> None:
    assert await generate(client) == {"generated_text": DEFAULT_REPLY}
    full = await generate(client, "hello", return_full_text=True)
    assert full["generated_text"] == "hello" + DEFAULT_REPLY


async def test_split_emoji_is_empty_text_then_whole_on_the_completing_token(client: Any) -> None:
    tokens = (await generate(client, details=True))["details"]["tokens"]
    texts = [t["text"] for t in tokens]
    # the demo BPE splits 👋 into four single bytes
    at = texts.index("👋")
    assert texts[at - 3 : at] == ["", "", ""]
    assert "".join(t["text"] for t in tokens if not t["special"]) == DEFAULT_REPLY


async def test_qwen2_fragment_token_with_a_space_shows_empty_and_the_space_moves(qwen_client: Any) -> None:
    tokens = (await generate(qwen_client, details=True))["details"]["tokens"]
    texts = [t["text"] for t in tokens]
    # b" \xf0\x9f\x91" then b"\x8b": the space only appears with the completed character
    assert texts[2:4] == ["", " 👋"]
    assert texts[4:7] == ["", " 根", "据"]
    assert "".join(texts[:-1]) == DEFAULT_REPLY and texts[-1] == "<|endoftext|>"


async def test_top_tokens_are_sorted_with_tie_overflow_and_no_injected_sampled_token(client: Any) -> None:
    details = (await generate(client, details=True, top_n_tokens=3))["details"]
    tops = details["top_tokens"]
    assert len(tops) == len(details["tokens"])
    assert all(is_descending([t["logprob"] for t in top]) for top in tops)
    assert all(set(t) == {"id", "text", "logprob", "special"} for top in tops for t in top)
    sizes = {len(top) for top in tops}
    assert sizes == {3, 4}, "ties at the 3rd value pull in a 4th entry"
    for top in tops:
        if len(top) == 4:
            assert top[3]["logprob"] == top[2]["logprob"]
    missing = [i for i, (tok, top) in enumerate(zip(details["tokens"], tops, strict=True)) if tok["id"] not in
               {t["id"] for t in top}]  # fmt: skip
    assert missing, "the sampled token is not added when it is not among the best"
    alternatives = [t["text"] for top in tops for t in top]
    assert "\ufffd" in alternatives, "alternatives are decoded one id at a time"
    even = (await generate(client, details=True, top_n_tokens=2))["details"]["top_tokens"]
    assert {len(top) for top in even} == {2}, "an even n never splits a tied pair"


async def test_prefill_has_a_null_first_logprob_only_with_decoder_input_details(client: Any, demo_vocab: Vocab) -> None:
    details = (await generate(client, "hello there", details=True, decoder_input_details=True))["details"]
    prefill = details["prefill"]
    assert [p["id"] for p in prefill] == demo_vocab.encode("hello there")
    assert all(set(p) == {"id", "text", "logprob"} for p in prefill)
    assert prefill[0]["logprob"] is None and all(p["logprob"] is not None for p in prefill[1:])


async def test_seed_is_reported_only_when_sampling(client: Any) -> None:
    assert (await generate(client, details=True))["details"]["seed"] is None
    assert (await generate(client, details=True, do_sample=True, seed=42))["details"]["seed"] == 42
    drawn = (await generate(client, details=True, temperature=0.7))["details"]["seed"]
    assert isinstance(drawn, int)


async def test_truncated_alternatives_are_null(client: Any) -> None:
    details = (await generate(client, details=True, top_k=2, top_n_tokens=4))["details"]
    nulls = 0
    for token, top in zip(details["tokens"], details["top_tokens"], strict=True):
        values = [t["logprob"] for t in top]
        kept = [v for v in values if v is not None]
        assert values == kept + [None] * (len(values) - len(kept)), "-inf (null) only after the kept ones"
        nulls += len(values) - len(kept)
        if top[0]["id"] == token["id"] and values[2] is None and values[0] != values[1]:  # top 2, renormalized
            assert sum(2.718281828459045**v for v in kept) == pytest.approx(1.0, abs=1e-5)
    assert nulls, "top_k=2 truncates the rest of the top 4"
    assert all(t["logprob"] is not None for t in details["tokens"])


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"top_n_tokens": 6}, "Input validation error: `top_n_tokens` must be >= 0 and <= 5. Given: 6"),
        ({"top_p": 1.0}, "Input validation error: `top_p` must be > 0.0 and < 1.0"),
        ({"max_new_tokens": 0}, "Input validation error: `max_new_tokens` must be strictly positive"),
        ({"temperature": 0}, "Input validation error: `temperature` must be strictly positive"),
    ],
)
async def test_validation_errors_have_tgis_shape_and_messages(
    client: Any, parameters: dict[str, Any], message: str
) -> None:
    resp = await client.post("/generate", json={"inputs": "x", "parameters": parameters})
    assert resp.status == 422
    assert await resp.json() == {"error": message, "error_type": "validation"}


async def test_the_top_n_cap_is_the_launcher_flag(aiohttp_client: Any, demo_vocab: Vocab) -> None:
    client = await aiohttp_client(create_app(demo_vocab, MODEL, max_top_n_tokens=10))
    details = (await generate(client, details=True, top_n_tokens=8))["details"]
    assert min(len(top) for top in details["top_tokens"]) == 8
    resp = await client.post("/generate", json={"inputs": "x", "parameters": {"top_n_tokens": 11}})
    assert (await resp.json())["error"].endswith("<= 10. Given: 11")


async def test_missing_inputs_is_axums_plain_text_rejection(client: Any) -> None:
    resp = await client.post("/generate", json={"parameters": {}})
    assert resp.status == 422
    assert "missing field `inputs`" in await resp.text()


async def test_generate_stream_sends_one_token_per_event_and_no_done(client: Any, demo_vocab: Vocab) -> None:
    full = (await generate(client, details=True, top_n_tokens=1))["details"]
    resp = await client.post(
        "/generate_stream", json={"inputs": "hello", "parameters": {"details": True, "top_n_tokens": 1}}
    )
    events = await read_sse(resp)
    assert "[DONE]" not in events
    assert [e["index"] for e in events] == list(range(1, len(full["tokens"]) + 1))
    assert [e["token"] for e in events] == full["tokens"]
    assert [e["top_tokens"] for e in events] == full["top_tokens"]
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    assert events[-1]["generated_text"] == DEFAULT_REPLY
    assert events[-1]["details"] == {
        "finish_reason": "eos_token",
        "generated_tokens": len(full["tokens"]),
        "seed": None,
        "input_length": len(demo_vocab.encode("hello")),
    }
    plain = await read_sse(await client.post("/generate_stream", json={"inputs": "hello"}))
    assert all("top_tokens" not in e for e in plain) and plain[-1]["details"] is None


async def test_stream_refuses_decoder_input_details(client: Any) -> None:
    resp = await client.post("/generate_stream", json={"inputs": "x", "parameters": {"decoder_input_details": True}})
    assert resp.status == 422
    assert "not supported when streaming tokens" in (await resp.json())["error"]


# --- OpenAI routes ---------------------------------------------------------------------------------


async def test_chat_logprobs_have_no_bytes_and_include_the_eos(qwen_client: Any) -> None:
    resp = await qwen_client.post("/v1/chat/completions", json=chat(logprobs=True, top_logprobs=2))
    body = await resp.json()
    assert body["id"] == "" and body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": DEFAULT_REPLY}
    assert choice["finish_reason"] == "stop"
    content = choice["logprobs"]["content"]
    assert all(set(e) == {"token", "logprob", "top_logprobs"} for e in content)
    assert all(set(t) == {"token", "logprob"} for e in content for t in e["top_logprobs"])
    assert content[-1]["token"] == "<|im_end|>"
    assert [e["token"] for e in content[2:4]] == ["", " 👋"]
    assert len(content) == body["usage"]["completion_tokens"]


async def test_chat_top_logprobs_are_empty_lists_when_not_requested(client: Any) -> None:
    body = await (await client.post("/v1/chat/completions", json=chat(logprobs=True))).json()
    assert all(e["top_logprobs"] == [] for e in body["choices"][0]["logprobs"]["content"])
    body = await (await client.post("/v1/chat/completions", json=chat())).json()
    assert body["choices"][0]["logprobs"] is None


async def test_chat_top_logprobs_over_the_cap_fail_even_without_logprobs(client: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(top_logprobs=6))
    assert resp.status == 422
    assert (await resp.json())["error"].startswith("Input validation error: `top_n_tokens` must be")


async def test_chat_stream_is_one_token_per_chunk_then_usage_then_done(client: Any) -> None:
    full = await (await client.post("/v1/chat/completions", json=chat(logprobs=True, top_logprobs=1))).json()
    events = await read_sse(
        await client.post(
            "/v1/chat/completions",
            json=chat(logprobs=True, top_logprobs=1, stream=True, stream_options={"include_usage": True}),
        )
    )
    assert events[-1] == "[DONE]"
    *chunks, usage, _ = events
    assert usage["choices"] == [] and usage["usage"] == full["usage"]
    assert all(len(c["choices"][0]["logprobs"]["content"]) == 1 for c in chunks)
    entries = [c["choices"][0]["logprobs"]["content"][0] for c in chunks]
    assert entries == full["choices"][0]["logprobs"]["content"]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert all(d["role"] == "assistant" for d in deltas)
    assert deltas[-1]["content"] == "" and entries[-1]["token"] == "<|im_end|>"  # special: no content
    assert "".join(d["content"] for d in deltas) == DEFAULT_REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks][-2:] == [None, "stop"]


async def test_completions_never_carry_logprobs_and_stream_ends_with_eos_token(client: Any) -> None:
    body = await (await client.post("/v1/completions", json={"prompt": "hello", "logprobs": 5})).json()
    assert body["choices"][0]["logprobs"] is None and body["choices"][0]["finish_reason"] == "stop"
    events = await read_sse(await client.post("/v1/completions", json={"prompt": "hello", "stream": True}))
    assert events[-1] == "[DONE]"
    *chunks, last, _ = events
    assert all(c["choices"][0]["finish_reason"] == "" and "usage" not in c for c in chunks)
    assert last["choices"][0]["finish_reason"] == "eos_token"  # unformatted, unlike the non-stream "stop"
    assert last["choices"][0]["text"] == "<|endoftext|>" and last["usage"]["completion_tokens"] == len(chunks) + 1


# --- real TGI shapes ---------------------------------------------------------------------------------

_CAPTURES = sorted(CAPTURES.glob("tgi-generate-*.json")) if CAPTURES.is_dir() else []
_CLIENT_NULLS = ("best_of_sequences", "top_tokens")  # the Python client writes these as null; HTTP omits them


def _shape(value: Any) -> Any:
    """Key sets and JSON types of a body, lists reduced to the shapes of their items."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        shapes = []
        for item in value:
            if _shape(item) not in shapes:
                shapes.append(_shape(item))
        return shapes
    return type(value).__name__


@pytest.mark.skipif(not _CAPTURES, reason=f"TGI captures not found at {CAPTURES}")
@pytest.mark.parametrize("path", _CAPTURES, ids=lambda p: p.stem)
async def test_generate_body_has_the_key_sets_and_types_of_real_tgi(client: Any, path: Path) -> None:
    real = json.loads(path.read_text())
    details = real["details"]
    for key in _CLIENT_NULLS:
        if key in details and details[key] is None:
            del details[key]
    parameters: dict[str, Any] = {"details": True, "decoder_input_details": bool(details["prefill"])}
    if details["seed"] is not None:
        parameters |= {"do_sample": True, "seed": details["seed"]}
    ours = await generate(client, "hello there", **parameters)
    assert set(ours) == set(real)
    assert set(ours["details"]) == set(details)
    for key in ("finish_reason", "generated_tokens", "seed"):
        assert _shape(ours["details"][key]) == _shape(details[key]), key
    assert _shape(ours["details"]["tokens"]) == _shape(details["tokens"])
    if details["prefill"]:
        # a null first logprob, floats after it, in both (seq2seq captures have just the first)
        for part in (slice(0, 1), slice(1, 2)):
            if details["prefill"][part]:
                assert _shape(ours["details"]["prefill"][part]) == _shape(details["prefill"][part])


# --- faults and stats ----------------------------------------------------------------------------------


async def test_faults_answer_in_tgis_error_shape(client: Any) -> None:
    resp = await client.post("/generate", json={"inputs": "x"}, headers={"x-sim-fault": "http429"})
    assert resp.status == 429
    assert (await resp.json())["error_type"] == "overloaded"
    resp = await client.post(
        "/generate_stream",
        json={"inputs": "x"},
        headers={"x-sim-fault": "error_mid_stream", "x-sim-die-after": "2"},
    )
    frames = parse_sse(await resp.text())
    assert len(frames) == 3 and frames[-1][1]["error_type"] == "generation"  # and no [DONE]
    resp = await client.post(
        "/v1/chat/completions", json=chat(stream=True), headers={"x-sim-fault": "error_mid_stream"}
    )
    frames = parse_sse(await resp.text())
    assert "error" in frames[-2][1] and frames[-1][1] == "[DONE]"
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await client.post("/generate", json={"inputs": "x"}, headers={"x-sim-fault": "refuse"})


async def test_stats_and_recent_requests(client: Any) -> None:
    await generate(client)
    await client.post("/generate", json={"inputs": "x", "parameters": {"top_n_tokens": 9}})
    stats = await (await client.get("/sim/stats")).json()
    assert (stats["requests_started"], stats["requests_finished"], stats["requests_rejected"]) == (2, 1, 1)
    recent = await (await client.get("/sim/requests")).json()
    assert [r["path"] for r in recent] == ["/generate", "/generate"]
    await client.post("/sim/reset")
    assert client.server.app[SIMULATOR_KEY].stats.started == 0
