"""Background responses end to end with the real OpenAI Python SDK: created at once, run to the end
whatever the client does, polled, replayed from any sequence number, followed live, cancelled (the
simulator sees its request dropped), bounded, per key, on every store backend."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import Stack, start_stack
from tests.test_stored_responses import _redis_store, redis_url  # noqa: F401  (the session's redis-server)

LONG = {"max_output_tokens": 60, "extra_body": {"ignore_eos": True}}  # sixty tokens, a few ms apart: time to disconnect


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


@pytest.fixture(params=["sqlite", "redis", "memory"])
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "sqlite":
        return {"backend": "sqlite", "path": str(tmp_path / "responses.sqlite3")}
    if request.param == "memory":
        return {"backend": "memory"}
    return _redis_store(request.getfixturevalue("redis_url"))


async def _poll(stack: Stack, response_id: str, client: openai.AsyncOpenAI | None = None) -> Any:
    for _ in range(400):
        response = await (client or stack.client).responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress"):
            return response
        await asyncio.sleep(0.05)
    raise AssertionError(f"{response_id} still {response.status}")


async def _events(stream: Any) -> list[Any]:
    return [event async for event in stream]


async def test_a_background_response_outlives_its_client_and_replays_from_any_point(aiohttp_server, vocab,
                                                                                     store_config):
    stack = await start_stack(aiohttp_server, vocab, store=store_config, step_delay_ms=5)
    stream = await stack.client.responses.create(model=stack.model, input="hi", background=True, stream=True,
                                                 **LONG)
    seen = []
    async for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    await stream.close()  # the client goes away mid-stream
    response_id = seen[0].response.id
    assert seen[0].type == "response.created" and seen[0].response.background is True
    last = seen[-1].sequence_number

    final = await _poll(stack, response_id)
    assert final.status == "incomplete" and final.background is True  # its 60 tokens, as asked
    assert final.usage.output_tokens == 60 and len(final.output_text) > 0
    assert stack.stats.outcomes["finished"] == 1  # the upstream ran to the end: nobody was reading

    # Resuming from the last event seen, as the SDK does, gives the rest and nothing twice.
    rest = await _events(await stack.client.responses.retrieve(response_id, stream=True, starting_after=last))
    assert [e.sequence_number for e in rest] == list(range(last + 1, last + 1 + len(rest)))
    assert rest[-1].type == "response.incomplete" and rest[-1].response.output_text == final.output_text
    whole = await _events(await stack.client.responses.retrieve(response_id, stream=True))
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert [e.model_dump() for e in whole[last + 1:]] == [e.model_dump() for e in rest]
    assert "".join(e.delta for e in whole if e.type == "response.output_text.delta") == final.output_text
    for after in (0, len(whole) // 2, len(whole) - 2, len(whole) - 1):
        tail = await _events(await stack.client.responses.retrieve(response_id, stream=True, starting_after=after))
        assert [e.sequence_number for e in tail] == list(range(after + 1, len(whole)))
    assert stack.stats.started == 1  # replay never goes upstream

    # It is an ordinary stored response too: the conversation continues from it.
    follow = await stack.client.responses.create(model=stack.model, input="more", previous_response_id=response_id,
                                                 max_output_tokens=5)
    assert follow.status in ("completed", "incomplete")


async def test_poll_follows_a_live_run_and_the_sdk_stream_helper_resumes(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, step_delay_ms=20)
    created = await stack.client.responses.create(model=stack.model, input="hi", background=True)
    assert created.status == "queued" and created.background is True and created.output == []
    # The SDK's own resume path: responses.stream(response_id=..., starting_after=...) follows live events.
    async with stack.client.responses.stream(response_id=created.id, starting_after=1) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert events[0].sequence_number == 2 and events[-1].type == "response.completed"
    assert final.id == created.id and final.status == "completed"
    assert (await stack.client.responses.retrieve(created.id)).output_text == final.output_text


async def test_cancel_drops_the_upstream_request_and_is_idempotent(aiohttp_server, vocab, store_config):
    stack = await start_stack(aiohttp_server, vocab, store=store_config, step_delay_ms=20)
    created = await stack.client.responses.create(model=stack.model, input="hi", background=True,
                                                  max_output_tokens=2000, extra_body={"ignore_eos": True})
    for _ in range(400):  # until the upstream is generating
        polled = await stack.client.responses.retrieve(created.id)
        if polled.status == "in_progress" and polled.output:
            break
        await asyncio.sleep(0.02)
    assert polled.status == "in_progress"
    cancelled = await stack.client.responses.cancel(created.id)
    assert cancelled.id == created.id and cancelled.status == "cancelled"
    for _ in range(200):
        if stack.stats.outcomes["cancelled"]:
            break
        await asyncio.sleep(0.02)
    assert stack.stats.outcomes == {**stack.stats.outcomes, "cancelled": 1, "finished": 0}
    assert (await stack.client.responses.retrieve(created.id)).status == "cancelled"
    again = await stack.client.responses.cancel(created.id)  # idempotent: the final Response again
    assert again.status == "cancelled" and again.id == created.id
    with pytest.raises(openai.BadRequestError):  # a cancelled response cannot be continued
        await stack.client.responses.create(model=stack.model, input="more", previous_response_id=created.id)
    # Its events up to the cancel replay; no terminal event follows them.
    events = await _events(await stack.client.responses.retrieve(created.id, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.output_text.delta"


async def test_the_concurrent_limit_answers_429_and_store_false_is_refused(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, step_delay_ms=20, limits={"background_responses": 1})
    running = await stack.client.responses.create(model=stack.model, input="hi", background=True,
                                                  max_output_tokens=2000, extra_body={"ignore_eos": True})
    with pytest.raises(openai.RateLimitError) as limited:
        await stack.client.responses.create(model=stack.model, input="hi", background=True)
    assert limited.value.status_code == 429 and limited.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.BadRequestError) as unstored:
        await stack.client.responses.create(model=stack.model, input="hi", background=True, store=False)
    assert unstored.value.param == "background"
    await stack.client.responses.cancel(running.id)
    second = await stack.client.responses.create(model=stack.model, input="hi", background=True, max_output_tokens=3)
    assert (await _poll(stack, second.id)).status in ("completed", "incomplete")


async def test_a_failed_upstream_fails_the_background_response(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, upstream_url="http://127.0.0.1:9",
                              upstream_options={"health_interval": 0, "retries": 0})
    created = await stack.client.responses.create(model=stack.model, input="hi", background=True)
    final = await _poll(stack, created.id)
    assert final.status == "failed" and final.error is not None and "unreachable" in final.error.message
    events = await _events(await stack.client.responses.retrieve(created.id, stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]


async def test_other_keys_cannot_see_poll_follow_or_cancel_it(aiohttp_server, vocab, monkeypatch):
    monkeypatch.setenv("GATEWAY_TEST_KEYS", "key-a,key-b")
    stack = await start_stack(aiohttp_server, vocab, step_delay_ms=20, auth={"api_keys_env": "GATEWAY_TEST_KEYS"},
                              api_key="key-a")
    other = stack.client.with_options(api_key="key-b")
    mine = await stack.client.responses.create(model=stack.model, input="hi", background=True,
                                               max_output_tokens=2000, extra_body={"ignore_eos": True})
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.cancel(mine.id)
    with pytest.raises(openai.NotFoundError):
        await _events(await other.responses.retrieve(mine.id, stream=True))
    assert (await stack.client.responses.cancel(mine.id)).status == "cancelled"


async def test_another_gateway_over_the_same_store_polls_and_replays_a_finished_one(aiohttp_server, vocab,
                                                                                    tmp_path):
    store = {"backend": "sqlite", "path": str(tmp_path / "shared.sqlite3")}
    first = await start_stack(aiohttp_server, vocab, store=store, step_delay_ms=5)
    second = await start_stack(aiohttp_server, vocab, store=store,
                               upstream_url=str(first.simulator.make_url("")).rstrip("/"))
    created = await first.client.responses.create(model=first.model, input="hi", background=True, **LONG)
    seen_elsewhere = await second.client.responses.retrieve(created.id)
    assert seen_elsewhere.status in ("queued", "in_progress", "completed")
    if seen_elsewhere.status != "completed":  # live runs are the first process's: it alone can cancel
        with pytest.raises(openai.ConflictError):
            await second.client.responses.cancel(created.id)
    final = await _poll(first, created.id)
    assert (await second.client.responses.retrieve(created.id)).output_text == final.output_text
    events = await _events(await second.client.responses.retrieve(created.id, stream=True, starting_after=3))
    assert events[0].sequence_number == 4 and events[-1].response.output_text == final.output_text


async def test_another_gateway_streams_a_live_one_once_it_is_stored_and_polls_it_in_progress(aiohttp_server, vocab,
                                                                                             tmp_path):
    """Workers and replicas over one store: the process running the response has its live events; another
    one's stream waits for the stored events and replays them whole (not a 400), and its polls say
    `in_progress` once the upstream answered (not `queued` until the end)."""
    store = {"backend": "sqlite", "path": str(tmp_path / "shared.sqlite3")}
    first = await start_stack(aiohttp_server, vocab, store=store, step_delay_ms=20)  # ~1.2 s for 60 tokens
    second = await start_stack(aiohttp_server, vocab, store=store,
                               upstream_url=str(first.simulator.make_url("")).rstrip("/"))
    created = await first.client.responses.create(model=first.model, input="hi", background=True, **LONG)
    assert (await second.client.responses.retrieve(created.id)).status in ("queued", "in_progress")
    stream = asyncio.create_task(_events(await second.client.responses.retrieve(created.id, stream=True,
                                                                                 starting_after=1)))
    statuses = []
    for _ in range(200):
        statuses.append((await second.client.responses.retrieve(created.id)).status)
        if statuses[-1] not in ("queued", "in_progress"):
            break
        await asyncio.sleep(0.02)
    assert "in_progress" in statuses and statuses[-1] == "incomplete", statuses  # max_output_tokens
    events = await asyncio.wait_for(stream, 30)
    final = await _poll(first, created.id)
    assert [e.sequence_number for e in events] == list(range(2, events[-1].sequence_number + 1))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == final.output_text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text


NODE_RETRIEVE_STREAM = """
import OpenAI from "openai";
const client = new OpenAI({ baseURL: process.env.GATEWAY_BASE_URL, apiKey: "test-key", maxRetries: 0 });
const created = await client.responses.create({ model: process.env.GATEWAY_MODEL, input: "hi", background: true,
                                                max_output_tokens: 40, ignore_eos: true });
const resumed = [];
for await (const event of await client.responses.retrieve(created.id, { stream: true, starting_after: 2 }))
  resumed.push([event.type, event.sequence_number]);
const final = await client.responses.retrieve(created.id);
console.log(JSON.stringify({ created: created.status, resumed, final: final.status, text: final.output_text }));
"""


async def test_the_node_sdk_retrieves_a_background_response_as_a_stream(aiohttp_server, vocab):
    """The OpenAI Node SDK's `responses.retrieve(id, {stream: true, starting_after})`, which issue 18 found
    refused: it follows the live run from sequence number 3 to its terminal event."""
    try:
        from tests.real_clients import clients_dir  # the npm clients .ci/install-clients puts in the cache
    except ImportError:
        pytest.skip("tests/real_clients.py (with .ci/install-clients) is not in this tree")
    folder = clients_dir()  # skips, naming .ci/install-clients, when the clients are not installed
    stack = await start_stack(aiohttp_server, vocab, step_delay_ms=10)
    node = await asyncio.create_subprocess_exec(
        "node", "--input-type=module", "-e", NODE_RETRIEVE_STREAM, cwd=folder,
        env={**os.environ, "GATEWAY_BASE_URL": stack.url("/v1"), "GATEWAY_MODEL": stack.model},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(node.communicate(), timeout=120)
    assert node.returncode == 0, err.decode()
    result = json.loads(out)
    assert result["created"] == "queued" and result["final"] == "incomplete"  # its 40 tokens, as asked
    sequence = [number for _, number in result["resumed"]]
    assert sequence == list(range(3, 3 + len(sequence)))
    assert result["resumed"][-1][0] == "response.incomplete" and result["text"]
    assert stack.stats.started == 1
