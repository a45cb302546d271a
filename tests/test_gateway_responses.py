"""/v1/responses end to end: OpenAI SDK (strict validation) -> gateway -> vLLM-dialect simulator."""

import json
from pathlib import Path

import aiohttp
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.vocab import load_bpe_files
from tests.e2e import LOGPROBS, assert_exact_logprobs, start_stack

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
# The demo tokenizer has no CJK or emoji merges: each of these characters splits into byte tokens.
SPLIT_TEXT = "Hi 👋🏽 根据 🦀 done."


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("k", [0, 1, 5, 20])
async def test_non_streaming_logprobs_are_exact(aiohttp_server, vocab, api, k):
    stack = await start_stack(aiohttp_server, vocab, api=api, replies={"hello": SPLIT_TEXT})
    response = await stack.client.responses.create(model=stack.model, input="hello", include=LOGPROBS,
                                                   top_logprobs=k)
    assert response.status == "completed" and response.top_logprobs == k
    part = response.output[0].content[0]
    assert part.text == SPLIT_TEXT
    assert_exact_logprobs(part, k)
    # The upstream counted the end-of-sequence token too; it spells no text and is set aside.
    assert len(part.logprobs) == response.usage.output_tokens - 1
    assert any(len(e.bytes) and not _valid_utf8(bytes(e.bytes)) for e in part.logprobs)


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("k", [0, 1, 5, 20])
async def test_streamed_final_response_matches_and_deltas_concatenate(aiohttp_server, vocab, api, k):
    stack = await start_stack(aiohttp_server, vocab, api=api, replies={"hello": SPLIT_TEXT},
                              tokens_per_step="vary")
    async with stack.client.responses.stream(model=stack.model, input="hello", include=LOGPROBS,
                                             top_logprobs=k) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    part = final.output[0].content[0]
    assert part.text == SPLIT_TEXT
    assert_exact_logprobs(part, k)
    raw = [event.model_dump(mode="json", exclude_unset=True) for event in events]
    for frame in raw:
        STREAM_EVENT.validate_python(frame)
    assert [frame["sequence_number"] for frame in raw] == list(range(len(raw)))
    types = [frame["type"] for frame in raw]
    deltas = [frame for frame in raw if frame["type"] == "response.output_text.delta"]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert types[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", "response.completed"]
    assert "".join(frame["delta"] for frame in deltas) == SPLIT_TEXT
    streamed = [entry for frame in deltas for entry in frame["logprobs"]]
    final_entries = [entry.model_dump(mode="json") for entry in part.logprobs]
    assert streamed == final_entries
    done = next(frame for frame in raw if frame["type"] == "response.output_text.done")
    assert done["logprobs"] == final_entries
    for frame in deltas:  # a delta carries exactly the tokens whose text it adds
        assert b"".join(bytes(e["bytes"]) for e in frame["logprobs"]) == frame["delta"].encode()


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_length_cap_gives_an_incomplete_response(aiohttp_server, vocab, api):
    stack = await start_stack(aiohttp_server, vocab, api=api, replies={"hello": SPLIT_TEXT})
    response = await stack.client.responses.create(model=stack.model, input="hello", include=LOGPROBS,
                                                   top_logprobs=2, max_output_tokens=4)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert len(response.output[0].content[0].logprobs) == response.usage.output_tokens == 4
    stream = await stack.client.responses.create(model=stack.model, input="hello", include=LOGPROBS,
                                                 top_logprobs=2, max_output_tokens=4, stream=True)
    types = [event.type async for event in stream]
    assert types[-1] == "response.incomplete" and "response.completed" not in types


async def test_logprobs_only_when_included(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies={"hello": SPLIT_TEXT})
    response = await stack.client.responses.create(model=stack.model, input="hello", top_logprobs=3)
    assert response.output[0].content[0].logprobs == []
    assert response.output[0].content[0].text == SPLIT_TEXT


async def test_vendor_fields_are_forwarded_and_upstream_asks_for_ids_and_k_plus_one(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    response = await stack.client.responses.create(model=stack.model, input="hi", include=LOGPROBS, top_logprobs=3,
                                                   max_output_tokens=4, extra_body={"ignore_eos": True, "top_k": 5})
    assert response.status == "incomplete"
    [received] = list(stack.stats.recent)
    body = received["body"]
    assert body["ignore_eos"] is True and body["top_k"] == 5 and body["max_tokens"] == 4
    assert body["logprobs"] is True and body["top_logprobs"] == 4 and body["return_tokens_as_token_ids"] is True
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert "include" not in body and "input" not in body


QWEN2 = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "qwen2"


@pytest.mark.skipif(not QWEN2.is_dir(), reason=f"Qwen2 tokenizer files not found at {QWEN2}")
@pytest.mark.parametrize("stream", [False, True])
async def test_the_users_curl_request_with_qwen2_gives_exact_bytes_for_cjk(aiohttp_server, stream):
    vocab = load_bpe_files(QWEN2 / "vocab.json", QWEN2 / "merges.txt")
    tokenizer = {"vocab": str(QWEN2 / "vocab.json"), "merges": str(QWEN2 / "merges.txt")}
    stack = await start_stack(aiohttp_server, vocab, model="Qwen/Qwen2-0.5B", tokenizer=tokenizer,
                              replies={"hi": "Hi 根据 🦀"})
    body = {"model": "Qwen/Qwen2-0.5B", "input": "hi", "max_output_tokens": 4,
            "include": ["message.output_text.logprobs"], "top_logprobs": 3, "ignore_eos": True, "stream": stream}
    async with aiohttp.ClientSession() as session, session.post(stack.url("/v1/responses"), json=body) as reply:
        assert reply.status == 200
        if stream:
            frames = [json.loads(line[6:]) for line in (await reply.text()).splitlines() if line.startswith("data: ")]
            payload = frames[-1]["response"]
        else:
            payload = await reply.json()
    entries = payload["output"][0]["content"][0]["logprobs"]
    # Qwen2 splits " 根据" as " 根"-prefix (20 e6 a0), its last byte (b9), 据 (e6 8d ae): exact, not U+FFFD.
    assert [bytes(e["bytes"]) for e in entries] == [b"Hi", b" \xe6\xa0", b"\xb9", "据".encode()]
    assert [e["token"] for e in entries] == ["Hi", " \\xe6\\xa0", "\\xb9", "据"]
    assert payload["output"][0]["content"][0]["text"] == "Hi 根据"
    assert all(len(e["top_logprobs"]) == 3 for e in entries)


@pytest.mark.parametrize("stream", [False, True])
async def test_model_without_tokenizer_keeps_the_text_right(aiohttp_server, vocab, stream):
    # No tokenizer: vLLM's lossy strings ("�") come through; the text must still be the upstream's.
    stack = await start_stack(aiohttp_server, vocab, replies={"hello": SPLIT_TEXT}, tokenizer={})
    if stream:
        async with stack.client.responses.stream(model=stack.model, input="hello", include=LOGPROBS,
                                                 top_logprobs=2) as events:
            response = await events.get_final_response()
    else:
        response = await stack.client.responses.create(model=stack.model, input="hello", include=LOGPROBS,
                                                       top_logprobs=2)
    part = response.output[0].content[0]
    assert part.text == SPLIT_TEXT
    assert len(part.logprobs) == response.usage.output_tokens - 1
    if not stream:  # the whole text is known: alignment recovers every byte
        assert b"".join(bytes(e.bytes) for e in part.logprobs) == SPLIT_TEXT.encode()
