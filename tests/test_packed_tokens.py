"""Long streams in bounded memory: a streamed message's tokens are kept packed (`PackedTokens`) and its
whole logprob list is rendered once at the end; that list is byte for byte what the tokens render to,
and what the deltas carried."""

import math
import tracemalloc

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.logprobs.packed import PackedTokens
from gateway.logprobs.render import render_responses, render_responses_json
from gateway.logprobs.tokens import SENTINEL_LOGPROB, Candidate, Origin, Token
from gateway.sse import encode_event
from gateway.translate.response_object import ResponseSettings
from gateway.translate.stream import ResponsesStream

LOGPROBS = st.one_of(st.floats(min_value=-30, max_value=0), st.just(SENTINEL_LOGPROB), st.just(-math.inf),
                     st.just(0.0), st.just(-0.0), st.floats(allow_nan=True))
IDS = st.one_of(st.none(), st.integers(0, 200), st.just(2**40))  # 2**40: beyond the packed ids
CANDIDATE = st.builds(Candidate, st.binary(max_size=6), LOGPROBS, IDS, st.sampled_from(list(Origin)))
TOKEN = st.builds(Token, st.binary(max_size=8), st.one_of(LOGPROBS, st.none(), st.just(-2)),
                  st.lists(CANDIDATE, max_size=7).map(tuple), st.one_of(st.none(), st.integers(0, 99)))


def _render(tokens, k):
    try:
        return render_responses_json(tokens, k)
    except TypeError:  # an unsortable top list (None among floats) fails alike both ways
        return "TypeError"


@given(st.lists(st.lists(TOKEN, max_size=40), max_size=5), st.integers(0, 8))
def test_packed_tokens_render_exactly_as_the_tokens_given(batches, k):
    packed = PackedTokens()
    for batch in batches:
        packed.extend(batch)
    given_tokens = [token for batch in batches for token in batch]
    rebuilt = packed.tokens()
    assert len(packed) == len(rebuilt) == len(given_tokens)
    assert _render(rebuilt, k) == _render(given_tokens, k)
    if given_tokens and _render(given_tokens, k) != "TypeError":
        assert render_responses(rebuilt, k) == render_responses(given_tokens, k) or math.nan in [
            t.logprob for t in given_tokens]  # NaN != NaN in the dicts; the JSON above is equal


def _long_steps(count: int):
    """`count` one-token steps, k+1 alternatives each with ids, CJK characters split across two tokens."""
    han = "根".encode()
    for i in range(count):
        top = tuple(Candidate(bytes([97 + j]) * 2, -0.1 * (j + 1) - i * 1e-6, 1000 + j) for j in range(6))
        if i % 3 == 1:
            yield [Token(han[:2], -0.5 - i * 1e-4, top, 7)], ""
        elif i % 3 == 2:
            yield [Token(han[2:], -0.25, top, 8)], "根"
        else:
            yield [Token(f" w{i}".encode(), -1.0 / (i + 1), top, 9)], f" w{i}"


def test_a_long_stream_keeps_its_tokens_packed_and_completes_with_the_deltas_logprobs():
    settings = ResponseSettings(model="m", top_logprobs=5, include_logprobs=True)
    stream = ResponsesStream(settings, serialized=True)
    frames = [encode_event(e) for e in stream.start()]
    for tokens, text in _long_steps(1000):
        frames += [encode_event(e) for e in stream.feed(tokens, text)]
    frames += [encode_event(e) for e in stream.finish("length", {"input_tokens": 1, "output_tokens": 1000})]
    events = [orjson.loads(frame.split(b"data: ", 1)[1]) for frame in frames]
    streamed = [entry for e in events if e["type"] == "response.output_text.delta" for entry in e["logprobs"]]
    final = events[-1]
    assert final["type"] == "response.incomplete"
    completed = final["response"]["output"][0]["content"][0]["logprobs"]
    assert len(streamed) == 1000 and completed == streamed
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == streamed
    # What a stream holds for the end, events sent and dropped: its tokens packed (~18 bytes an entry,
    # ~240 KB measured with the array growth and the last batch of 32 tokens), not their JSON (which the
    # stream kept before: more than the ~360 KB it renders to).
    twin = ResponsesStream(settings, serialized=True)
    twin.start()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for tokens, text in _long_steps(1000):
        twin.feed(tokens, text)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    rendered = len(orjson.dumps(completed))
    assert rendered > 300_000 and held < rendered * 0.75, (held, rendered)


# A small id table as parse.id_table builds it (a hole: None), and tokens of it: some spelled with the
# table's bytes (the compiled batch keeps them as ids), some not (another id's bytes, a lossy spelling),
# some special, some without a plain logprob: each of these sends the rest to the arrays.
TABLE = (b"a", b"bc", "根".encode()[:2], "根".encode()[2:], b"", b" the", None, b"\xff", b"\n", b"\"q\\")
_TABLE_IDS = st.sampled_from([i for i, data in enumerate(TABLE) if data is not None])


def _table_candidate(draw_id: int, logprob: float) -> Candidate:
    return Candidate(TABLE[draw_id], logprob, draw_id, Origin.TOKEN_ID)


TABLE_CANDIDATE = st.builds(_table_candidate, _TABLE_IDS, st.floats(min_value=-30, max_value=0))
TABLE_TOKEN = st.builds(
    lambda token_id, logprob, top, absent: Token(TABLE[token_id], logprob, top, token_id, False, Origin.TOKEN_ID,
                                                 absent),
    _TABLE_IDS, st.floats(min_value=-30, max_value=0), st.lists(TABLE_CANDIDATE, max_size=7).map(tuple),
    st.booleans())
# Not of the table: bytes that are not the id's, a special token, an id past the table, a sentinel logprob.
ODD_TOKEN = st.one_of(
    st.builds(lambda t: t._replace(bytes=t.bytes + b"x"), TABLE_TOKEN),
    st.builds(lambda t: t._replace(special=True), TABLE_TOKEN),
    st.builds(lambda t: t._replace(token_id=len(TABLE) + 3), TABLE_TOKEN),
    st.builds(lambda t: t._replace(logprob=SENTINEL_LOGPROB), TABLE_TOKEN),
    st.builds(lambda t, c: t._replace(top=(*t.top, c._replace(token_id=None))), TABLE_TOKEN, TABLE_CANDIDATE),
)


@given(st.lists(st.lists(st.one_of(TABLE_TOKEN, TABLE_TOKEN, TABLE_TOKEN, ODD_TOKEN), max_size=12), max_size=6),
       st.integers(0, 8))
def test_tokens_kept_by_id_render_exactly_as_the_tokens_given(batches, k):
    packed = PackedTokens(TABLE)
    for batch in batches:
        packed.extend(batch)
    given_tokens = [token for batch in batches for token in batch]
    assert len(packed) == len(given_tokens)
    assert packed.render_json(k) == _render(given_tokens, k) == _render(packed.tokens(), k)


def test_a_stream_of_table_tokens_is_kept_as_ids_until_one_is_not():
    top = (_table_candidate(1, -0.5), _table_candidate(0, -0.1), _table_candidate(1, -0.7))
    plain = Token(TABLE[5], -0.25, top, 5, False, Origin.TOKEN_ID)
    packed = PackedTokens(TABLE)
    packed.extend([plain, plain._replace(top_absent=True)])
    assert packed.render_json(5) == render_responses_json([plain, plain], 5)
    lossy = plain._replace(bytes=b" th")  # a spelling the table does not give for id 5
    packed.extend([lossy])
    assert packed.render_json(5) == render_responses_json([plain, plain, lossy], 5)
    assert packed.tokens()[2].bytes == b" th" and len(packed) == 3


@given(st.lists(st.lists(TABLE_TOKEN, max_size=5), max_size=5), st.integers(0, 8))
def test_a_batch_extended_by_others_holds_their_tokens_after_its_own(batches, k):
    """TokenBatch.extend copies another batch's rows and alternatives after its own (the alternatives'
    ends moved by as many), top_absent kept: the joined batch is their tokens, in order, and renders so."""
    fastpath = pytest.importorskip("gateway.logprobs.compiled").fastpath
    if fastpath is None:
        pytest.skip("the compiled twin is not built")
    parts = []
    for tokens in batches:
        part = fastpath.token_batch(TABLE)
        assert part.append(tokens)
        parts.append(part)
    joined = fastpath.token_batch(TABLE)
    for part in parts:
        assert joined.extend(part)
    expected = [token for tokens in batches for token in tokens]
    assert [(*t[:6], t.top_absent) for t in joined.tokens()] == [(*t[:6], t.top_absent) for t in expected]
    assert joined.render_json(k, orjson.dumps) == render_responses_json(expected, k)
    assert joined.extend(joined) and len(joined) == 2 * len(expected)  # itself: read before it grows
    assert joined.tokens()[len(expected):] == joined.tokens()[:len(expected)]
    other_table = fastpath.token_batch(tuple(list(TABLE)))  # equal, another object
    assert not other_table.extend(joined) and len(other_table) == 0  # another table: refused, unchanged
