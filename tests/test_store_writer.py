"""Saving off the critical path (gateway.store.writer): answers never wait for the commit, yet a request
that names the new id at once finds it, on the same gateway and on another one over the same SQLite
file or Redis; SIGTERM writes what is queued; a failed write is logged and counted.

A commit is held back for real: another connection holds the SQLite file's write lock (BEGIN
IMMEDIATE), as a busy second process would, or the Redis server is stopped.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.vllm import create_app as create_simulator
from gateway.store import codec
from gateway.store.sqlite import SQLiteStore
from gateway.store.writer import WriteBehind
from gateway.stored_routes import STORE_KEY
from tests.e2e import LOGPROBS, start_stack
from tests.test_sse_encoding import _long_message_ending
from tests.test_stored_responses import REPLIES, _redis_store, redis_url  # noqa: F401  (the session's redis-server)

EXE = str(Path(sys.executable).parent / "responses-gateway")


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


@contextmanager
def _write_lock(path: Path):
    """Hold the file's write lock (as another process mid-transaction would): no commit gets through."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


def _committed(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT id FROM responses")}


def _serve_config(tmp_path: Path, simulator: Any, path: Path) -> Path:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "upstreams": {"sim": {"urls": [str(simulator.make_url("")).rstrip("/")], "health_interval": 0}},
        "models": {"demo-model": {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
        "store": {"backend": "sqlite", "path": str(path)}}))
    return config


@asynccontextmanager
async def _serving(config: Path):
    """A real `responses-gateway serve` process: (its base URL, the process); killed if still up at the end."""
    process = await asyncio.create_subprocess_exec(EXE, "serve", "--config", str(config), "--port", "0",
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        while True:
            line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
            assert line, "the gateway exited before listening"
            if "responses-gateway on http://" in line:
                yield line.split()[2], process
                break
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _create(session: aiohttp.ClientSession, base: str, body: dict[str, Any], *, whole: bool = False) -> str:
    """POST /v1/responses -> the new id (`whole`: the answer must have run to its end: 200, and a stream's
    terminal event; 8 tokens at the cap end `incomplete`)."""
    async with session.post(f"{base}/v1/responses", json=body) as reply:
        assert reply.status == 200 or not whole
        raw = await reply.read()
    if not body.get("stream"):
        return orjson.loads(raw)["id"]
    assert b"event: response.incomplete" in raw or not whole
    first = raw.split(b"data: ", 1)[1].split(b"\n", 1)[0]
    return orjson.loads(first)["response"]["id"]


async def test_a_pending_save_is_read_back_on_the_same_gateway(aiohttp_server, vocab, tmp_path):
    path = tmp_path / "r.sqlite3"
    stack = await start_stack(aiohttp_server, vocab, store={"backend": "sqlite", "path": str(path)}, replies=REPLIES)
    await stack.client.responses.create(model=stack.model, input="hello")  # the file and its tables exist
    with _write_lock(path):
        first = await stack.client.responses.create(model=stack.model, input="hello", include=LOGPROBS,
                                                    top_logprobs=5)
        assert first.id not in _committed(path)  # answered while its commit cannot happen
        assert (await stack.client.responses.retrieve(first.id, include=LOGPROBS)).model_dump() == first.model_dump()
        second = await stack.client.responses.create(model=stack.model, input="and then?",
                                                     previous_response_id=first.id)
        assert second.output_text == "Then more."
        third = await stack.client.responses.create(model=stack.model, input=[
            {"type": "item_reference", "id": first.output[0].id}, {"role": "user", "content": "last one"}])
        assert third.output_text == "Bye now."
        items = await stack.client.responses.input_items.list(second.id, order="asc")
        assert [item.type for item in items.data] == ["message"] * 3
    await stack.gateway.app[STORE_KEY].store.flush()
    assert {first.id, second.id, third.id} <= _committed(path)
    assert await stack.client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        await stack.client.responses.retrieve(first.id)


async def test_a_queued_save_holds_the_compact_form_and_reads_back_exactly(tmp_path):
    """A 1,000-token k=5 Response (~0.4 MB of JSON) waits in the queue encoded (~45 KB), so a burst of
    long answers ending while the writer is behind does not hold their JSON; the encoding runs right after
    the saving caller's turn of the loop, not in it (its columns: the deflate is the writer thread's); read
    from the queue it is the Response as sent, byte for byte."""
    response = _long_message_ending(True)[-1]["response"]
    raw = orjson.dumps(response)
    path = tmp_path / "r.sqlite3"
    store = WriteBehind(SQLiteStore(path, ttl_seconds=3600, max_responses=100))
    await store.open()
    try:
        with _write_lock(path):
            await store.save(response, [{"type": "message", "role": "user", "content": "hi"}])
            pending = store._pending[response["id"]]
            assert pending._columns is None  # not encoded in the caller's turn: its answer goes out first
            await asyncio.sleep(0)
            assert pending._columns is not None and pending._values is None  # one turn later: columns, dicts gone
            assert store.queued_bytes < len(raw) / 3, (store.queued_bytes, len(raw))  # ~22%: not deflated yet
            assert response["id"] not in _committed(path)
            assert len(raw) > 300_000
            assert orjson.dumps(await store.get(response["id"])) == raw
            assert await store.input_items(response["id"]) == [{"type": "message", "role": "user", "content": "hi"}]
        await store.flush()
        assert response["id"] in _committed(path) and store.queued_bytes == 0
        assert orjson.dumps(await store.get(response["id"])) == raw
    finally:
        await store.close()


async def test_another_gateway_on_the_same_file_waits_for_the_commit(aiohttp_server, vocab, tmp_path):
    """Two gateways (as two workers would) on one SQLite file: the second is asked for an id the first
    answered but has not committed; it waits for the commit instead of answering 404."""
    path = tmp_path / "r.sqlite3"
    store = {"backend": "sqlite", "path": str(path), "read_wait_seconds": 30}
    one = await start_stack(aiohttp_server, vocab, store=store, replies=REPLIES)
    upstream = str(one.simulator.make_url("")).rstrip("/")
    two = await start_stack(aiohttp_server, vocab, upstream_url=upstream, store=store, replies=REPLIES)
    await one.client.responses.create(model=one.model, input="hello")
    with _write_lock(path):
        first = await one.client.responses.create(model=one.model, input="hello")
        retrieving = asyncio.create_task(two.client.responses.retrieve(first.id))
        continuing = asyncio.create_task(two.client.responses.create(model=two.model, input="and then?",
                                                                     previous_response_id=first.id))
        await asyncio.sleep(0.3)
        # Not committed, so the second gateway cannot have found it yet, and it has not said 404 either.
        assert first.id not in _committed(path) and not retrieving.done() and not continuing.done()
    assert (await retrieving).output_text == "Hi there."
    assert (await continuing).output_text == "Then more."
    # An id nobody made recently is not waited for: an old-style random id answers 404 at once.
    with pytest.raises(openai.NotFoundError):
        await two.client.responses.retrieve("resp_" + "f" * 48)


async def test_redis_replicas_read_each_others_writes(aiohttp_server, vocab, redis_url):  # noqa: F811
    store = _redis_store(redis_url)
    one = await start_stack(aiohttp_server, vocab, store=store, replies=REPLIES)
    two = await start_stack(aiohttp_server, vocab, upstream_url=str(one.simulator.make_url("")).rstrip("/"),
                            store=store, replies=REPLIES)
    made = await asyncio.gather(*(one.client.responses.create(model=one.model, input="hello", include=LOGPROBS,
                                                              top_logprobs=5) for _ in range(20)))
    seen = await asyncio.gather(*(two.client.responses.retrieve(m.id, include=LOGPROBS) for m in made))
    assert [s.model_dump() for s in seen] == [m.model_dump() for m in made]
    raw = await two.gateway.app[STORE_KEY].store.backend.client.hget(f"{store['key_prefix']}response:{made[0].id}",
                                                                     "response")
    assert raw.startswith(codec.MAGIC)  # the compact form, not JSON


async def test_a_failed_write_is_logged_and_counted(aiohttp_server, vocab, tmp_path, caplog):
    """The file's write lock is held past the writer's busy timeout (shortened here from 10 s), so its
    commit fails with SQLite's own "database is locked": the client still gets its answer, the failure
    is logged with the id and counted in /metrics."""
    path = tmp_path / "r.sqlite3"
    stack = await start_stack(aiohttp_server, vocab, store={"backend": "sqlite", "path": str(path)}, replies=REPLIES)
    backend = stack.gateway.app[STORE_KEY].store.backend
    await backend._run(lambda: backend._conn.execute("PRAGMA busy_timeout=50"))  # on the writer's own thread
    with _write_lock(path):
        created = await stack.client.responses.create(model=stack.model, input="hello")
        assert created.output_text == "Hi there."
        await stack.gateway.app[STORE_KEY].store.flush()
    async with aiohttp.ClientSession() as session, session.get(stack.url("/metrics")) as reply:
        metrics = await reply.text()
    assert "gateway_store_write_failures_total 1.0" in metrics
    assert f"could not store response {created.id}" in caplog.text
    with pytest.raises(openai.NotFoundError):  # lost, and said so in the log and the metric; never a hang
        await stack.client.responses.retrieve(created.id)


async def test_sigterm_writes_every_queued_response_before_exiting(aiohttp_server, tmp_path):
    """A real `responses-gateway serve`: responses answered while their commit is held back are all in
    the file after SIGTERM (the drain writes the queue before the process exits)."""
    simulator = await aiohttp_server(create_simulator(build_demo_vocab(), "demo-model"))
    path = tmp_path / "r.sqlite3"
    async with _serving(_serve_config(tmp_path, simulator, path)) as (base, process):
        body: dict[str, Any] = {"model": "demo-model", "input": "hi", "max_output_tokens": 8}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/v1/responses", json=body) as reply:
                assert reply.status == 200  # the file and its tables exist
            with _write_lock(path):
                made = await asyncio.gather(*(_create(session, base, {**body, "stream": i % 2 == 1})
                                              for i in range(24)))
                assert not set(made) & _committed(path)
                process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)  # the gateway is draining, its writer still held back by the lock
                assert process.returncode is None
        assert await asyncio.wait_for(process.wait(), 60) == 0
        assert set(made) <= _committed(path)


async def test_the_memory_store_keeps_a_long_response_compact_and_reads_it_back_exactly():
    """The in-process store keeps store.codec's compact form, as SQLite and Redis do: a 1,000-token k=5
    Response (~0.4 MB of JSON, ~2.5 MB as parsed dicts) takes less than a fifth of its JSON."""
    from gateway.store.memory import MemoryStore

    response = _long_message_ending(True)[-1]["response"]
    raw = orjson.dumps(response)
    store = MemoryStore(ttl_seconds=3600, max_responses=10)
    await store.save(response, [{"type": "message", "role": "user", "content": "hi"}])
    kept = store._entries[response["id"]][1]
    assert type(kept) is bytes and len(raw) > 300_000 and len(kept) < len(raw) / 5, (len(kept), len(raw))
    assert orjson.dumps(await store.get(response["id"])) == raw
    assert await store.input_items(response["id"]) == [{"type": "message", "role": "user", "content": "hi"}]
@pytest.mark.parametrize("linger", [0.25, 0.0])
async def test_saves_that_find_the_writer_idle_share_one_commit(tmp_path, linger):
    """Four answers finishing a few milliseconds apart (as requests in flight together do) share one
    commit while the writer lingers (by default 20 ms; longer here, so that a slow machine cannot split
    them); without it they are not committed together. The SQLite store stamps every row of a commit
    with the same `saved_at`."""
    assert WriteBehind(SQLiteStore(tmp_path / "unused", ttl_seconds=1, max_responses=1)).linger == 0.02
    response = _long_message_ending(True)[-1]["response"]
    path = tmp_path / "r.sqlite3"
    store = WriteBehind(SQLiteStore(path, ttl_seconds=3600, max_responses=100), linger=linger)
    await store.open()
    try:
        for n in range(4):
            await store.save({**response, "id": f"resp_{n}"}, [])
            await asyncio.sleep(0.004)
        await store.flush()
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        stamps = [row[0] for row in db.execute("SELECT saved_at FROM responses")]
    assert len(stamps) == 4
    assert len(set(stamps)) == 1 if linger else len(set(stamps)) > 1, stamps


async def test_a_durable_save_returns_once_another_process_reads_it(tmp_path):
    """A background response's saves are durable: each status it shows is committed first, so a second
    process over the same file never reads an older version after the first has shown a newer one (the
    race the writer's linger widened: a poll there read `in_progress` after this one served `completed`
    from its queue). A plain save returns while its commit still waits for the linger."""
    response = _long_message_ending(True)[-1]["response"]
    path = tmp_path / "r.sqlite3"
    store = WriteBehind(SQLiteStore(path, ttl_seconds=3600, max_responses=100), linger=0.25)
    other = SQLiteStore(path, ttl_seconds=3600, max_responses=100)
    await store.open()
    await other.open()
    try:
        await store.save({**response, "id": "resp_1", "status": "in_progress"}, [], durable=True)
        assert (await other.get("resp_1"))["status"] == "in_progress"
        await store.save({**response, "id": "resp_1", "status": "completed"}, [])
        assert (await store.get("resp_1"))["status"] == "completed"  # from the queue
        assert (await other.get("resp_1"))["status"] == "in_progress"  # not committed yet: lingering
        await store.save({**response, "id": "resp_1", "status": "completed"}, [], durable=True)
        assert (await other.get("resp_1"))["status"] == "completed"
    finally:
        await other.close()
        await store.close()


async def test_saving_a_stored_id_again_replaces_its_row_and_its_item_rows(tmp_path):
    """A new id is inserted with one statement; an id saved before (a background response's next status)
    takes the place of the old row: the new version is read, the old version's item keys lead nowhere, the
    new ones lead to it, and the count that pruning keeps still counts it once."""
    path = tmp_path / "r.sqlite3"
    store = SQLiteStore(path, ttl_seconds=3600, max_responses=100)
    await store.open()
    try:
        first = {"id": "resp_1", "status": "in_progress", "output": [{"id": "msg_old", "type": "message"}]}
        await store.save(first, [{"id": "msg_in", "type": "message", "role": "user", "content": "hi"}])
        await store.save({"id": "resp_2", "status": "completed", "output": []}, [])
        assert await store.item_owner("msg_old") == "resp_1"
        second = {"id": "resp_1", "status": "completed", "output": [{"id": "msg_new", "type": "message"}]}
        await store.save(second, [])
        assert await store.get("resp_1") == second and await store.input_items("resp_1") == []
        assert await store.item_owner("msg_old") is None and await store.item_owner("msg_in") is None
        assert await store.item_owner("msg_new") == "resp_1"
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT n FROM response_count").fetchone() == (2,)
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone() == (2,)


def _open_and_close_at(path: Path, barrier: Any) -> None:
    """One worker's start (in a forked process): wait for the others, then open the store and close it."""
    async def open_and_close() -> None:
        store = SQLiteStore(path, ttl_seconds=3600, max_responses=100)
        await store.open()
        await store.close()

    barrier.wait(10)
    asyncio.run(open_and_close())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the workers fork")
def test_workers_opening_a_new_file_together_all_open_it(tmp_path):
    """`serve --workers N` starts N processes that open one new SQLite file at once. Switching it to WAL
    fails at once (SQLITE_BUSY, no busy wait) in whichever loses the race: before the retry, 123 of 200
    such pairs lost a worker to "database is locked" here, and CI saw the supervisor restart one."""
    context = multiprocessing.get_context("fork")
    for attempt in range(8):
        path = tmp_path / f"new-{attempt}" / "r.sqlite3"
        barrier = context.Barrier(4)
        workers = [context.Process(target=_open_and_close_at, args=(path, barrier)) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert [worker.exitcode for worker in workers] == [0, 0, 0, 0], f"attempt {attempt}"
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
async def test_the_sqlite_writer_thread_runs_at_a_lower_priority_than_the_event_loop(tmp_path):
    """Deflating and committing are background work: the writer thread is niced (so it does not preempt the
    event loop on a shared core); the reader thread, which requests wait on, is not."""
    import threading

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    from gateway.store.sqlite import WRITER_NICENESS

    store = SQLiteStore(tmp_path / "r.sqlite3", ttl_seconds=3600, max_responses=100)
    await store.open()
    try:
        loop = niceness()
        assert await store._run(niceness) == min(19, loop + WRITER_NICENESS)
        assert await store._run_read(niceness) == loop
    finally:
        await store.close()


def _answer_with_batch(vocab, tokens: int):
    """A non-streamed Response rendered from a whole body's TokenBatch, and its logprob lists (store.codec)."""
    from gateway.logprobs.body_scan import load_chat_body
    from gateway.translate.fronts import ResponsesFront
    from gateway.translate.response_object import ResponseSettings
    from gateway.upstreams.openai_compatible import chat_step
    from gateway.upstreams.vllm import FLAVOR
    from tests.test_whole_body import _plain_chat_body

    ids = (vocab.encode("Hi there, the plan 🦀. ") * tokens)[:tokens]
    options = FLAVOR.parse_options(vocab)
    step = chat_step(load_chat_body(_plain_chat_body(vocab, ids, 5), options), options, streaming=False)
    front = ResponsesFront(ResponseSettings(model="m", top_logprobs=5, include_logprobs=True), vocab,
                           serialized=True, deltas=False)
    front.start()
    front.feed_step(step)
    return front.final(step.finish_reason, step.usage), front.stream.logprob_lists()


@pytest.mark.parametrize("tokens", [100, 1000])
async def test_a_long_answer_is_encoded_as_it_is_saved_a_short_one_after_the_turn(tmp_path, qwen2_vocab, tokens):
    """A short answer's save is encoded after the saving handler's turn (its answer goes out first); a long
    one's (256 tokens or more) at once, so its Response and the encode's buffers are gone before its stream's
    closing frames are written (bench.memory: the peak of 256 x 1,000-token streams ~50 MB lower). Either
    way the queue then holds only the compact form, and it reads back as the Response."""
    response, lists = _answer_with_batch(qwen2_vocab, tokens)
    assert lists and len(lists[0][1]) == tokens
    store = WriteBehind(SQLiteStore(tmp_path / "r.sqlite3", ttl_seconds=3600, max_responses=100), linger=0.25)
    await store.open()
    try:
        await store.save(response, [], lists=lists)
        write = store._pending[response["id"]]
        assert (write._values is None) == (tokens >= 256)  # encoded already, or waiting for the turn to end
        assert (write._encoded is not None) == (tokens >= 256)  # a long one deflated too
        await asyncio.sleep(0)
        assert write._values is None  # the handler's dicts are gone either way
        # A short one's deflate is the writer's; a long one keeps only its compact form (no columns beside it).
        assert (write._columns is None) == (tokens >= 256)
        assert orjson.dumps(await store.get(response["id"])) == orjson.dumps(response)
        assert write._columns is None and write._encoded is not None  # read back: packed, and the columns gone
    finally:
        await store.close()


async def test_an_http_answer_is_saved_once_written_and_waits_for_room_only_when_the_queue_is_full(tmp_path, vocab):
    """POST /v1/responses queues its save after the answer (Turn.save_after_answer, run when the request's
    task ends), so none of it is in the client's latency, and before the loop could serve a request that
    names the id. With the queue full the save is awaited before the answer instead: backpressure."""
    from gateway.store import ScopedStore
    from gateway.stored_routes import RecordingFront, Turn
    from gateway.translate.fronts import ResponsesFront
    from gateway.translate.response_object import ResponseSettings

    path = tmp_path / "r.sqlite3"
    store = WriteBehind(SQLiteStore(path, ttl_seconds=3600, max_responses=100), queue_size=1, linger=0)
    await store.open()

    def answered_turn(text: str) -> tuple[Turn, str]:
        turn = Turn(ScopedStore(store, None), None, text)
        front = turn.track(ResponsesFront(ResponseSettings(model="m"), vocab, serialized=True, deltas=False))
        assert isinstance(front, RecordingFront)
        front.start()
        front.feed([], text)  # text only: no logprobs asked for
        return turn, front.final("stop", None)["id"]

    async def handler(turn: Turn, response_id: str) -> bool:
        await turn.save_after_answer()
        return response_id in store._pending  # queued while its answer is still being written?

    try:
        turn, first = answered_turn("first")
        assert await asyncio.create_task(handler(turn, first)) is False
        await asyncio.sleep(0)  # the task's done callbacks: the save is queued now
        assert first in store._pending and (await store.get(first))["id"] == first
        await store.flush()
        assert first in _committed(path)
        with _write_lock(path):
            blocked, second = answered_turn("second")
            await asyncio.create_task(handler(blocked, second))
            await asyncio.sleep(0.05)  # the writer took it and waits for the lock: the queue is empty again
            filled, third = answered_turn("third")
            await asyncio.create_task(handler(filled, third))
            await asyncio.sleep(0)
            assert store.depth == 1 and not store.has_room()
            held, fourth = answered_turn("fourth")
            waiting = asyncio.create_task(handler(held, fourth))
            await asyncio.sleep(0.2)
            assert not waiting.done()  # no room: its answer waits for the writer
        assert await asyncio.wait_for(waiting, 15) is True  # saved before its answer, as `save` does
        await store.flush()
        assert {first, second, third, fourth} <= _committed(path)
    finally:
        await store.close()


async def test_answers_in_flight_at_sigterm_are_saved_before_exiting(aiohttp_server, tmp_path):
    """Saves queued once the answer is written (Turn.save_after_answer) are still written when the answer
    finishes during the drain: a real `serve`, requests still generating when SIGTERM comes."""
    simulator = await aiohttp_server(create_simulator(build_demo_vocab(), "demo-model", step_delay_ms=40))
    path = tmp_path / "r.sqlite3"
    async with _serving(_serve_config(tmp_path, simulator, path)) as (base, process):
        body: dict[str, Any] = {"model": "demo-model", "input": "hi", "max_output_tokens": 8}
        async with aiohttp.ClientSession() as session:
            pending = [asyncio.create_task(_create(session, base, {**body, "stream": i % 2 == 1}, whole=True))
                       for i in range(8)]
            await asyncio.sleep(0.15)  # every one still generating (8 steps of 40 ms)
            assert not any(task.done() for task in pending)
            process.send_signal(signal.SIGTERM)
            made = await asyncio.gather(*pending)
        assert await asyncio.wait_for(process.wait(), 60) == 0
        assert set(made) <= _committed(path)
