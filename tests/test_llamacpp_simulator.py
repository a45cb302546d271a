"""The llama.cpp server simulator reproduces the llama-server wire quirks the gateway has to undo.

Each test targets one quirk and is written so that a simulator without it would fail.
"""

from __future__ import annotations

from typing import Any

from gateway.logprobs.vocab import Vocab
from gateway.simulator.floats import FLOAT32_LOWEST
from gateway.simulator.llamacpp import SIMULATOR_KEY, create_app, validate_utf8  # noqa: F401 (conftest uses create_app)
from gateway.simulator.script import DEFAULT_REPLY
from gateway.simulator.testing import is_descending, parse_sse, post_json, read_sse

MODEL = "sim/llamacpp-model"
QWEN2_MODEL = "qwen2"


def chat(text: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **fields}


# --- entries ---------------------------------------------------------------------------------------


async def test_a_split_character_gets_one_entry_with_all_its_bytes(client: Any, demo_vocab: Vocab) -> None:
    body = await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=2))
    content = body["choices"][0]["logprobs"]["content"]
    assert all(set(e) == {"id", "token", "bytes", "logprob", "top_logprobs"} for e in content)
    assert all(set(t) == {"id", "token", "bytes", "logprob"} for e in content for t in e["top_logprobs"])
    # the demo BPE spells 👋 with four one-byte tokens: only the last one reaches the client
    wave = [e for e in content if e["token"] == "👋"]
    assert len(wave) == 1 and bytes(wave[0]["bytes"]) == "👋".encode()
    assert wave[0]["id"] == demo_vocab.id_for_bytes(b"\x8b")
    generated = body["usage"]["completion_tokens"]
    assert len(content) == generated - 10, "3+2+2+3 fragment tokens of 👋 根 据 🦀 have no entry"
    assert b"".join(bytes(e["bytes"]) for e in content) == DEFAULT_REPLY.encode()
    assert content[-1]["token"] == "" and content[-1]["bytes"] == [], "the EOS renders as nothing"


async def test_qwen2_completing_token_carries_the_pending_space_too(qwen_client: Any) -> None:
    content = (await post_json(qwen_client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=1)))["choices"][0][
        "logprobs"
    ]["content"]
    tokens = [e["token"] for e in content]
    assert tokens[:6] == ["Hi", " there", " 👋", " 根", "据", " the"]
    assert bytes(content[2]["bytes"]) == b" \xf0\x9f\x91\x8b" and content[2]["id"] == 233


async def test_alternative_tokens_are_cut_to_valid_utf8_with_exact_bytes(client: Any) -> None:
    content = (await post_json(client, "/v1/chat/completions", chat(logprobs=True)))["choices"][0]["logprobs"][
        "content"
    ]
    alternatives = [t for e in content for t in e["top_logprobs"]]
    for alt in alternatives:
        raw = bytes(alt["bytes"])
        assert alt["token"] == raw[: validate_utf8(raw)].decode("utf-8", "replace")
    assert any(alt["token"] == "" and alt["bytes"] for alt in alternatives), "a lone lead byte is cut away"
    assert any(alt["token"] == "\ufffd" for alt in alternatives), "a stray continuation byte is kept, replaced"
    assert any(alt["token"] == "" and alt["bytes"] == [] for alt in alternatives), "control tokens render empty"


async def test_logprobs_true_alone_means_20_and_underflow_is_float_lowest(client: Any) -> None:
    content = (await post_json(client, "/v1/chat/completions", chat(logprobs=True)))["choices"][0]["logprobs"][
        "content"
    ]
    for entry in content:
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(values) == 20 and is_descending(values)
        assert values[16:] == [FLOAT32_LOWEST] * 4 and FLOAT32_LOWEST not in values[:16]
    few = (await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=2)))["choices"][0]
    not_forced = [e for e in few["logprobs"]["content"] if e["id"] not in {t["id"] for t in e["top_logprobs"]}]
    assert not_forced and all(e["logprob"] > FLOAT32_LOWEST for e in not_forced), "the sampled token is not added"


async def test_top_logprobs_without_logprobs_is_refused(client: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(top_logprobs=3))
    assert resp.status == 400
    message = "top_logprobs requires logprobs to be set to true"
    assert await resp.json() == {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}
    body = await post_json(client, "/v1/chat/completions", chat())
    assert "logprobs" not in body["choices"][0], "no n_probs: no logprobs key at all"


async def test_post_sampling_probs_are_probabilities_after_truncation(client: Any) -> None:
    body = await post_json(
        client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=10, post_sampling_probs=True, top_p=0.5)
    )
    content = body["choices"][0]["logprobs"]["content"]
    assert all(set(e) == {"id", "token", "bytes", "prob", "top_probs"} for e in content)
    assert all(0 < t["prob"] <= 1 for e in content for t in e["top_probs"])
    assert any(len(e["top_probs"]) < 10 for e in content), "zero-probability candidates are dropped"


# --- streaming ---------------------------------------------------------------------------------------


async def test_stream_attaches_logprobs_to_content_deltas_and_drops_the_eos_entry(client: Any) -> None:
    full = await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=1))
    events = await read_sse(
        await client.post(
            "/v1/chat/completions",
            json=chat(logprobs=True, top_logprobs=1, stream=True, stream_options={"include_usage": True}),
        )
    )
    assert events[-1] == "[DONE]"
    role, *chunks, final, usage, _ = events
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert final["choices"][0] == {"finish_reason": "stop", "index": 0, "delta": {}}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == full["usage"]["completion_tokens"]
    assert "timings" in usage and "timings" not in final
    entries = [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    assert entries == full["choices"][0]["logprobs"]["content"][:-1], "the EOS adds no text: no chunk"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == DEFAULT_REPLY


# --- completions ----------------------------------------------------------------------------------------


async def test_completions_use_the_chat_style_logprobs_and_run_to_eos(client: Any) -> None:
    body = await post_json(client, "/v1/completions", {"prompt": "hello", "logprobs": 3})
    choice = body["choices"][0]
    assert set(choice["logprobs"]) == {"content"}
    assert all(len(e["top_logprobs"]) == 3 for e in choice["logprobs"]["content"])
    assert choice["text"] == DEFAULT_REPLY and choice["finish_reason"] == "stop", "no 16-token default"
    plain = await post_json(client, "/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert plain["choices"][0]["logprobs"] is None and plain["choices"][0]["finish_reason"] == "length"
    request = {"prompt": "hello", "logprobs": 1, "stream": True}
    *chunks, final, _ = await read_sse(await client.post("/v1/completions", json=request))
    eos = chunks[-1]["choices"][0]  # completions send every result, the EOS's empty one too
    assert eos["text"] == "" and eos["logprobs"]["content"][0]["bytes"] == []
    assert final["choices"][0]["finish_reason"] == "stop" and final["choices"][0]["logprobs"] is None


async def test_native_completion_probabilities_only_when_asked(client: Any) -> None:
    body = await post_json(client, "/completion", {"prompt": "hello", "n_probs": 2, "n_predict": 5})
    assert body["stop"] is True and body["stop_type"] == "limit" and body["tokens_predicted"] == 5
    probs = body["completion_probabilities"]
    assert all(len(p["top_logprobs"]) == 2 for p in probs)
    assert [p["token"] for p in probs] == ["H", "i", " there", " "], "the first byte of 👋 is still pending"
    assert "completion_probabilities" not in await post_json(client, "/completion", {"prompt": "hello"})
    resp = await client.post("/completion", json={"prompt": "hello", "n_probs": 1, "stream": True})
    frames = await read_sse(resp)
    assert "[DONE]" not in frames
    assert all(f["stop"] is False and len(f["completion_probabilities"]) == 1 for f in frames[:-1])
    assert frames[-1]["stop"] is True and frames[-1]["content"] == ""


# --- faults and stats --------------------------------------------------------------------------------------


async def test_faults_and_stats(client: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(), headers={"x-sim-fault": "http503"})
    assert resp.status == 503 and (await resp.json())["error"]["type"] == "unavailable_error"
    resp = await client.post(
        "/v1/chat/completions",
        json=chat(stream=True),
        headers={"x-sim-fault": "error_mid_stream", "x-sim-die-after": "2"},
    )
    frames = parse_sse(await resp.text())
    assert [name for name, _ in frames] == ["data", "data", "error"], "an error event, no [DONE]"
    assert frames[-1][1]["type"] == "server_error"
    await post_json(client, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    stats = await (await client.get("/sim/stats")).json()
    assert (stats["requests_faulted"], stats["requests_finished"]) == (2, 1)
    assert client.server.app[SIMULATOR_KEY].stats.started == 3
