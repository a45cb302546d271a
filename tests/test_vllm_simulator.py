"""The vLLM simulator reproduces the vLLM wire quirks the gateway has to undo.

Each test targets one quirk and is written so that a simulator without it would fail.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest

from gateway.logprobs.vocab import Vocab, load_directory
from gateway.simulator.detok import ContextualTokenStrings, TokenStrings
from gateway.simulator.script import DEFAULT_REPLY
from gateway.simulator.testing import is_descending, post_json, read_sse
from gateway.simulator.vllm import SIMULATOR_KEY, create_app

MODEL = "sim/demo-model"
PLACEHOLDER = re.compile(r"^token_id:(\d+)$")
REPLACEMENT = "\ufffd"


def chat_body(text: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **fields}


def decoded(vocab: Vocab, token_id: int) -> str:
    return "" if vocab.is_special(token_id) else vocab.token_bytes(token_id).decode("utf-8", errors="replace")


# --- chat logprobs ----------------------------------------------------------------------------


async def test_chat_top_list_is_sampled_first_with_exactly_k_entries_and_not_always_sorted(client: Any) -> None:
    body = await post_json(client, "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=5))
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        top = entry["top_logprobs"]
        assert len(top) == 5
        assert (top[0]["token"], top[0]["logprob"]) == (entry["token"], entry["logprob"])
        assert is_descending([t["logprob"] for t in top[1:]])
    unsorted = [e for e in content if not is_descending([t["logprob"] for t in e["top_logprobs"]])]
    assert unsorted, "a sampled token that is not the most likely must lead an unsorted list"


async def test_chat_top_list_is_the_first_k_entries_of_one_ranking(client: Any) -> None:
    small = await post_json(client, "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=4))
    large = await post_json(client, "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=20))
    for a, b in zip(
        small["choices"][0]["logprobs"]["content"], large["choices"][0]["logprobs"]["content"], strict=True
    ):
        assert a["top_logprobs"] == b["top_logprobs"][:4]


async def test_chat_sampled_token_outside_the_top_20_keeps_its_real_logprob(client: Any) -> None:
    body = await post_json(client, "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=20))
    outside = [
        e
        for e in body["choices"][0]["logprobs"]["content"]
        if all(e["logprob"] < t["logprob"] for t in e["top_logprobs"][1:])
    ]
    assert outside, "some sampled token must rank below all 19 alternatives shown"
    for entry in outside:
        assert len(entry["top_logprobs"]) == 20
        assert -9999.0 < entry["logprob"] < 0


async def test_chat_logprobs_zero_gives_empty_top_lists_and_no_flag_gives_null(client: Any) -> None:
    body = await post_json(client, "/v1/chat/completions", chat_body(logprobs=True))
    assert all(e["top_logprobs"] == [] for e in body["choices"][0]["logprobs"]["content"])
    body = await post_json(client, "/v1/chat/completions", chat_body())
    assert body["choices"][0]["logprobs"] is None
    body = await post_json(client, "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=None))
    assert body["choices"][0]["logprobs"] is None  # vLLM needs top_logprobs not null too


async def test_chat_token_strings_are_vllms_context_corrected_decodes(client: Any, demo_vocab: Vocab) -> None:
    # vLLM 0.32 (v1/engine/logprobs.py, _verify_tokens): a token whose own decode ends in U+FFFD is decoded
    # after up to 4 preceding sampled tokens; the lead of a split character is "", the completing token
    # spells the whole character (issue 20: real vLLM, 192 of 192 responses).
    body = await post_json(
        client, "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=5, return_token_ids=True)
    )
    choice = body["choices"][0]
    content, ids = choice["logprobs"]["content"], choice["token_ids"]
    contextual = ContextualTokenStrings(demo_vocab, TokenStrings(demo_vocab))
    assert [e["token"] for e in content] == [contextual.at(i, ids[:n]) for n, i in enumerate(ids)]
    assert all(e["bytes"] == list(e["token"].encode()) for e in content)
    tokens = [e["token"] for e in content]
    assert REPLACEMENT not in "".join(tokens) and "".join(tokens) == choice["message"]["content"]
    assert "" in tokens[:-1], "the leads of emoji and CJK split into single bytes are empty"
    assert tokens[-1] == "" and content[-1]["bytes"] == [], "EOS is a logprob entry with an empty string"
    alternatives = [t["token"] for e in content for t in e["top_logprobs"]]
    assert "" in alternatives


def test_context_corrected_strings_follow_vllms_rule(qwen2_vocab: Vocab) -> None:
    ids = qwen2_vocab.encode("Hi 根据 👋")  # "Hi", " \xe6\xa0", "\xb9", "据", " \xf0\x9f\x91", "\x8b"
    contextual = ContextualTokenStrings(qwen2_vocab, TokenStrings(qwen2_vocab))
    assert [contextual.at(i, ids[:n]) for n, i in enumerate(ids)] == ["Hi", "", " 根", "据", "", " 👋"]
    assert contextual.at(23687, [13048]) == ""  # e7 a8 after "Hi": not complete with any context


async def test_token_id_placeholders_keep_decoded_bytes_for_sampled_but_placeholder_bytes_for_top(
    client: Any, demo_vocab: Vocab
) -> None:
    body = await post_json(
        client,
        "/v1/chat/completions",
        chat_body(logprobs=True, top_logprobs=3, return_tokens_as_token_ids=True, return_token_ids=True),
    )
    choice = body["choices"][0]
    for entry, token_id in zip(choice["logprobs"]["content"], choice["token_ids"], strict=True):
        match = PLACEHOLDER.match(entry["token"])
        assert match and int(match.group(1)) == token_id
        for top in entry["top_logprobs"]:
            assert PLACEHOLDER.match(top["token"])
            assert top["bytes"] == list(top["token"].encode())
    # The sampled token's bytes are its context-corrected decode: [] for the lead of a split character.
    assert any(e["bytes"] == [] for e in choice["logprobs"]["content"][:-1])
    assert all(239 not in e["bytes"] for e in choice["logprobs"]["content"])


# --- EOS, lengths, usage ----------------------------------------------------------------------


async def test_eos_is_in_token_ids_and_logprobs_but_not_in_the_text(client: Any, demo_vocab: Vocab) -> None:
    body = await post_json(client, "/v1/chat/completions", chat_body(logprobs=True, return_token_ids=True))
    choice = body["choices"][0]
    reply_ids = demo_vocab.encode(DEFAULT_REPLY)
    im_end = demo_vocab.id_for_piece("<|im_end|>")
    assert choice["message"]["content"] == DEFAULT_REPLY
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["token_ids"] == [*reply_ids, im_end]
    assert len(choice["logprobs"]["content"]) == body["usage"]["completion_tokens"] == len(reply_ids) + 1


async def test_completions_end_with_endoftext(client: Any, demo_vocab: Vocab) -> None:
    body = await post_json(client, "/v1/completions", {"prompt": "hello", "max_tokens": 100, "return_token_ids": True})
    assert body["choices"][0]["token_ids"][-1] == demo_vocab.id_for_piece("<|endoftext|>")
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_completions_default_to_16_tokens_and_stop_for_length(client: Any, demo_vocab: Vocab) -> None:
    body = await post_json(client, "/v1/completions", {"prompt": "hello", "return_token_ids": True})
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"] == 16
    assert choice["finish_reason"] == "length"
    assert choice["token_ids"] == demo_vocab.encode(DEFAULT_REPLY)[:16]


async def test_reply_that_exactly_fills_max_tokens_has_no_room_for_eos(client: Any, demo_vocab: Vocab) -> None:
    n = len(demo_vocab.encode(DEFAULT_REPLY))
    body = await post_json(client, "/v1/chat/completions", chat_body(max_tokens=n))
    assert body["choices"][0]["finish_reason"] == "length"
    body = await post_json(client, "/v1/chat/completions", chat_body(max_completion_tokens=n + 1))
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_cut_inside_an_emoji_drops_its_bytes_from_the_text(client: Any, demo_vocab: Vocab) -> None:
    ids = demo_vocab.encode(DEFAULT_REPLY)
    cut = next(i for i in range(1, len(ids)) if demo_vocab.token_bytes(ids[i - 1]) == b"\xf0")
    body = await post_json(client, "/v1/chat/completions", chat_body(max_tokens=cut, logprobs=True))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["content"]) == cut
    assert choice["message"]["content"] == b"".join(demo_vocab.token_bytes(i) for i in ids[: cut - 1]).decode()


async def test_ignore_eos_repeats_the_reply_until_max_tokens(client: Any, demo_vocab: Vocab) -> None:
    n = len(demo_vocab.encode(DEFAULT_REPLY))
    body = await post_json(client, "/v1/chat/completions", chat_body(max_tokens=2 * n, ignore_eos=True))
    assert body["choices"][0]["message"]["content"] == DEFAULT_REPLY * 2
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2 * n


async def test_scripted_replies_and_chatml_prompt_tokens(make_client: Any, demo_vocab: Vocab) -> None:
    client = await make_client(replies={"ping": "pong"})
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ping"}]
    body = await post_json(client, "/v1/chat/completions", {"messages": messages})
    assert body["choices"][0]["message"]["content"] == "pong"
    start, end = demo_vocab.id_for_piece("<|im_start|>"), demo_vocab.id_for_piece("<|im_end|>")
    expected = [
        start, *demo_vocab.encode("system\nBe brief."), end, *demo_vocab.encode("\n"),
        start, *demo_vocab.encode("user\nping"), end, *demo_vocab.encode("\n"),
        start, *demo_vocab.encode("assistant\n"),
    ]  # fmt: skip
    assert body["usage"]["prompt_tokens"] == len(expected)
    body = await post_json(client, "/v1/chat/completions", {"messages": messages, "return_token_ids": True})
    assert body["prompt_token_ids"] == expected
    body = await post_json(client, "/v1/completions", {"prompt": "ping", "max_tokens": 10})
    assert body["choices"][0]["text"] == "pong"


async def test_non_streaming_field_sets_match_vllm(client: Any) -> None:
    chat = await post_json(client, "/v1/chat/completions", chat_body())
    assert chat["id"].startswith("chatcmpl-") and chat["object"] == "chat.completion"
    assert {"prompt_logprobs", "prompt_token_ids", "kv_transfer_params", "system_fingerprint"} <= set(chat)
    assert chat["prompt_logprobs"] is None and chat["prompt_token_ids"] is None
    assert set(chat["choices"][0]) >= {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids"}
    assert "tool_calls" not in chat["choices"][0]["message"]
    assert set(chat["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
                                  "completion_tokens_details"}  # (tests/captures/real: vLLM 0.32.0)
    cmpl = await post_json(client, "/v1/completions", {"prompt": "hello"})
    assert cmpl["id"].startswith("cmpl-") and cmpl["object"] == "text_completion"
    assert set(cmpl["choices"][0]) >= {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_logprobs"}


# --- completions logprobs ---------------------------------------------------------------------


async def test_completions_dicts_have_k_or_k_plus_1_keys_sampled_first(client: Any) -> None:
    body = await post_json(
        client,
        "/v1/completions",
        {"prompt": "hello", "max_tokens": 30, "logprobs": 5, "return_tokens_as_token_ids": True},
    )
    lp = body["choices"][0]["logprobs"]
    sizes = {len(d) for d in lp["top_logprobs"]}
    assert sizes == {5, 6}, "k keys when the sampled token is in the top-k, k+1 when it is not"
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert PLACEHOLDER.match(token)
        assert next(iter(top.items())) == (token, logprob)
    # placeholders count code points too
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]


async def test_completions_keys_collide_when_ids_share_a_decoded_string(client: Any) -> None:
    request = {"prompt": "hello", "max_tokens": 30, "logprobs": 5}
    by_string = await post_json(client, "/v1/completions", request)
    by_id = await post_json(client, "/v1/completions", {**request, "return_tokens_as_token_ids": True})
    strings, ids = by_string["choices"][0]["logprobs"], by_id["choices"][0]["logprobs"]
    collapsed = [(s, i) for s, i in zip(strings["top_logprobs"], ids["top_logprobs"], strict=True) if len(s) < len(i)]
    assert collapsed, "two ids decoding to the same string must collapse into one key"
    assert any(REPLACEMENT in s or "" in s for s, _ in collapsed)
    offsets = strings["text_offset"]
    assert offsets == [sum(len(t) for t in strings["tokens"][:i]) for i in range(len(offsets))]


async def test_completions_echo_prepends_the_prompt_with_a_null_first_position(client: Any, demo_vocab: Vocab) -> None:
    prompt = "hello there"
    body = await post_json(client, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "logprobs": 2, "echo": True})
    choice = body["choices"][0]
    prompt_ids = demo_vocab.encode(prompt)
    lp = choice["logprobs"]
    assert choice["text"].startswith(prompt)
    assert lp["tokens"][: len(prompt_ids)] == [decoded(demo_vocab, i) for i in prompt_ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v is not None for v in lp["token_logprobs"][1:])
    assert len(lp["tokens"]) == len(prompt_ids) + body["usage"]["completion_tokens"]
    raw = choice["prompt_logprobs"]
    assert raw[0] is None and len(raw) == len(prompt_ids)
    first = raw[1][str(prompt_ids[1])]
    assert set(first) == {"logprob", "rank", "decoded_token"}

    only = await post_json(client, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1})
    assert only["choices"][0]["text"] == prompt
    assert len(only["choices"][0]["logprobs"]["tokens"]) == len(prompt_ids)


# --- streaming --------------------------------------------------------------------------------


async def test_streamed_chat_deltas_rebuild_the_text_and_carry_every_logprob(make_client: Any) -> None:
    client = await make_client(tokens_per_step="vary")
    full = await post_json(client, "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=2))
    resp = await client.post(
        "/v1/chat/completions",
        json=chat_body(logprobs=True, top_logprobs=2, stream=True, stream_options={"include_usage": True}),
    )
    events = await read_sse(resp)
    assert events[-1] == "[DONE]"
    first, *content_chunks, usage_chunk, _ = events
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["logprobs"] is None and "prompt_token_ids" in first
    assert (
        usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == full["usage"]["completion_tokens"]
    )
    assert "prompt_tokens_details" not in usage_chunk["usage"]

    text = "".join(c["choices"][0]["delta"]["content"] for c in content_chunks)
    entries = [e for c in content_chunks for e in c["choices"][0]["logprobs"]["content"]]
    assert text == full["choices"][0]["message"]["content"]
    assert entries == full["choices"][0]["logprobs"]["content"]
    assert len(entries) == usage_chunk["usage"]["completion_tokens"]
    held_back = [c for c in content_chunks if c["choices"][0]["delta"]["content"] == ""]
    assert held_back and all(c["choices"][0]["logprobs"]["content"] for c in held_back)
    assert max(len(c["choices"][0]["logprobs"]["content"]) for c in content_chunks) > 1
    finishes = [c["choices"][0]["finish_reason"] for c in content_chunks]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert "stop_reason" in content_chunks[-1]["choices"][0] and "stop_reason" not in content_chunks[0]["choices"][0]


async def test_chat_echo_prepends_the_last_assistant_message(client: Any) -> None:
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Well, "}]
    body = await post_json(client, "/v1/chat/completions", {"messages": messages, "echo": True})
    assert body["choices"][0]["message"]["content"] == "Well, " + DEFAULT_REPLY
    events = await read_sse(
        await client.post("/v1/chat/completions", json={"messages": messages, "echo": True, "stream": True})
    )
    assert events[1]["choices"][0]["delta"] == {"content": "Well, "}
    assert events[1]["choices"][0]["logprobs"] is None


async def test_continuous_usage_stats_count_tokens_so_far(client: Any) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    events = await read_sse(
        await client.post("/v1/completions", json={"prompt": "x", "stream": True, "stream_options": options})
    )
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts == [*range(1, 17), 16]  # one per step, then the final usage chunk


async def test_one_token_per_step_by_default(client: Any) -> None:
    events = await read_sse(await client.post("/v1/chat/completions", json=chat_body(logprobs=True, stream=True)))
    chunks = [e for e in events[1:] if e != "[DONE]"]
    assert all(len(c["choices"][0]["logprobs"]["content"]) == 1 for c in chunks)
    assert not any("usage" in c for c in chunks)


async def test_streamed_completions_offsets_follow_the_streamed_text(client: Any, demo_vocab: Vocab) -> None:
    request = {"prompt": "hello", "max_tokens": 40, "logprobs": 1}
    full = await post_json(client, "/v1/completions", request)
    events = await read_sse(await client.post("/v1/completions", json={**request, "stream": True}))
    chunks = events[:-1]
    assert events[-1] == "[DONE]"
    # vLLM 0.32.0 (as recorded in tests/captures/real): no usage key in content chunks; the finishing
    # chunk carries the system fingerprint
    assert all(set(c) == {"id", "object", "created", "model", "choices"} for c in chunks[:-1])
    assert set(chunks[-1]) == {"id", "object", "created", "model", "choices", "system_fingerprint"}
    text = ""
    for chunk in chunks:
        choice = chunk["choices"][0]
        assert choice["logprobs"]["text_offset"][0] == len(text)  # continues from the text so far
        text += choice["text"]
    assert text == full["choices"][0]["text"]
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks) == full["usage"]["completion_tokens"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_streamed_completions_echo_comes_once_in_the_first_chunk(client: Any, demo_vocab: Vocab) -> None:
    events = await read_sse(
        await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3, "echo": True, "stream": True})
    )
    first = events[0]["choices"][0]
    assert first["text"].startswith("hello")
    assert first["prompt_token_ids"] == demo_vocab.encode("hello")
    assert all(not e["choices"][0]["text"].startswith("hello") for e in events[1:-1])


async def test_stream_interval_groups_tokens_after_the_first(client: Any) -> None:
    events = await read_sse(
        await client.post("/v1/chat/completions", json=chat_body(logprobs=True, stream=True, stream_interval=4))
    )
    sizes = [len(e["choices"][0]["logprobs"]["content"]) for e in events[1:-1]]
    assert sizes[0] == 1 and set(sizes[1:-1]) == {4}


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "message", "param"),
    [
        (
            "/v1/chat/completions",
            chat_body(logprobs=True, top_logprobs=21),
            400,
            "Requested sample logprobs of 21, which is greater than max allowed: 20",
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            chat_body(top_logprobs=3),
            400,
            "when using `top_logprobs`, `logprobs` must be set to true.",
            "top_logprobs",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "logprobs": 25},
            400,
            "Requested sample logprobs of 25, which is greater than max allowed: 20",
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            {**chat_body(), "model": "other"},
            404,
            "The model `other` does not exist.",
            "model",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "Stream options can only be defined when `stream=True`.",
            "stream_options",
        ),
    ],
)
async def test_invalid_requests_get_vllm_errors(
    client: Any, path: str, body: dict[str, Any], status: int, message: str, param: str
) -> None:
    resp = await client.post(path, json=body)
    assert resp.status == status
    error = (await resp.json())["error"]
    assert error == {
        "message": message,
        "type": "NotFoundError" if status == 404 else "BadRequestError",
        "param": param,
        "code": status,
    }


@pytest.mark.parametrize(("fields", "message", "param"), [
    ({"logprobs": True, "top_logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20",
     "logprobs"),
    ({"logit_bias": {"99999": 5}}, "token_id(s) [99999] in logit_bias contain out-of-vocab token ids. "
                                   "Vocabulary size: ", "logit_bias"),
])
async def test_engine_refusals_of_a_streamed_request_come_in_band_after_a_200(
    client: Any, fields: dict[str, Any], message: str, param: str
) -> None:
    # vLLM's engine validates when the request is added, inside the stream generator: HTTP 200,
    # one error frame (status 400 inside it), then [DONE]. A whole request gets the same as a 400.
    events = await read_sse(await client.post("/v1/chat/completions", json=chat_body(stream=True, **fields)))
    assert len(events) == 2 and events[1] == "[DONE]"
    error = events[0]["error"]
    assert error["message"].startswith(message) and (error["param"], error["code"]) == (param, 400)
    whole = await client.post("/v1/chat/completions", json=chat_body(**fields))
    assert whole.status == 400 and (await whole.json())["error"] == error


async def test_max_logprobs_is_configurable(make_client: Any) -> None:
    client = await make_client(max_logprobs=5)
    resp = await client.post("/v1/chat/completions", json=chat_body(logprobs=True, top_logprobs=6))
    assert (await resp.json())["error"]["message"].endswith("greater than max allowed: 5")


async def test_models_and_health(client: Any) -> None:
    models = await (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [(MODEL, "model", "vllm")]
    assert (await client.get("/health")).status == 200


async def test_same_request_same_logprobs_other_seed_other_logprobs(make_client: Any) -> None:
    request = chat_body(logprobs=True, top_logprobs=5)
    a = await make_client(seed=1)
    b = await make_client(seed=2)
    first = await post_json(a, "/v1/chat/completions", request)
    again = await post_json(a, "/v1/chat/completions", request)
    other = await post_json(b, "/v1/chat/completions", request)
    assert first["choices"][0]["logprobs"] == again["choices"][0]["logprobs"]
    assert first["choices"][0]["logprobs"] != other["choices"][0]["logprobs"]


# --- fault hooks and stats --------------------------------------------------------------------


async def stats(client: Any) -> dict[str, int]:
    return await (await client.get("/sim/stats")).json()


async def wait_for_stat(client: Any, name: str, value: int) -> dict[str, int]:
    for _ in range(200):
        current = await stats(client)
        if current[name] >= value:
            return current
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name} never reached {value}: {current}")


async def test_http500_fault_answers_a_vllm_error_body(client: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat_body(), headers={"x-sim-fault": "http500"})
    assert resp.status == 500
    error = (await resp.json())["error"]
    assert error["type"] == "InternalServerError" and error["code"] == 500
    resp = await client.post("/v1/completions", json={"prompt": "x", "x_sim_fault": "http503"})
    assert resp.status == 503


async def test_refuse_fault_drops_the_connection_without_a_response(client: Any) -> None:
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await client.post("/v1/chat/completions", json=chat_body(), headers={"x-sim-fault": "refuse"})


async def test_die_mid_stream_sends_some_frames_then_breaks_the_body(client: Any) -> None:
    resp = await client.post(
        "/v1/chat/completions",
        json=chat_body(stream=True),
        headers={"x-sim-fault": "die_mid_stream", "x-sim-die-after": "4"},
    )
    assert resp.status == 200
    frames = 0
    with pytest.raises(aiohttp.ClientPayloadError):
        while line := await resp.content.readline():
            frames += line.startswith(b"data: ")
    assert frames == 4
    assert (await wait_for_stat(client, "requests_faulted", 1))["in_flight"] == 0


async def test_error_mid_stream_ends_with_an_error_frame_then_done(client: Any) -> None:
    resp = await client.post(
        "/v1/completions",
        json={"prompt": "x", "stream": True},
        headers={"x-sim-fault": "error_mid_stream", "x-sim-die-after": "2"},
    )
    events = await read_sse(resp)
    assert len(events) == 4 and events[-1] == "[DONE]"
    assert events[2]["error"]["type"] == "InternalServerError" and events[2]["error"]["code"] == 500
    assert (await stats(client))["requests_faulted"] == 1


async def test_hang_is_cancelled_when_the_client_gives_up(client: Any) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await client.post(
            "/v1/completions",
            json={"prompt": "x"},
            headers={"x-sim-fault": "hang"},
            timeout=aiohttp.ClientTimeout(total=0.2),
        )
    assert (await wait_for_stat(client, "requests_cancelled", 1))["in_flight"] == 0


async def test_hang_before_first_token_sends_headers_only(client: Any) -> None:
    resp = await client.post(
        "/v1/chat/completions", json=chat_body(stream=True), headers={"x-sim-fault": "hang_before_first_token"}
    )
    assert resp.status == 200
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(resp.content.readline(), 0.2)
    resp.close()
    await wait_for_stat(client, "requests_cancelled", 1)


async def test_client_disconnect_mid_stream_is_counted_as_cancelled(make_client: Any) -> None:
    client = await make_client(step_delay_ms=20)
    resp = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert (await resp.content.readline()).startswith(b"data: ")
    assert (await stats(client))["in_flight"] == 1
    resp.close()  # the client goes away before the stream ends
    after = await wait_for_stat(client, "requests_cancelled", 1)
    assert after == {
        "requests_started": 1,
        "requests_finished": 0,
        "requests_rejected": 0,
        "requests_faulted": 0,
        "requests_cancelled": 1,
        "requests_errored": 0,
        "in_flight": 0,
    }


async def test_stats_count_outcomes_and_recent_requests_are_kept(client: Any) -> None:
    await post_json(client, "/v1/chat/completions", chat_body())
    await client.post("/v1/chat/completions", json=chat_body(top_logprobs=2))
    snapshot = await stats(client)
    assert (snapshot["requests_started"], snapshot["requests_finished"], snapshot["requests_rejected"]) == (2, 1, 1)
    recent = await (await client.get("/sim/requests")).json()
    assert [r["body"].get("top_logprobs") for r in recent] == [None, 2]
    await client.post("/sim/reset")
    assert (await stats(client))["requests_started"] == 0
    assert client.server.app[SIMULATOR_KEY].stats.started == 0


async def test_slow_fault_keeps_the_request_in_flight_between_steps(client: Any) -> None:
    request = client.post(
        "/v1/completions",
        json={"prompt": "x", "max_tokens": 3},
        headers={"x-sim-fault": "slow", "x-sim-delay-ms": "100"},
    )
    task = asyncio.ensure_future(request)
    await wait_for_stat(client, "requests_started", 1)
    assert (await stats(client))["in_flight"] == 1  # three 100 ms steps still to go
    assert (await task).status == 200
    assert (await stats(client))["requests_finished"] == 1


async def test_unknown_fault_is_a_400_naming_the_hook(client: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat_body(), headers={"x-sim-fault": "explode"})
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "x-sim-fault"


# --- a real tokenizer -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen2_vocab(shared_dir: Any) -> Vocab:
    return load_directory(shared_dir / "qwen2")


async def test_qwen2_chat_splits_emoji_and_cjk_into_lossy_tokens(aiohttp_client: Any, qwen2_vocab: Vocab) -> None:
    client = await aiohttp_client(create_app(qwen2_vocab, "Qwen/Qwen2-0.5B-Instruct"))
    body = await post_json(
        client,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hello"}],
            "logprobs": True,
            "top_logprobs": 5,
            "return_token_ids": True,
        },
    )
    choice = body["choices"][0]
    assert choice["message"]["content"] == DEFAULT_REPLY
    assert body["usage"]["prompt_tokens"] == 9  # <|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n
    assert choice["token_ids"][-1] == 151645  # <|im_end|>
    tokens = [e["token"] for e in choice["logprobs"]["content"]]
    joined = b"".join(qwen2_vocab.token_bytes(i) for i in choice["token_ids"][:-1])
    assert joined == DEFAULT_REPLY.encode()
    assert "" in tokens[:-1], "the lead of 👋 or 🦀 is spelled empty, as vLLM 0.32 spells it"
    assert "".join(tokens) == DEFAULT_REPLY  # the completing tokens spell whole characters


async def test_qwen2_completions_collide_on_empty_special_strings(aiohttp_client: Any, qwen2_vocab: Vocab) -> None:
    client = await aiohttp_client(create_app(qwen2_vocab, "qwen2"))
    request = {"prompt": "hello", "max_tokens": 20, "logprobs": 5}
    by_string = await post_json(client, "/v1/completions", request)
    by_id = await post_json(client, "/v1/completions", {**request, "return_tokens_as_token_ids": True})
    pairs = zip(
        by_string["choices"][0]["logprobs"]["top_logprobs"],
        by_id["choices"][0]["logprobs"]["top_logprobs"],
        strict=True,
    )
    assert any(len(s) < len(i) for s, i in pairs)
