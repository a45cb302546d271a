"""The SGLang simulator reproduces the SGLang wire quirks the gateway has to undo.

Each test targets one quirk and is written so that a simulator without it would fail.
"""

from __future__ import annotations

from typing import Any

from gateway.logprobs.vocab import Vocab
from gateway.simulator.detok import decode_ids
from gateway.simulator.floats import FLOAT32_LOWEST, f32
from gateway.simulator.script import DEFAULT_REPLY
from gateway.simulator.sglang import SIMULATOR_KEY, create_app
from gateway.simulator.testing import is_descending, parse_sse, post_json, read_sse

MODEL = "sim/sglang-model"
REPLACEMENT = "\ufffd"


def chat(text: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"model": "whatever-the-client-says", "messages": [{"role": "user", "content": text}], **fields}


# --- chat, non-streaming -------------------------------------------------------------------------


async def test_chat_tokens_are_lone_decodes_with_utf8_of_the_lossy_string(client: Any) -> None:
    body = await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=4))
    assert body["model"] == "whatever-the-client-says", "SGLang echoes the requested model name"
    choice = body["choices"][0]
    assert choice["message"]["content"] == DEFAULT_REPLY
    content = choice["logprobs"]["content"]
    assert all(set(e) == {"token", "bytes", "logprob", "top_logprobs"} for e in content)
    assert all(e["bytes"] == list(e["token"].encode()) for e in content)
    lossy = [e for e in content if e["token"] == REPLACEMENT]
    assert lossy and all(e["bytes"] == [239, 191, 189] for e in lossy)
    assert content[-1]["token"] == "<|im_end|>", "the EOS is an entry, with its text"
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == 2
    assert len(content) == body["usage"]["completion_tokens"]
    assert all(e["logprob"] == f32(e["logprob"]) for e in content), "float32 values as Python prints them"


async def test_chat_top_lists_are_plain_top_k_with_colliding_strings_collapsed(client: Any) -> None:
    content = (await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=5)))["choices"][0][
        "logprobs"
    ]["content"]
    for entry in content:
        if len(entry["top_logprobs"]) == 5:
            assert is_descending([t["logprob"] for t in entry["top_logprobs"]])
    not_forced = [e for e in content if e["token"] not in {t["token"] for t in e["top_logprobs"]}]
    assert not_forced, "the sampled token is not added to the top list"
    collapsed = [e for e in content if len(e["top_logprobs"]) < 5]
    assert collapsed, "two lone bytes both decode to U+FFFD: one dict key"
    assert all(REPLACEMENT in [t["token"] for t in e["top_logprobs"]] for e in collapsed)
    # a dict comprehension keeps the first key's place but the last value: the list can go unsorted
    assert any(not is_descending([t["logprob"] for t in e["top_logprobs"]]) for e in collapsed)


async def test_truncating_sampling_shows_float32_lowest_for_filtered_alternatives(client: Any) -> None:
    content = (await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=5, top_p=0.3)))[
        "choices"
    ][0]["logprobs"]["content"]
    values = [t["logprob"] for e in content for t in e["top_logprobs"]]
    assert FLOAT32_LOWEST in values
    assert all(v == FLOAT32_LOWEST or v > -100 for v in values)
    assert any(e["logprob"] == 0.0 for e in content), "a lone kept token renormalizes to probability 1"


async def test_chat_errors_have_sglangs_shape(client: Any) -> None:
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": []})
    assert resp.status == 400
    assert await resp.json() == {
        "object": "error",
        "message": "Messages cannot be empty.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


# --- chat, streaming -------------------------------------------------------------------------------


async def test_stream_sends_a_chunk_only_when_the_text_grew(client: Any, demo_vocab: Vocab) -> None:
    full = await post_json(client, "/v1/chat/completions", chat(logprobs=True))
    events = await read_sse(await client.post("/v1/chat/completions", json=chat(logprobs=True, stream=True)))
    assert events[-1] == "[DONE]"
    role, *chunks, finish, _ = events
    assert role["choices"][0]["delta"]["role"] == "assistant" and role["choices"][0]["logprobs"] is None
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["choices"][0]["matched_stop"] == 2
    assert finish["choices"][0]["delta"]["content"] is None
    assert all(c["choices"][0]["delta"]["content"] for c in chunks), "no empty deltas"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == DEFAULT_REPLY
    streamed = [e["token"] for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    every = [e["token"] for e in full["choices"][0]["logprobs"]["content"]]
    # one token per step: the fragment bytes of 👋 根 据 🦀 and the EOS never get a chunk, so their entries are lost
    reply_ids = demo_vocab.encode(DEFAULT_REPLY)
    partial = [i for i in reply_ids if not demo_vocab.token_bytes(i).decode("utf-8", "ignore")]
    assert len(streamed) == len(every) - 1 - len(partial) + 4  # 4 completing bytes still get one
    assert "<|im_end|>" not in streamed and "<|im_end|>" in every


async def test_multi_token_chunks_repeat_the_first_tokens_top_list(aiohttp_client: Any, demo_vocab: Vocab) -> None:
    request = chat(logprobs=True, top_logprobs=3, stream=True)
    buggy = await aiohttp_client(create_app(demo_vocab, MODEL, tokens_per_step=3))
    fixed = await aiohttp_client(create_app(demo_vocab, MODEL, tokens_per_step=3, stream_top_logprobs_bug=False))
    chunks_bug = (await read_sse(await buggy.post("/v1/chat/completions", json=request)))[1:-2]
    chunks_ok = (await read_sse(await fixed.post("/v1/chat/completions", json=request)))[1:-2]
    entries_bug = [c["choices"][0]["logprobs"]["content"] for c in chunks_bug]
    multi = [entries for entries in entries_bug if len(entries) > 1]
    assert multi, "steps of 3 tokens give multi-token chunks"
    assert all(all(e["top_logprobs"] == entries[0]["top_logprobs"] for e in entries) for entries in multi)
    full = await post_json(fixed, "/v1/chat/completions", chat(logprobs=True, top_logprobs=3))
    by_token = full["choices"][0]["logprobs"]["content"]
    correct = [e for c in chunks_ok for e in c["choices"][0]["logprobs"]["content"]]
    assert all(e in by_token for e in correct), "without the bug each entry has its own list"
    assert any(e not in by_token for c in multi for e in c), "with the bug some entries carry a foreign list"


async def test_qwen2_stream_loses_the_entries_of_steps_without_new_text(
    aiohttp_client: Any, qwen2_vocab: Vocab
) -> None:
    client = await aiohttp_client(create_app(qwen2_vocab, "Qwen/Qwen2-0.5B-Instruct"))
    full = await post_json(client, "/v1/chat/completions", chat(logprobs=True))
    every = [e["token"] for e in full["choices"][0]["logprobs"]["content"]]
    events = await read_sse(await client.post("/v1/chat/completions", json=chat(logprobs=True, stream=True)))
    chunks = events[1:-2]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == DEFAULT_REPLY
    streamed = [e["token"] for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    # b" \xf0\x9f" prints its space, but b"\xa6" adds nothing (🦀 still incomplete) and the EOS adds
    # no text either: those two steps send no chunk, and their entries never arrive
    assert len(streamed) == len(every) - 2
    assert every[10] == REPLACEMENT and streamed == every[:10] + every[11:-1]


# --- completions ---------------------------------------------------------------------------------


async def test_completions_text_offset_is_minus_one_and_top_lists_are_dicts(client: Any) -> None:
    body = await post_json(client, "/v1/completions", {"model": "m", "prompt": "hello", "logprobs": 4})
    lp = body["choices"][0]["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert lp["text_offset"] == [-1] * len(lp["tokens"]) == [-1] * 16  # max_tokens defaults to 16
    assert all(isinstance(d, dict) and len(d) <= 4 for d in lp["top_logprobs"])
    assert any(len(d) < 4 for d in lp["top_logprobs"]), "colliding strings collapse"
    assert body["choices"][0]["finish_reason"] == "length" and body["id"].startswith("cmpl-")


async def test_completions_echo_puts_a_null_first_prompt_logprob(client: Any, demo_vocab: Vocab) -> None:
    body = await post_json(
        client, "/v1/completions", {"model": "m", "prompt": "hello there", "logprobs": 1, "echo": True, "max_tokens": 2}
    )
    lp = body["choices"][0]["logprobs"]
    n_prompt = len(demo_vocab.encode("hello there"))
    assert body["choices"][0]["text"].startswith("hello there")
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == n_prompt + 2


# --- native /generate --------------------------------------------------------------------------------


async def test_generate_returns_id_triples_without_text_by_default(client: Any, demo_vocab: Vocab) -> None:
    body = await post_json(
        client,
        "/generate",
        {"text": "hello", "return_logprob": True, "top_logprobs_num": 3, "sampling_params": {"max_new_tokens": 40}},
    )
    meta = body["meta_info"]
    ids = body["output_ids"]
    assert [t[1] for t in meta["output_token_logprobs"]] == ids
    assert all(t[2] is None for t in meta["output_token_logprobs"])
    assert all(len(top) == 3 and all(t[2] is None for t in top) for top in meta["output_top_logprobs"])
    assert meta["input_token_logprobs"] == [], "logprob_start_len -1: no prompt logprobs"
    assert meta["finish_reason"] == {"type": "stop", "matched": demo_vocab.id_for_piece("<|endoftext|>")}
    assert body["text"] == DEFAULT_REPLY
    with_text = await post_json(
        client,
        "/generate",
        {"text": "hello", "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": 0},
    )
    triples = with_text["meta_info"]["output_token_logprobs"]
    assert [t[2] for t in triples] == [decode_ids(demo_vocab, [t[1]], skip_special=False) for t in triples]
    assert with_text["meta_info"]["input_token_logprobs"][0][0] is None
    assert "output_top_logprobs" not in with_text["meta_info"]


async def test_generate_stream_is_cumulative_then_done(client: Any) -> None:
    events = await read_sse(
        await client.post("/generate", json={"text": "hello", "stream": True, "return_logprob": True})
    )
    assert events[-1] == "[DONE]"
    frames = events[:-1]
    assert frames[-1]["text"] == DEFAULT_REPLY
    lengths = [len(f["meta_info"]["output_token_logprobs"]) for f in frames]
    assert lengths == list(range(1, len(frames) + 1))
    assert all(f["meta_info"]["finish_reason"] is None for f in frames[:-1])


async def test_generate_errors_are_a_message_object(client: Any) -> None:
    resp = await client.post("/generate", json={"sampling_params": {}})
    assert resp.status == 400
    assert await resp.json() == {"error": {"message": "Either text or input_ids should be provided."}}


# --- faults and stats ---------------------------------------------------------------------------------


async def test_faults_and_stats(client: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(), headers={"x-sim-fault": "http503"})
    assert resp.status == 503 and (await resp.json())["object"] == "error"
    resp = await client.post(
        "/v1/chat/completions", json=chat(stream=True), headers={"x-sim-fault": "error_mid_stream"}
    )
    frames = parse_sse(await resp.text())
    assert "error" in frames[-2][1] and frames[-1][1] == "[DONE]"
    stats = await (await client.get("/sim/stats")).json()
    assert stats["requests_faulted"] == 2 and stats["in_flight"] == 0
    assert client.server.app[SIMULATOR_KEY].stats.started == 2
