"""The store's compact form (gateway.store.codec) reads back exactly what was stored: the Response the
translator rendered, byte for byte once serialized, over the demo vocab and Qwen2's real BPE (split
characters, k=5 alternatives, float64 logprobs, sentinels); and files of earlier versions still read."""

from __future__ import annotations

import sqlite3
import struct
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.logprobs.tokens import Candidate, Token
from gateway.store import codec
from gateway.store.sqlite import SQLiteStore
from gateway.translate.response_object import ResponseSettings, new_id
from gateway.translate.stream import ResponsesStream


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _rendered(token_bytes: list[bytes], steps: list[tuple[int, float, list[tuple[int, float]]]], k: int) -> bytes:
    """A whole Response as the gateway renders and sends it (serialized logprobs, no deltas)."""
    stream = ResponsesStream(ResponseSettings(model="m", top_logprobs=k, include_logprobs=True),
                             serialized=True, deltas=False)
    stream.start()
    for position, (token, logprob, top) in enumerate(steps):
        alternatives = tuple(Candidate(token_bytes[i], lp, i) for i, lp in top)
        data = token_bytes[token]
        # The text the upstream sent with the step: what the bytes spell once whole (bytes of a split
        # character come in later steps).
        stream.feed([Token(data, logprob, alternatives, position)], "")
    return orjson.dumps(stream.finish("length", {"input_tokens": 3, "output_tokens": len(steps)})[-1]["response"])


def _step(size: int, *, float32: bool | str) -> st.SearchStrategy[tuple[int, float, list[tuple[int, float]]]]:
    """float32: True (vLLM's, llama.cpp's), False (any float64), "decimal" (rounded to 6 places, as the
    vLLM simulator prints them)."""
    logprob = st.floats(min_value=-30, max_value=0, allow_nan=False)
    if float32 == "decimal":
        logprob = logprob.map(lambda value: round(value, 6))
    elif float32:
        logprob = logprob.map(_f32)
    values = st.one_of(logprob, st.just(float("-inf")), st.just(-0.0))  # -inf: the sentinel the renderer maps
    index = st.integers(min_value=0, max_value=size - 1)
    return st.tuples(index, values, st.lists(st.tuples(index, values), max_size=6))


def _assert_round_trip(raw: bytes) -> bytes:
    encoded = codec.encode(raw)
    assert orjson.dumps(codec.decode(encoded)) == raw
    return encoded


@pytest.fixture(scope="module")
def qwen2_bytes(qwen2_vocab) -> list[bytes]:
    return [qwen2_vocab.token_bytes(i) for i in range(len(qwen2_vocab))]


@pytest.fixture(scope="module")
def demo_bytes(demo_vocab) -> list[bytes]:
    return [demo_vocab.token_bytes(i) for i in range(len(demo_vocab))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), float32=st.sampled_from([True, False, "decimal"]), k=st.sampled_from([0, 1, 5]))
def test_qwen2_responses_round_trip_byte_for_byte(qwen2_bytes, data, float32, k):
    steps = data.draw(st.lists(_step(len(qwen2_bytes), float32=float32), min_size=1, max_size=40))
    _assert_round_trip(_rendered(qwen2_bytes, steps, k))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), float32=st.sampled_from([True, False, "decimal"]))
def test_demo_vocab_responses_round_trip_byte_for_byte(demo_bytes, data, float32):
    steps = data.draw(st.lists(_step(len(demo_bytes), float32=float32), min_size=1, max_size=40))
    _assert_round_trip(_rendered(demo_bytes, steps, 5))


def test_split_characters_and_awkward_bytes_round_trip():
    crab, han = "🦀".encode(), "中".encode()
    pieces = [crab[:2], crab[2:3], crab[3:], han[:1], han[1:], b'"q"\\\n', b"\x00\x1f", b"\xff", b"", b" a"]
    steps = [(i, _f32(-0.1 * i), [(j, _f32(-1.0 - j)) for j in range(len(pieces)) if j != i][:5])
             for i in range(len(pieces))]
    raw = _rendered(pieces, steps, 5)
    entries = orjson.loads(raw)["output"][0]["content"][0]["logprobs"]
    assert [bytes(e["bytes"]) for e in entries] == pieces and len(entries[0]["top_logprobs"]) == 5
    assert codec.encode(raw).startswith(codec.MAGIC) and len(codec.encode(raw)) < len(raw) / 3
    _assert_round_trip(raw)


def test_lists_of_another_shape_are_kept_as_json():
    entry = {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}
    values = [
        {"logprobs": [{**entry, "logprob": -9999}]},  # an int logprob would come back a float
        {"logprobs": [{"logprob": -1.0, "token": "a", "bytes": [97], "top_logprobs": []}]},  # key order
        {"logprobs": [{**entry, "token": "b"}]},  # a token that is not its bytes
        {"logprobs": [{**entry, "bytes": [300]}]},
        {"logprobs": 5, "other": {"logprobs": [entry]}},  # an int under "logprobs" already
        {"text": '"logprobs":[{"token":"a","logprob":-1.0,"bytes":[97],"top_logprobs":[]}]', "logprobs": []},
        [{"logprobs": [entry, {**entry, "extra": 1}]}, {"logprobs": [entry]}],
    ]
    for value in values:
        raw = orjson.dumps(value)
        assert codec.decode(codec.encode(raw)) == value
        assert orjson.dumps(codec.decode(codec.encode(raw))) == raw


@pytest.mark.parametrize("values", ["float32", "decimal"])
def test_a_stored_100_token_k5_response_is_compact(values):
    """Float32 logprobs (what vLLM sends) or six-decimal ones (the simulator's): well under the 8 KB a
    stored Response may take."""
    pieces = [f" word{i}".encode() for i in range(400)]

    def value(x: float) -> float:
        return _f32(x) if values == "float32" else round(x, 6)

    steps = [(i * 7 % 400, value(-0.01 * (i + 1)), [((i * 13 + j) % 400, value(-1.5 - j / 7)) for j in range(5)])
             for i in range(100)]
    raw = _rendered(pieces, steps, 5)
    encoded = _assert_round_trip(raw)
    assert len(raw) > 30_000 and len(encoded) < 6_000
    assert codec.encode(raw, 6) == encoded


async def test_a_file_written_by_the_previous_version_still_reads(tmp_path):
    """Rows as the version before the compact form wrote them (JSON blobs; that schema) read as before,
    and new saves into the same file sit next to them."""
    path = tmp_path / "old.sqlite3"
    old_id = new_id("resp")
    response = {"id": old_id, "object": "response", "status": "completed", "output": [
        {"id": "msg_1", "type": "message", "content": [{"type": "output_text", "text": "a", "logprobs": [
            {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}]}]}
    items = [{"id": "msg_0", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}]
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE responses (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, saved_at REAL NOT NULL,
                                response BLOB NOT NULL, input_items BLOB NOT NULL);
        CREATE INDEX responses_saved_at ON responses (saved_at);
        CREATE TABLE items (key TEXT PRIMARY KEY,
                            response_id TEXT NOT NULL REFERENCES responses (id) ON DELETE CASCADE);
    """)
    db.execute("INSERT INTO responses (id, saved_at, response, input_items) VALUES (?, ?, ?, ?)",
               (old_id, time.time(), orjson.dumps(response), orjson.dumps(items)))
    db.execute("INSERT INTO items VALUES ('msg_1', ?)", (old_id,))
    db.commit()
    db.close()

    store = SQLiteStore(path, ttl_seconds=3600, max_responses=10)
    await store.open()
    try:
        assert await store.get(old_id) == response
        assert await store.input_items(old_id) == items
        assert await store.item_owner("msg_1") == old_id
        new = {**response, "id": new_id("resp")}
        await store.save(new, items)
        assert await store.get(new["id"]) == new and await store.get(old_id) == response
    finally:
        await store.close()
    raw = sqlite3.connect(path).execute("SELECT response FROM responses WHERE id = ?", (new["id"],)).fetchone()[0]
    assert raw.startswith(codec.MAGIC)  # the new row is compact
