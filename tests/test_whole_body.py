"""A whole chat or completions body straight to the Response (the compiled `TokenBatch` path, body_scan.py)
gives the Response JSON the Token path gives, byte for byte (ids and times aside).

The Token path is the body read by orjson and the id readers (`load_json`: what a route without the
compiled reader runs, and with RESPONSES_GATEWAY_PURE_PYTHON=1 every step of it is Python); the batch
path is `load_chat_body` / `load_completions_body`. Bodies are drawn over Qwen2's real byte-level BPE
(CJK and emoji split across tokens) and the demo vocabulary: split characters, special tokens, sentinel
logprobs, duplicated alternatives, k below what the upstream sent, texts the tokens do not spell (a
length cap inside a character, a stop string, a different text) and shapes the reader declines.
"""

import json
import re
import sys

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.logprobs.body_scan import load_chat_body, load_completions_body, load_json
from gateway.logprobs.compiled import TokenBatch, fastpath
from gateway.logprobs.parse import id_table
from gateway.translate.fronts import ResponsesFront
from gateway.translate.response_object import ResponseSettings
from gateway.upstreams.openai_compatible import chat_step, completions_step
from gateway.upstreams.vllm import FLAVOR
from tests.test_fastpath import VOCAB as DEMO_VOCAB

pytestmark = pytest.mark.skipif(fastpath is None, reason="the C extension was not built (no compiler at install)")

SENTINELS = [-9999.0, -3.4028234663852886e38, -1e30, -10000.5]


def _response(raw: bytes, vocab, completions: bool, batch_path: bool, k: int, include: bool = True):
    """The Response JSON the server would send for `raw` (or the error it would meet)."""
    options = FLAVOR.parse_options(vocab)
    loader = (load_completions_body if completions else load_chat_body) if batch_path else load_json
    try:
        data = loader(raw, options)
        step = (completions_step if completions else chat_step)(data, options, streaming=False)
        front = ResponsesFront(ResponseSettings(model="m", top_logprobs=k, include_logprobs=include), vocab,
                               serialized=True, deltas=False)
        stream = front.stream
        stream.response_id, stream.message_id, stream.created_at = "resp_1", "msg_1", 1
        front.start()
        front.feed_step(step)
        body = front.final(step.finish_reason, step.usage)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    written = re.sub(rb'"completed_at":\d+', b'"completed_at":0', orjson.dumps(body))
    return re.sub(rb'"(rs|fc|ctc|call)_[^"]*"', rb'"\1_1"', written)  # the other items' fresh ids


def _usable_ids(vocab) -> list[int]:
    table, _ = id_table(vocab)
    return [i for i, data in enumerate(table) if data is not None]


@st.composite
def bodies(draw, vocab, ids):
    """(raw body, completions?, k) of a vLLM-shaped answer, mostly the plain shape, sometimes not."""
    table, flags = id_table(vocab)
    specials = [i for i in ids if flags[i]]
    non_ascii = [i for i in ids if not table[i].isascii()]
    pick = st.one_of(st.sampled_from(ids), st.sampled_from(non_ascii or ids), st.sampled_from(specials or ids))
    if draw(st.booleans()):  # a text's own tokens (split characters that complete), a special one inside
        token_ids = vocab.encode(draw(st.text(st.sampled_from("ab 根据😀é\n"), max_size=8)))
        if specials and token_ids and draw(st.booleans()):
            token_ids.insert(draw(st.integers(0, len(token_ids))), draw(st.sampled_from(specials)))
    else:
        token_ids = draw(st.lists(pick, max_size=12))
    count = len(token_ids)
    plain = st.one_of(st.floats(-30, 0, allow_nan=False), st.just(0.0), st.just(-1.5))
    value = plain if draw(st.integers(0, 3)) else st.one_of(plain, st.sampled_from(SENTINELS))
    sent = draw(st.integers(0, 7))
    positions = []
    for token_id in token_ids:
        alternatives = draw(st.lists(st.one_of(pick, st.just(token_id)), min_size=sent, max_size=sent))
        positions.append((token_id, draw(value), [(a, draw(value)) for a in alternatives]))
    visible = b"".join(table[t] for t, _, _ in positions if not flags[t])
    text = visible.decode("utf-8", "replace")
    match draw(st.sampled_from(["exact", "exact", "exact", "cut", "stop", "other"])):
        case "cut":  # a length cap inside a character: the text holds what decodes
            text = visible.decode("utf-8", "ignore") if count else text
        case "stop":  # a stop string past the text
            text = text[: draw(st.integers(0, len(text)))]
        case "other":
            text = draw(st.text(max_size=6))
    completions = draw(st.booleans())
    finish = draw(st.sampled_from(["stop", "length"]))
    odd = draw(st.sampled_from([None] * 6 + ["string_token", "reasoning", "tool_calls", "nan", "echo"]))

    def name(token_id):
        return f"token_id:{token_id}"

    if completions:
        tops = [None if not alternatives and draw(st.booleans()) else dict((name(a), v) for a, v in alternatives)
                for _, _, alternatives in positions]
        logprobs = {"tokens": [name(t) for t, _, _ in positions], "token_logprobs": [v for _, v, _ in positions],
                    "top_logprobs": tops if draw(st.integers(0, 5)) else None,
                    "text_offset": list(range(count))}
        if odd == "string_token" and count:
            logprobs["tokens"][0] = "hi"
        if odd == "echo" and count:
            logprobs["token_logprobs"][0] = None
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None}
        body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice],
                "usage": {"prompt_tokens": 3, "completion_tokens": count, "total_tokens": 3 + count}}
    else:
        content = [{"token": name(t), "logprob": v, "bytes": list(table[t]),
                    "top_logprobs": [{"token": name(a), "logprob": av, "bytes": list(table[a])}
                                     for a, av in alternatives]}
                   for t, v, alternatives in positions]
        if odd == "string_token" and count:
            content[0]["token"] = table[positions[0][0]].decode("utf-8", "replace")
        if count and draw(st.integers(0, 4)) == 0:
            content[draw(st.integers(0, count - 1))]["special"] = True
        message = {"role": "assistant", "content": text, "tool_calls": []}
        if odd == "reasoning":
            message["reasoning_content"] = "thinking"
        if odd == "tool_calls":
            message["tool_calls"] = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
        choice = {"index": 0, "message": message, "logprobs": {"content": content}, "finish_reason": finish,
                  "stop_reason": None}
        body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice],
                "usage": {"prompt_tokens": 3, "completion_tokens": count, "total_tokens": 3 + count}}
    raw = json.dumps(body, ensure_ascii=draw(st.booleans())).encode()
    if odd == "nan" and count:
        raw = raw.replace(json.dumps(positions[0][1]).encode(), b"NaN", 1)  # orjson refuses it: both must
    return raw, completions, draw(st.integers(0, 6))


def _check(raw: bytes, completions: bool, k: int, vocab) -> None:
    for include in (True, False):
        tokens_path = _response(raw, vocab, completions, False, k, include)
        batch_path = _response(raw, vocab, completions, True, k, include)
        assert batch_path == tokens_path


DEMO_IDS = _usable_ids(DEMO_VOCAB)


@given(bodies(DEMO_VOCAB, DEMO_IDS))
@settings(max_examples=400, deadline=None)
def test_batch_path_gives_the_token_paths_response_over_the_demo_vocabulary(case):
    raw, completions, k = case
    _check(raw, completions, k, DEMO_VOCAB)


@pytest.fixture(scope="module")
def qwen2_ids(qwen2_vocab):
    return _usable_ids(qwen2_vocab)


@given(data=st.data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_batch_path_gives_the_token_paths_response_over_qwen2(data, qwen2_vocab, qwen2_ids):
    raw, completions, k = data.draw(bodies(qwen2_vocab, qwen2_ids))
    _check(raw, completions, k, qwen2_vocab)


def _plain_chat_body(vocab, ids: list[int], k: int) -> bytes:
    table, flags = id_table(vocab)
    content = [{"token": f"token_id:{t}", "logprob": -0.5,
                "top_logprobs": [{"token": f"token_id:{a}", "logprob": -1.0 - j} for j, a in enumerate(ids[:k])]}
               for t in ids]
    text = b"".join(table[t] for t in ids if not flags[t]).decode()
    return orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": {"content": content}, "finish_reason": "stop"}]})


def test_a_plain_body_is_read_into_a_batch_and_never_made_tokens(qwen2_vocab):
    """The shape vLLM sends (`token_id:N` everywhere, text the tokens spell): the step holds the batch
    itself, and the Response's entries are rendered from it."""
    table, _ = id_table(qwen2_vocab)
    ids = [i for i in _usable_ids(qwen2_vocab) if table[i].isascii()][1000:1010]
    raw = _plain_chat_body(qwen2_vocab, ids, 3)
    options = FLAVOR.parse_options(qwen2_vocab)
    step = chat_step(load_chat_body(raw, options), options, streaming=False)
    assert type(step.tokens) is TokenBatch and len(step.tokens) == 10
    assert _response(raw, qwen2_vocab, False, True, 2) == _response(raw, qwen2_vocab, False, False, 2)


def test_emoji_split_across_tokens_keeps_exact_bytes_from_the_batch(qwen2_vocab):
    """An emoji Qwen2 splits over tokens: the batch spells the text, and each entry holds its token's bytes."""
    text = "ok 😀!"
    ids = qwen2_vocab.encode(text) if hasattr(qwen2_vocab, "encode") else None
    if ids is None:
        pytest.skip("this vocabulary cannot encode")
    raw = _plain_chat_body(qwen2_vocab, ids, 1)
    body = orjson.loads(_response(raw, qwen2_vocab, False, True, 1))
    part = body["output"][0]["content"][0]
    assert part["text"] == text
    assert b"".join(bytes(entry["bytes"]) for entry in part["logprobs"]) == text.encode()
    assert _response(raw, qwen2_vocab, False, True, 1) == _response(raw, qwen2_vocab, False, False, 1)


def test_batch_tokens_are_the_id_readers_tokens():
    """`tokens()` and indexing give what the list readers make of the same JSON (for any other reader)."""
    table, flags = id_table(DEMO_VOCAB)
    ids = DEMO_IDS[5:12]
    raw = _plain_chat_body(DEMO_VOCAB, ids, 4)
    batch = fastpath.split_body(raw, False, table, flags)[1]
    content = orjson.loads(raw)["choices"][0]["logprobs"]["content"]
    expected = fastpath.chat_from_ids(content, table, flags)
    assert batch.tokens() == expected and [batch[i] for i in range(len(batch))] == expected
    assert [tuple(c) for t in batch.tokens() for c in t.top] == [tuple(c) for t in expected for c in t.top]
    with pytest.raises(IndexError):
        batch[len(batch)]


def test_the_batch_path_leaks_no_references():
    """Reading, spelling, rendering and dropping batches of both shapes gives back every reference it took."""
    table, flags = id_table(DEMO_VOCAB)
    ids = DEMO_IDS[20:40]
    chat = _plain_chat_body(DEMO_VOCAB, ids, 5)
    text = orjson.loads(chat)["choices"][0]["message"]["content"]
    completions = orjson.dumps({"choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": {
        "tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids),
        "top_logprobs": [{f"token_id:{a}": -1.0 - j for j, a in enumerate(ids[:3])} for _ in ids]}}]})
    shared = [table, *{table[t] for t in ids}, chat, completions, text]
    before = [sys.getrefcount(o) for o in shared]
    for _ in range(100):
        for raw, is_completions in ((chat, False), (completions, True)):
            _, batch = fastpath.split_body(raw, is_completions, table, flags)
            assert batch.spells(text) and batch.render_json(3, orjson.dumps).startswith(b"[{")
            assert len(batch.tokens(True)) == batch.visible
    del batch, raw
    assert [sys.getrefcount(o) for o in shared] == before


# --- the store encodes the Response from the batch --------------------------------------------------


def _stored_both_ways(raw: bytes, vocab, completions: bool, k: int, streamed: bool) -> tuple[bytes, bytes, bool]:
    """(codec.encode of the Response from its batch, codec.encode of its JSON, whether the batch was used).
    `streamed`: the tokens come as a stream's deltas (PackedTokens' batch) rather than one whole body."""
    from gateway.store import codec

    options = FLAVOR.parse_options(vocab)
    try:
        data = (load_completions_body if completions else load_chat_body)(raw, options)
        step = (completions_step if completions else chat_step)(data, options, streaming=False)
    except Exception:
        return b"", b"", False
    front = ResponsesFront(ResponseSettings(model="m", top_logprobs=k, include_logprobs=True), vocab,
                           serialized=True, deltas=streamed)
    front.start()
    if streamed and type(step.tokens) is TokenBatch:
        step.tokens = step.tokens.tokens()  # as a stream's chunks bring them: Tokens, packed as ids again
    try:
        front.feed_step(step)
        body = front.final(step.finish_reason, step.usage)
    except Exception:
        return b"", b"", False
    lists = front.stream.logprob_lists()
    used = bool(lists) and codec._columns_from_batch(body, lists[0]) is not None
    return codec.encode(body, lists=lists), codec.encode(body), used


@given(data=st.data(), streamed=st.booleans())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_store_encodes_a_response_from_its_batch_as_from_its_json(data, streamed, qwen2_vocab, qwen2_ids):
    """A Response whose logprobs list was rendered from a TokenBatch (a whole body's, or a stream's packed
    ids) is stored from the batch (no dump of the list to scan): the same bytes as from its JSON."""
    raw, completions, k = data.draw(bodies(qwen2_vocab, qwen2_ids))
    from_batch, from_json, _ = _stored_both_ways(raw, qwen2_vocab, completions, k, streamed)
    assert from_batch == from_json


def test_a_plain_answer_is_stored_from_its_batch(qwen2_vocab):
    """The shape vLLM sends takes the batch path (so the test above compares something), whole or streamed."""
    ids = qwen2_vocab.encode("Hi there 👋 根据 the plan 🦀. é")
    raw = _plain_chat_body(qwen2_vocab, ids, 5)
    for streamed in (False, True):
        from_batch, from_json, used = _stored_both_ways(raw, qwen2_vocab, False, 5, streamed)
        assert used and from_batch == from_json and len(from_batch) > 100
