"""Stored responses end to end: previous_response_id replay, retrieve/delete/input_items, retention.

OpenAI SDK (strict validation) -> gateway -> vLLM-dialect simulator, on SQLite and on a real
redis-server started on a free loopback port (skipped, with the reason, where it is not installed).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import redis.asyncio as aioredis
from openai.types.responses import ResponseItem
from pydantic import TypeAdapter

from gateway.config import ConfigError, parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.store import page_items
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from gateway.store.sqlite import SQLiteStore
from gateway.stored_routes import STORE_KEY
from gateway.translate.front_doors import generation_from_responses
from gateway.translate.input_items import stored_input_items
from tests.e2e import LOGPROBS, Stack, start_stack

REPLIES = {"hello": "Hi there.", "and then?": "Then more.", "last one": "Bye now."}


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway redis-server on loopback (no persistence), for the whole session."""
    executable = shutil.which("redis-server")
    if executable is None:
        reason = "redis-server is not installed (Debian: apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: .ci/run must install it")  # a skip in CI would hide the missing step
        pytest.skip(f"{reason}; Redis store tests skipped")
    port = _free_port()
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen([executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(folder)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _redis_store(redis_url: str, **limits: Any) -> dict[str, Any]:
    # A fresh key prefix per test: tests share the one server but never each other's keys.
    return {"backend": "redis", "url": redis_url, "key_prefix": f"test-{uuid.uuid4().hex[:8]}:", **limits}


@pytest.fixture(params=["sqlite", "redis"])
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "sqlite":
        return {"backend": "sqlite", "path": str(tmp_path / "responses.sqlite3")}
    return _redis_store(request.getfixturevalue("redis_url"))


async def _received_messages(stack: Stack) -> list[list[dict[str, Any]]]:
    """The chat messages of every request the simulator got, via its GET /sim/requests."""
    async with aiohttp.ClientSession() as session, session.get(str(stack.simulator.make_url("/sim/requests"))) as reply:
        received = await reply.json()
    return [entry["body"]["messages"] for entry in received if entry["path"] == "/v1/chat/completions"]


async def _second_gateway(aiohttp_server, vocab, first: Stack, store: dict[str, Any]) -> Stack:
    """Another gateway app in front of the same simulator, over the given store."""
    upstream = str(first.simulator.make_url("")).rstrip("/")
    return await start_stack(aiohttp_server, vocab, upstream_url=upstream, store=store, replies=REPLIES)


# --- the conversation ---------------------------------------------------------------------------------------


async def test_previous_response_id_replays_the_conversation_without_old_instructions(aiohttp_server, vocab,
                                                                                      store_config):
    stack = await start_stack(aiohttp_server, vocab, store=store_config, replies=REPLIES)
    first = await stack.client.responses.create(model=stack.model, input="hello", instructions="Be brief.")
    assert first.store is True and first.previous_response_id is None
    assert first.output_text == "Hi there."

    # Turn 2 streams (the save happens before the terminal event); turn 3 builds on turn 2.
    async with stack.client.responses.stream(model=stack.model, input="and then?", previous_response_id=first.id,
                                             instructions="Be kind.") as stream:
        second = await stream.get_final_response()
    assert second.previous_response_id == first.id and second.instructions == "Be kind."
    third = await stack.client.responses.create(model=stack.model, previous_response_id=second.id,
                                                input=[{"role": "user", "content": "last one"}])
    assert third.output_text == "Bye now."

    messages = await _received_messages(stack)
    assert messages[0] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert messages[1] == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hello"},
                           {"role": "assistant", "content": "Hi there."}, {"role": "user", "content": "and then?"}]
    assert messages[2] == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi there."},
                           {"role": "user", "content": "and then?"}, {"role": "assistant", "content": "Then more."},
                           {"role": "user", "content": "last one"}]


async def test_sqlite_conversation_survives_a_gateway_restart(aiohttp_server, vocab, tmp_path):
    store = {"backend": "sqlite", "path": str(tmp_path / "responses.sqlite3")}
    before = await start_stack(aiohttp_server, vocab, store=store, replies=REPLIES)
    first = await before.client.responses.create(model=before.model, input="hello")
    await before.gateway.close()  # runs the app's cleanup: the store closes

    after = await _second_gateway(aiohttp_server, vocab, before, store)
    second = await after.client.responses.create(model=after.model, input="and then?", previous_response_id=first.id)
    assert second.output_text == "Then more."
    assert (await after.client.responses.retrieve(first.id)).output_text == "Hi there."
    assert (await _received_messages(before))[-1][:2] == [{"role": "user", "content": "hello"},
                                                          {"role": "assistant", "content": "Hi there."}]


async def test_two_gateways_sharing_redis_serve_alternate_turns(aiohttp_server, vocab, redis_url):
    store = _redis_store(redis_url)
    one = await start_stack(aiohttp_server, vocab, store=store, replies=REPLIES)
    two = await _second_gateway(aiohttp_server, vocab, one, store)
    first = await one.client.responses.create(model=one.model, input="hello")
    async with two.client.responses.stream(model=two.model, input="and then?", previous_response_id=first.id) as s:
        second = await s.get_final_response()
    third = await one.client.responses.create(model=one.model, input="last one", previous_response_id=second.id)
    assert third.output_text == "Bye now."
    assert [m["content"] for m in (await _received_messages(one))[-1]] == [
        "hello", "Hi there.", "and then?", "Then more.", "last one"]
    items = [item async for item in two.client.responses.input_items.list(third.id, order="asc")]
    assert [item.type for item in items] == ["message"] * 5


# --- the routes, as the SDK sees them -------------------------------------------------------------------------


async def test_retrieve_strips_logprobs_unless_include_asks(aiohttp_server, vocab, store_config):
    stack = await start_stack(aiohttp_server, vocab, store=store_config, replies=REPLIES)
    created = await stack.client.responses.create(model=stack.model, input="hello", include=LOGPROBS, top_logprobs=3)
    entries = created.output[0].content[0].logprobs
    assert entries
    plain = await stack.client.responses.retrieve(created.id)
    assert plain.output[0].content[0].logprobs == []
    assert plain.id == created.id and plain.output_text == created.output_text and plain.usage == created.usage
    full = await stack.client.responses.retrieve(created.id, include=LOGPROBS)
    assert full.model_dump() == created.model_dump()


async def test_delete_then_every_route_says_not_found(aiohttp_server, vocab, store_config):
    stack = await start_stack(aiohttp_server, vocab, store=store_config, replies=REPLIES)
    created = await stack.client.responses.create(model=stack.model, input="hello")
    assert await stack.client.responses.delete(created.id) is None
    with pytest.raises(openai.NotFoundError) as missing:
        await stack.client.responses.retrieve(created.id)
    assert missing.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.input_items.list(created.id)
    with pytest.raises(openai.BadRequestError) as bad:
        await stack.client.responses.create(model=stack.model, input="again", previous_response_id=created.id)
    assert bad.value.code == "previous_response_not_found" and bad.value.param == "previous_response_id"
    assert bad.value.body["message"] == f"Previous response with id '{created.id}' not found."


async def test_each_api_key_sees_only_its_own_responses(aiohttp_server, vocab, store_config, monkeypatch):
    monkeypatch.setenv("GATEWAY_TEST_KEYS", "key-a,key-b")
    stack = await start_stack(aiohttp_server, vocab, store=store_config, replies=REPLIES,
                              auth={"api_keys_env": "GATEWAY_TEST_KEYS"}, api_key="key-a")
    other = stack.client.with_options(api_key="key-b")
    mine = await stack.client.responses.create(model=stack.model, input="hello")

    # Another key: every route answers as for an id that never existed.
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.delete(mine.id)
    with pytest.raises(openai.BadRequestError) as bad:
        await other.responses.create(model=stack.model, input="and then?", previous_response_id=mine.id)
    assert bad.value.code == "previous_response_not_found"
    assert len(await _received_messages(stack)) == 1  # refused before anything (the history) went upstream

    # The owner still has all of it, under the id it was given; a conversation continues within a key.
    again = await stack.client.responses.retrieve(mine.id)
    assert again.id == mine.id and again.output_text == "Hi there."
    assert [item.id for item in (await stack.client.responses.input_items.list(mine.id)).data]
    follow = await stack.client.responses.create(model=stack.model, input="and then?", previous_response_id=mine.id)
    assert follow.previous_response_id == mine.id and follow.output_text == "Then more."
    theirs = await other.responses.create(model=stack.model, input="last one")
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.retrieve(theirs.id)
    assert (await other.responses.retrieve(theirs.id)).output_text == "Bye now."
    assert await stack.client.responses.delete(mine.id) is None


async def test_keys_the_upstream_checks_also_keep_responses_apart(aiohttp_server, vocab):
    # forward_client_key: the gateway checks no key itself, the upstream does; callers still differ by key.
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, auth={"forward_client_key": True},
                              api_key="upstream-key-a")
    created = await stack.client.responses.create(model=stack.model, input="hello")
    with pytest.raises(openai.NotFoundError):
        await stack.client.with_options(api_key="upstream-key-b").responses.retrieve(created.id)
    assert (await stack.client.responses.retrieve(created.id)).id == created.id


async def test_without_keys_every_caller_is_the_same(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    created = await stack.client.responses.create(model=stack.model, input="hello")
    stranger = stack.client.with_options(api_key="whatever-else")  # not checked: no keys are configured
    assert (await stranger.responses.retrieve(created.id)).output_text == "Hi there."
    url = str(stack.gateway.make_url(f"/v1/responses/{created.id}"))
    async with aiohttp.ClientSession() as session, session.get(url) as reply:  # no Authorization header at all
        assert reply.status == 200 and (await reply.json())["id"] == created.id


async def test_delete_answers_the_openai_body(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    created = await stack.client.responses.create(model=stack.model, input="hello")
    async with aiohttp.ClientSession() as session, session.delete(stack.url(f"/v1/responses/{created.id}")) as reply:
        assert reply.status == 200
        assert await reply.json() == {"id": created.id, "object": "response", "deleted": True}


async def test_input_items_list_pages_in_both_orders(aiohttp_server, vocab, store_config):
    stack = await start_stack(aiohttp_server, vocab, store=store_config, replies=REPLIES)
    first = await stack.client.responses.create(model=stack.model, input="hello")
    second = await stack.client.responses.create(model=stack.model, previous_response_id=first.id, input=[
        {"role": "developer", "content": "Stay on topic."},
        {"role": "user", "content": [{"type": "input_text", "text": "and then?"}]}])
    page = await stack.client.responses.input_items.list(second.id)  # desc, 20
    texts = [item.content[0].text for item in page.data]
    assert texts == ["and then?", "Stay on topic.", "Hi there.", "hello"]
    assert [item.role for item in page.data] == ["user", "developer", "assistant", "user"]
    assert page.data[2].id == first.output[0].id  # the previous output, as it was
    assert all(item.id.startswith("msg_") for item in page.data)
    assert page.has_more is False
    # One item a page: the SDK follows `after` until has_more is false.
    ascending = [item async for item in stack.client.responses.input_items.list(second.id, order="asc", limit=1)]
    assert [item.id for item in ascending] == [item.id for item in reversed(page.data)]
    async with aiohttp.ClientSession() as session:
        url = stack.url(f"/v1/responses/{second.id}/input_items")
        async with session.get(url, params={"limit": "2", "after": page.data[0].id}) as reply:
            body = await reply.json()
        assert body["object"] == "list" and body["has_more"] is True
        assert (body["first_id"], body["last_id"]) == (page.data[1].id, page.data[2].id)
        for params, param in [({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"order": "up"}, "order"),
                              ({"after": "msg_nope"}, "after")]:
            async with session.get(url, params=params) as reply:
                assert reply.status == 400
                assert (await reply.json())["error"]["param"] == param


async def test_cancel_refuses_a_response_that_was_not_in_the_background(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    created = await stack.client.responses.create(model=stack.model, input="hello")
    with pytest.raises(openai.BadRequestError):
        await stack.client.responses.cancel(created.id)
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.cancel("resp_unknown")


async def test_store_false_is_echoed_and_keeps_nothing(aiohttp_server, vocab, store_config):
    stack = await start_stack(aiohttp_server, vocab, store=store_config, replies=REPLIES)
    created = await stack.client.responses.create(model=stack.model, input="hello", store=False)
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.retrieve(created.id)


async def test_backend_none_stores_nothing_and_says_so(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, store={"backend": "none"}, replies=REPLIES)
    created = await stack.client.responses.create(model=stack.model, input="hello")
    assert created.store is False
    with pytest.raises(openai.BadRequestError) as bad:
        await stack.client.responses.create(model=stack.model, input="again", previous_response_id=created.id)
    assert bad.value.code == "previous_response_not_found"


async def test_failed_stream_is_not_stored(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    async with stack.client.responses.stream(model=stack.model, input="hello",
                                             extra_body={"x_sim_fault": "die_mid_stream"}) as stream:
        events = [event async for event in stream]
    assert events[-1].type == "response.failed"
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.retrieve(events[-1].response.id)


# --- retention ------------------------------------------------------------------------------------------------


async def test_max_responses_prunes_the_oldest(aiohttp_server, vocab, store_config):
    stack = await start_stack(aiohttp_server, vocab, store={**store_config, "max_responses": 2}, replies=REPLIES)
    made = [await stack.client.responses.create(model=stack.model, input="hello") for _ in range(3)]
    await stack.gateway.app[STORE_KEY].store.flush()  # pruning happens as the writer commits, after the answer
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.retrieve(made[0].id)
    for kept in made[1:]:
        assert (await stack.client.responses.retrieve(kept.id)).id == kept.id


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _response(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "output": []}


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
async def test_age_limit_hides_then_prunes_old_responses(tmp_path, backend):
    clock = _Clock()
    store: SQLiteStore | MemoryStore
    if backend == "sqlite":
        store = SQLiteStore(tmp_path / "r.sqlite3", ttl_seconds=60, max_responses=100, clock=clock)
    else:
        store = MemoryStore(ttl_seconds=60, max_responses=100, clock=clock)
    await store.open()
    try:
        await store.save(_response("resp_old"), [{"id": "msg_1"}])
        clock.now += 61
        assert await store.get("resp_old") is None and await store.input_items("resp_old") is None
        await store.save(_response("resp_new"), [])
        assert await store.get("resp_new") == _response("resp_new")
        clock.now -= 61  # were the old row still there, it would be visible again: it was pruned on save
        assert await store.get("resp_old") is None
        assert not await store.delete("resp_old")
    finally:
        await store.close()


async def test_redis_keys_carry_the_ttl_and_the_index_stays_capped(redis_url):
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    store = RedisStore(redis_url, key_prefix=prefix, ttl_seconds=120, max_responses=3)
    await store.open()
    raw = aioredis.from_url(redis_url)
    try:
        for n in range(5):
            await store.save(_response(f"resp_{n}"), [{"id": f"msg_{n}"}])
        assert await raw.zcard(f"{prefix}index") == 3
        assert sorted([key.decode() async for key in raw.scan_iter(f"{prefix}response:*")]) == [
            f"{prefix}response:resp_{n}" for n in (2, 3, 4)]
        assert 0 < await raw.ttl(f"{prefix}response:resp_4") <= 120
        assert 0 < await raw.ttl(f"{prefix}index") <= 120
        assert await store.input_items("resp_4") == [{"id": "msg_4"}]
        assert await store.delete("resp_4") and not await store.delete("resp_4")
        assert await raw.zcard(f"{prefix}index") == 2
    finally:
        await raw.aclose()
        await store.close()


async def test_sqlite_store_is_safe_for_concurrent_saves(tmp_path):
    store = SQLiteStore(tmp_path / "r.sqlite3", ttl_seconds=60, max_responses=10)
    await store.open()
    try:
        await asyncio.gather(*(store.save(_response(f"resp_{n}"), []) for n in range(25)))
        kept = [n for n in range(25) if await store.get(f"resp_{n}") is not None]
        assert len(kept) == 10
    finally:
        await store.close()
    reopened = SQLiteStore(tmp_path / "r.sqlite3", ttl_seconds=60, max_responses=10)
    await reopened.open()
    try:
        assert all([await reopened.get(f"resp_{n}") is not None for n in kept])
    finally:
        await reopened.close()


async def test_sqlite_count_pruning_is_exact_across_processes_and_for_files_made_before_the_count(tmp_path):
    """Two stores on one file (as two workers are) keep exactly the newest max_responses, whichever saved
    which, and a file written before the row count existed (no response_count table) is counted when opened."""
    path = tmp_path / "r.sqlite3"
    old = sqlite3.connect(path)  # the earlier schema, with 7 responses in it
    old.executescript("CREATE TABLE responses (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, saved_at REAL "
                      "NOT NULL, response BLOB NOT NULL, input_items BLOB NOT NULL, events BLOB);")
    old.executemany("INSERT INTO responses (id, saved_at, response, input_items) VALUES (?, ?, ?, ?)",
                    [(f"resp_old{n}", time.time(), orjson.dumps(_response(f"resp_old{n}")), b"[]") for n in range(7)])
    old.commit()
    old.close()
    one = SQLiteStore(path, ttl_seconds=60, max_responses=5)
    two = SQLiteStore(path, ttl_seconds=60, max_responses=5)
    await one.open()
    await two.open()
    try:
        assert await one.get("resp_old6") is not None
        for n in range(12):
            await (one if n % 2 else two).save(_response(f"resp_{n}"), [])
        await one.save(_response("resp_11"), [])  # saved again: replaced, not counted twice
        db = sqlite3.connect(path)
        (count,) = db.execute("SELECT COUNT(*) FROM responses").fetchone()
        (counted,) = db.execute("SELECT n FROM response_count").fetchone()
        ids = [row[0] for row in db.execute("SELECT id FROM responses ORDER BY seq")]
        db.close()
        assert count == counted == 5
        assert ids == ["resp_7", "resp_8", "resp_9", "resp_10", "resp_11"]
    finally:
        await one.close()
        await two.close()


# --- pure pieces ----------------------------------------------------------------------------------------------


def test_stored_input_items_spell_input_as_openai_lists_it():
    [item] = stored_input_items("hi")
    assert item["id"].startswith("msg_")
    assert item | {"id": "x"} == {"id": "x", "type": "message", "role": "user", "status": "completed",
                                  "content": [{"type": "input_text", "text": "hi"}]}
    user, assistant = stored_input_items([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]},
                                          {"role": "assistant", "content": "ok", "id": "msg_given"}])
    assert user["content"] == [{"type": "input_image", "image_url": "u", "detail": "auto"}]
    assert assistant["id"] == "msg_given" and assistant["role"] == "assistant"
    assert assistant["content"] == [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}]
    [output] = stored_input_items([{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    assert output["id"].startswith("fco_") and output["status"] == "completed"
    for item in [user, assistant, output]:  # each one is an item the SDK's list accepts
        TypeAdapter(ResponseItem).validate_python(item)


def test_page_items_follows_after_in_either_order():
    items = [{"id": f"i{n}"} for n in range(5)]
    page = page_items(items, limit=2, order="desc", after="i3")
    assert [i["id"] for i in page["data"]] == ["i2", "i1"] and page["has_more"] is True
    page = page_items(items, limit=3, order="asc", after="i1")
    assert (page["first_id"], page["last_id"], page["has_more"]) == ("i2", "i4", False)
    assert page_items(items, limit=3, order="asc", after="i4")["data"] == []
    with pytest.raises(ValueError):
        page_items(items, limit=3, order="asc", after="nope")


def test_store_config_defaults_and_errors(tmp_path):
    config = parse_config({"upstreams": {"u": {"urls": ["http://x:1"]}}, "models": {}}, tmp_path)
    assert config.store.backend == "sqlite" and config.resolve(config.store.path) == tmp_path / "responses.sqlite3"
    assert config.store.ttl_seconds > 0 and config.store.max_responses > 0
    with pytest.raises(ConfigError, match=r"store\.url"):
        parse_config({"upstreams": {}, "models": {}, "store": {"backend": "redis", "url": "http://x"}}, tmp_path)
    with pytest.raises(ConfigError, match=r"store\.max_responses"):
        parse_config({"upstreams": {}, "models": {}, "store": {"max_responses": 0}}, tmp_path)


def test_replayed_history_goes_between_new_instructions_and_new_input():
    history = [*stored_input_items("What is the weather?"),
               {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}",
                "status": "completed"}]
    body = {"model": "m", "instructions": "Be brief.",
            "input": [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]}
    gen = generation_from_responses(body, history)
    assert gen.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert gen.plain_input is None
    plain = generation_from_responses({"model": "m", "input": "hi"}, stored_input_items("earlier"))
    assert plain.plain_input is None  # a completions upstream must render the whole conversation


class _BrokenStore(MemoryStore):
    """A store whose backend is down."""

    async def save(self, response: dict[str, Any], input_items: list[dict[str, Any]],
                   events: bytes | None = None) -> None:
        raise ConnectionError("store down")

    async def get(self, response_id: str) -> dict[str, Any] | None:
        raise ConnectionError("store down")


async def test_a_failing_store_never_costs_the_answer_and_reads_say_503(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    stack.gateway.app[STORE_KEY].store = _BrokenStore(ttl_seconds=60, max_responses=10)
    created = await stack.client.responses.create(model=stack.model, input="hello")
    assert created.output_text == "Hi there."
    with pytest.raises(openai.InternalServerError) as down:
        await stack.client.responses.retrieve(created.id)
    assert down.value.status_code == 503 and down.value.code == "store_unavailable"


# --- item_reference -----------------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "redis"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "memory":
        return {"backend": "memory"}
    if request.param == "sqlite":
        return {"backend": "sqlite", "path": str(tmp_path / "responses.sqlite3")}
    return _redis_store(request.getfixturevalue("redis_url"))


async def test_item_reference_is_replaced_by_the_stored_item(aiohttp_server, vocab, any_store):
    """What the AI SDK sends by default (store: true): earlier output items by id, not by content."""
    stack = await start_stack(aiohttp_server, vocab, store=any_store, replies=REPLIES)
    first = await stack.client.responses.create(model=stack.model, input="hello", include=LOGPROBS)
    [message] = first.output
    [asked] = (await stack.client.responses.input_items.list(first.id)).data
    second = await stack.client.responses.create(model=stack.model, store=False, input=[
        {"type": "item_reference", "id": asked.id}, {"type": "item_reference", "id": message.id},
        {"role": "user", "content": "and then?"}])
    assert second.output_text == "Then more."
    assert (await _received_messages(stack))[-1] == [
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi there."},
        {"role": "user", "content": "and then?"}]
    # OpenAI's short form (an id alone); a stored turn keeps the items themselves, under their ids.
    third = await stack.client.responses.create(model=stack.model, input=[
        {"id": message.id}, {"role": "user", "content": "last one"}])
    listed = (await stack.client.responses.input_items.list(third.id, order="asc")).data
    assert listed[0].id == message.id and len(listed) == 2
    assert listed[0].content[0].text == "Hi there." and listed[0].content[0].logprobs == []


async def test_item_reference_to_an_unknown_item_names_its_index_and_id(aiohttp_server, vocab, any_store):
    stack = await start_stack(aiohttp_server, vocab, store=any_store, replies=REPLIES)
    with pytest.raises(openai.BadRequestError) as bad:
        await stack.client.responses.create(model=stack.model, input=[
            {"role": "user", "content": "hello"}, {"type": "item_reference", "id": "msg_nope"}])
    assert bad.value.param == "input[1]" and bad.value.code == "item_not_found"
    assert "msg_nope" in bad.value.body["message"] and "input[1]" in bad.value.body["message"]
    assert await _received_messages(stack) == []


async def test_item_reference_is_per_api_key(aiohttp_server, vocab, any_store, monkeypatch):
    monkeypatch.setenv("GATEWAY_TEST_KEYS", "key-a,key-b")
    stack = await start_stack(aiohttp_server, vocab, store=any_store, replies=REPLIES,
                              auth={"api_keys_env": "GATEWAY_TEST_KEYS"}, api_key="key-a")
    mine = await stack.client.responses.create(model=stack.model, input="hello")
    reference = [{"type": "item_reference", "id": mine.output[0].id}, {"role": "user", "content": "and then?"}]
    with pytest.raises(openai.BadRequestError) as bad:
        await stack.client.with_options(api_key="key-b").responses.create(model=stack.model, input=reference)
    assert bad.value.code == "item_not_found"
    assert (await stack.client.responses.create(model=stack.model, input=reference)).output_text == "Then more."


async def test_item_reference_goes_with_its_pruned_response(aiohttp_server, vocab, any_store):
    stack = await start_stack(aiohttp_server, vocab, store={**any_store, "max_responses": 1}, replies=REPLIES)
    old = await stack.client.responses.create(model=stack.model, input="hello")
    await stack.client.responses.create(model=stack.model, input="last one")
    await stack.gateway.app[STORE_KEY].store.flush()  # pruning happens as the writer commits, after the answer
    with pytest.raises(openai.BadRequestError) as bad:
        await stack.client.responses.create(model=stack.model, input=[{"type": "item_reference",
                                                                       "id": old.output[0].id}])
    assert bad.value.code == "item_not_found"


async def test_item_reference_without_a_store_says_so(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, store={"backend": "none"}, replies=REPLIES)
    with pytest.raises(openai.BadRequestError) as bad:
        await stack.client.responses.create(model=stack.model, input=[{"type": "item_reference", "id": "msg_1"}])
    assert bad.value.param == "input[0]" and "store.backend is none" in bad.value.body["message"]
