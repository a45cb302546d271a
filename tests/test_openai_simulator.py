"""The OpenAI-conventions simulator writes what api.openai.com writes, where a client can tell.

Each test targets one convention and is written so that a simulator without it would fail. Expected
token spellings are written out literally (or derived with the standard library), never with the
simulator's own helpers. Bodies are also validated with the `openai` SDK's types.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.logprobs.vocab import Vocab
from gateway.simulator.openai import SIMULATOR_KEY, create_app, main  # noqa: F401 (conftest uses create_app)
from gateway.simulator.script import DEFAULT_REPLY
from gateway.simulator.testing import is_descending, parse_sse, post_json, read_sse

MODEL = "gpt-sim"
CONTROL_NAMES = {"<|im_end|>", "<|endoftext|>", "<|im_start|>"}
# The demo BPE spells the default reply with lone-byte tokens for 👋, 根, 据 and 🦀.
DEMO_CHAT_TOKENS = [
    *["H", "i", " there", " ", "\\xf0", "\\x9f", "\\x91", "\\x8b", " "],
    *["\\xe6", "\\xa0", "\\xb9", "\\xe6", "\\x8d", "\\xae", " the", " plan", " "],
    *["\\xf0", "\\x9f", "\\xa6", "\\x80", "."],
]


def chat(text: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **fields}


def completion(prompt: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **fields}


async def post_error(client: Any, path: str, body: dict[str, Any], status: int = 400) -> dict[str, Any]:
    resp = await client.post(path, json=body)
    assert resp.status == status, await resp.text()
    error = await resp.json()
    assert set(error) == {"error"} and set(error["error"]) == {"message", "type", "param", "code"}
    return error["error"]


def escaped(data: bytes) -> str:
    """OpenAI's chat spelling by the standard library: undecodable bytes as literal \\xNN."""
    return data.decode("utf-8", errors="backslashreplace")


def sampled_of(entry: dict[str, Any]) -> tuple[str, list[int] | None]:
    return entry["token"], entry["bytes"]


# --- chat: entries -----------------------------------------------------------------------------------


async def test_chat_tokens_escape_undecodable_bytes_and_bytes_are_exact(client: Any, demo_vocab: Vocab) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(logprobs=True, top_logprobs=3))
    raw = await resp.text()
    body = await resp.json()
    ChatCompletion.model_validate(body)
    choice = body["choices"][0]
    assert choice["message"]["content"] == DEFAULT_REPLY and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["refusal"] is None
    content = choice["logprobs"]["content"]
    assert all(list(e) == ["token", "logprob", "bytes", "top_logprobs"] for e in content)
    assert [e["token"] for e in content] == DEMO_CHAT_TOKENS
    assert '"token":"\\\\xf0"' in raw, "a literal backslash-x in the JSON text, not a U+00F0 character"
    ids = demo_vocab.encode(DEFAULT_REPLY)
    assert [bytes(e["bytes"]) for e in content] == [demo_vocab.token_bytes(i) for i in ids]
    assert b"".join(bytes(e["bytes"]) for e in content) == DEFAULT_REPLY.encode()
    # the end token is neither an entry nor a completion token
    assert len(content) == len(ids) == body["usage"]["completion_tokens"]


async def test_chat_alternatives_use_the_same_spelling_and_control_tokens_have_no_bytes(client: Any) -> None:
    body = await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=5))
    alternatives = [t for e in body["choices"][0]["logprobs"]["content"] for t in e["top_logprobs"]]
    assert all(list(t) == ["token", "logprob", "bytes"] for t in alternatives)
    control = [t for t in alternatives if t["bytes"] is None]
    assert control and all(t["token"] in CONTROL_NAMES for t in control)
    plain = [t for t in alternatives if t["bytes"] is not None]
    assert all(t["token"] == escaped(bytes(t["bytes"])) for t in plain)
    assert any("\\x" in t["token"] for t in plain), "lone high bytes are among the alternatives"


async def test_qwen2_token_mixes_text_and_escapes(qwen_client: Any) -> None:
    resp = await qwen_client.post("/v1/chat/completions", json=chat(logprobs=True))
    raw = await resp.text()
    content = (await resp.json())["choices"][0]["logprobs"]["content"]
    assert [(e["token"], e["bytes"]) for e in content[2:5]] == [
        (" \\xf0\\x9f\\x91", [32, 240, 159, 145]),
        ("\\x8b", [139]),
        (" \\xe6\\xa0", [32, 230, 160]),
    ]
    assert '"token":" \\\\xf0\\\\x9f\\\\x91"' in raw


async def test_top_logprobs_are_the_true_top_k_without_the_sampled_token_forced_in(client: Any) -> None:
    few = await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=2))
    many = await post_json(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=20))
    few_content = few["choices"][0]["logprobs"]["content"]
    many_content = many["choices"][0]["logprobs"]["content"]
    outside_two = 0
    for small, large in zip(few_content, many_content, strict=True):
        tops, all_tops = small["top_logprobs"], large["top_logprobs"]
        assert len(tops) == 2 and len(all_tops) == 20
        assert tops == all_tops[:2], "a shorter list is the head of the longer one"
        assert is_descending([t["logprob"] for t in all_tops])
        listed = [sampled_of(t) for t in tops]
        if small["logprob"] > tops[-1]["logprob"]:
            assert sampled_of(small) in listed, "a token above the k-th value must be listed"
        if sampled_of(small) not in listed:
            outside_two += 1
            assert small["logprob"] < tops[-1]["logprob"], "the sampled token ranks below the list, not appended"
    assert outside_two >= 3
    assert any(sampled_of(e) not in [sampled_of(t) for t in e["top_logprobs"]] for e in many_content), (
        "some sampled tokens rank below 20"
    )
    assert any(
        sampled_of(e) in [sampled_of(t) for t in e["top_logprobs"]]
        and sampled_of(e["top_logprobs"][0]) != sampled_of(e)
        for e in many_content
    ), "the sampled token need not be first"
    bare = await post_json(client, "/v1/chat/completions", chat(logprobs=True))
    assert all(e["top_logprobs"] == [] for e in bare["choices"][0]["logprobs"]["content"])


async def test_chat_logprob_errors_and_absence(client: Any) -> None:
    for fields in ({"top_logprobs": 3}, {"top_logprobs": 0, "logprobs": False}):
        assert await post_error(client, "/v1/chat/completions", chat(**fields)) == {
            "message": "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
            "type": "invalid_request_error",
            "param": "top_logprobs",
            "code": None,
        }
    too_many = await post_error(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs=21))
    assert too_many["message"] == "Invalid value for 'top_logprobs': must be less than or equal to 20."
    assert (too_many["param"], too_many["code"]) == ("top_logprobs", None)
    wrong_type = await post_error(client, "/v1/chat/completions", chat(logprobs=True, top_logprobs="3"))
    assert wrong_type["code"] == "invalid_type"
    unknown = await post_error(client, "/v1/chat/completions", {**chat(), "model": "gpt-nope"}, status=404)
    assert unknown["code"] == "model_not_found"
    body = await post_json(client, "/v1/chat/completions", chat())
    assert "logprobs" in body["choices"][0] and body["choices"][0]["logprobs"] is None


async def test_a_cut_in_the_middle_of_a_character_ends_in_a_replacement_char(client: Any) -> None:
    body = await post_json(client, "/v1/chat/completions", chat(max_tokens=6))
    assert body["choices"][0]["message"]["content"] == "Hi there \ufffd"
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 6
    events = await read_sse(await client.post("/v1/chat/completions", json=chat(max_tokens=6, stream=True)))
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    assert text == "Hi there \ufffd"


# --- chat: streaming ---------------------------------------------------------------------------------------


async def test_chat_stream_one_token_per_chunk_with_valid_text_deltas(client: Any) -> None:
    request = chat(logprobs=True, top_logprobs=2)
    full = await post_json(client, "/v1/chat/completions", request)
    stream = {**request, "stream": True, "stream_options": {"include_usage": True}}
    events = await read_sse(await client.post("/v1/chat/completions", json=stream))
    assert events[-1] == "[DONE]"
    first, *chunks, final, usage, _ = events
    for chunk in (first, *chunks, final, usage):
        ChatCompletionChunk.model_validate(chunk)
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == first["id"]
        assert isinstance(chunk["obfuscation"], str) and chunk["obfuscation"]
    assert all(c["usage"] is None for c in (first, *chunks, final))
    assert first["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": "", "refusal": None},
        "logprobs": {"content": [], "refusal": None},
        "finish_reason": None,
    }
    entries = [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    assert all(len(c["choices"][0]["logprobs"]["content"]) == 1 for c in chunks), "one token per chunk"
    assert entries == full["choices"][0]["logprobs"]["content"]
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks]
    assert "".join(deltas) == DEFAULT_REPLY
    by_token = list(zip([e["token"] for e in entries], deltas, strict=True))
    assert by_token[4:8] == [("\\xf0", ""), ("\\x9f", ""), ("\\x91", ""), ("\\x8b", "👋")]
    assert final["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert usage["choices"] == [] and usage["usage"] == full["usage"]


async def test_chat_stream_without_logprobs_usage_or_obfuscation(client: Any) -> None:
    request = chat(stream=True, stream_options={"include_obfuscation": False})
    events = await read_sse(await client.post("/v1/chat/completions", json=request))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("logprobs" not in c["choices"][0] for c in chunks)
    assert all("obfuscation" not in c and "usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    error = await post_error(client, "/v1/chat/completions", chat(stream_options={"include_usage": True}))
    assert error["param"] == "stream_options"


async def test_qwen2_stream_delta_carries_the_complete_part_of_a_partial_token(qwen_client: Any) -> None:
    events = await read_sse(await qwen_client.post("/v1/chat/completions", json=chat(logprobs=True, stream=True)))
    pairs = [
        (c["choices"][0]["logprobs"]["content"][0]["token"], c["choices"][0]["delta"]["content"]) for c in events[1:-2]
    ]
    assert pairs[2:4] == [(" \\xf0\\x9f\\x91", " "), ("\\x8b", "👋")]


# --- legacy completions -------------------------------------------------------------------------------------


async def test_completions_spell_partial_tokens_with_the_bytes_prefix(client: Any) -> None:
    body = await post_json(client, "/v1/completions", completion(logprobs=2))
    Completion.model_validate(body)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 16, "max_tokens is 16"
    logprobs = choice["logprobs"]
    assert list(logprobs) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    expected = [t if "\\x" not in t else "bytes:" + t for t in DEMO_CHAT_TOKENS[:16]]
    assert logprobs["tokens"] == expected
    assert choice["text"] == "Hi there 👋 根据 the"
    explicit_null = await post_json(client, "/v1/completions", completion(max_tokens=None))
    assert explicit_null["usage"]["completion_tokens"] == 16, "null is the default too (the spec's reading)"
    keys = [k for top in logprobs["top_logprobs"] for k in top]
    assert any(k.startswith("bytes:\\x") for k in keys), "dict keys use the same spelling"
    assert not any(k.startswith("\\x") for k in keys)


async def test_qwen2_completions_escape_every_byte_after_the_prefix(qwen_client: Any) -> None:
    body = await post_json(qwen_client, "/v1/completions", completion(logprobs=0, max_tokens=5))
    tokens = body["choices"][0]["logprobs"]["tokens"]
    assert tokens == ["Hi", " there", "bytes:\\x20\\xf0\\x9f\\x91", "bytes:\\x8b", "bytes:\\x20\\xe6\\xa0"]
    assert body["choices"][0]["text"] == "Hi there 👋 \ufffd", "cut mid-character"


async def test_completions_top_dicts_add_the_sampled_token_when_outside_the_top_k(client: Any) -> None:
    body = await post_json(client, "/v1/completions", completion(logprobs=2, max_tokens=23))
    logprobs = body["choices"][0]["logprobs"]
    sizes = set()
    for token, logprob, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        keys = list(top)
        assert is_descending(list(top.values()))
        if token in keys[:2]:
            assert len(top) == 2 and top[token] == logprob
        else:
            assert len(top) == 3 and keys[2] == token and top[token] == logprob, "k+1: the sampled token last"
        sizes.add(len(top))
    assert sizes == {2, 3}
    zero = await post_json(client, "/v1/completions", completion(logprobs=0, max_tokens=4))
    z = zero["choices"][0]["logprobs"]
    assert z["top_logprobs"] == [{t: lp} for t, lp in zip(z["tokens"], z["token_logprobs"], strict=True)]


async def test_text_offsets_count_code_points_from_the_start_of_the_prompt(client: Any) -> None:
    prompt = "héllo"
    body = await post_json(client, "/v1/completions", completion(prompt, logprobs=1, max_tokens=12))
    logprobs, text = body["choices"][0]["logprobs"], body["choices"][0]["text"]
    assert text == "Hi there 👋 根"
    offsets = logprobs["text_offset"]
    assert offsets[0] == len(prompt) == 5, "even without echo, offsets start after the prompt"
    assert offsets == [5, 6, 7, 13, 14, 14, 14, 14, 15, 16, 16, 16]
    whole = prompt + text
    for token, offset in zip(logprobs["tokens"], offsets, strict=True):
        if not token.startswith("bytes:"):
            assert whole[offset : offset + len(token)] == token


async def test_echo_puts_the_prompt_first_with_a_null_first_entry(client: Any) -> None:
    body = await post_json(client, "/v1/completions", completion(logprobs=1, echo=True, max_tokens=2))
    choice = body["choices"][0]
    assert choice["text"] == "helloHi"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["he", "ll", "o", "H", "i"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(isinstance(v, float) for v in logprobs["token_logprobs"][1:])
    assert all(isinstance(v, dict) and 1 <= len(v) <= 2 for v in logprobs["top_logprobs"][1:])
    assert logprobs["text_offset"] == [0, 2, 4, 5, 6]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 2
    scored = await post_json(client, "/v1/completions", completion(logprobs=0, echo=True, max_tokens=0))
    assert scored["choices"][0]["text"] == "hello" and scored["choices"][0]["finish_reason"] == "length"
    assert scored["choices"][0]["logprobs"]["tokens"] == ["he", "ll", "o"]
    assert scored["usage"]["completion_tokens"] == 0
    plain = await post_json(client, "/v1/completions", completion(echo=True, max_tokens=1))
    assert plain["choices"][0] == {"text": "helloH", "index": 0, "logprobs": None, "finish_reason": "length"}


async def test_completions_logprobs_are_capped_at_5(client: Any) -> None:
    assert await post_error(client, "/v1/completions", completion(logprobs=6)) == {
        "message": "Invalid 'logprobs': integer above maximum value. Expected a value <= 5, but got 6 instead.",
        "type": "invalid_request_error",
        "param": "logprobs",
        "code": "integer_above_max_value",
    }
    assert (await post_error(client, "/v1/completions", completion(logprobs=-1)))["code"] == "integer_below_min_value"
    assert (await post_error(client, "/v1/completions", completion(logprobs=True)))["code"] == "invalid_type"
    body = await post_json(client, "/v1/completions", completion(logprobs=5))
    assert all(5 <= len(top) <= 6 for top in body["choices"][0]["logprobs"]["top_logprobs"])
    missing = await post_error(client, "/v1/completions", {"model": MODEL})
    assert (missing["param"], missing["code"]) == ("prompt", "missing_required_parameter")


async def test_completions_stream_per_token_logprobs_usage_and_done(client: Any) -> None:
    request = completion(logprobs=1, echo=True, max_tokens=5)
    full = await post_json(client, "/v1/completions", request)
    stream = {**request, "stream": True, "stream_options": {"include_usage": True}}
    events = await read_sse(await client.post("/v1/completions", json=stream))
    assert events[-1] == "[DONE]"
    echo, *chunks, final, usage, _ = events
    assert echo["choices"][0]["text"] == "hello" and echo["choices"][0]["logprobs"]["token_logprobs"][0] is None
    assert all(len(c["choices"][0]["logprobs"]["tokens"]) == 1 for c in chunks)
    merged: dict[str, list[Any]] = {k: [] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    for part in (echo, *chunks):
        for key, values in part["choices"][0]["logprobs"].items():
            merged[key] += values
    assert merged == full["choices"][0]["logprobs"]
    assert "".join(c["choices"][0]["text"] for c in (echo, *chunks)) == full["choices"][0]["text"]
    assert final["choices"][0] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
    assert usage["choices"] == [] and usage["usage"] == full["usage"]
    assert all(c["usage"] is None for c in (echo, *chunks, final))


# --- shared routes, faults, CLI -----------------------------------------------------------------------------


async def test_models_health_faults_and_stats(client: Any) -> None:
    models = await (await client.get("/v1/models")).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert (await client.get("/health")).status == 200
    limited = await post_error(client, "/v1/chat/completions", chat(x_sim_fault="http429"), status=429)
    assert (limited["type"], limited["code"]) == ("requests", "rate_limit_exceeded")
    resp = await client.post(
        "/v1/chat/completions",
        json=chat(stream=True),
        headers={"x-sim-fault": "error_mid_stream", "x-sim-die-after": "2"},
    )
    frames = parse_sse(await resp.text())
    assert [name for name, _ in frames] == ["data", "data", "data"], "no [DONE] after the error"
    assert frames[-1][1]["error"]["type"] == "server_error"
    await post_json(client, "/v1/completions", completion(max_tokens=1))
    stats = await (await client.get("/sim/stats")).json()
    assert (stats["requests_faulted"], stats["requests_finished"]) == (2, 1)
    assert client.server.app[SIMULATOR_KEY].stats.started == 3


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "OpenAI wire-format simulator" in capsys.readouterr().out
