"""One write per upstream read: however the upstream's bytes are split into reads, the client gets
the same events byte for byte (ids and clocks aside), failures keep the events before them, and the
counters end the same; the SSE splitter's batches are exactly its payloads, one batch per read."""

import asyncio
import gc
import random
import re

import aiohttp
import pytest
from aiohttp import web

from gateway import app as app_module
from gateway.app import STATE, create_app
from gateway.canonical.step import UpstreamFormatError
from gateway.config import parse_config
from gateway.logprobs.compiled import fastpath
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.report import TranslationReport
from gateway.simulator.vllm import create_app as create_simulator
from gateway.sse import MAX_EVENT_BYTES, _events, data_batches, data_payloads, split_events
from gateway.upstreams.base import _FROM_IDS_REPORTS

MODEL = "demo-model"


# --- the splitter ------------------------------------------------------------------------------------


class _Reads:
    """aiohttp's StreamReader as far as the splitter uses it: `iter_any()` yields the reads."""

    def __init__(self, reads):
        self.reads = reads

    def iter_any(self):
        async def reads():
            for read in self.reads:
                yield read

        return reads()


async def _batches(reads):
    return [batch async for batch in data_batches(_Reads(reads))]


async def _payloads(reads):
    return [payload async for payload in data_payloads(_Reads(reads))]


def test_batches_hold_exactly_the_payloads_and_are_never_empty():
    rng = random.Random(11)
    pieces = [b'data: {"a":1}\n\n', b"data: x\r\n\r\n", b"event: e\ndata: 1\ndata: 2\n\n", b": comment\n\n",
              b"data:nospace\n\n", b"data: [DONE]\n\n", b"data: after\n\n", b"data: tail", b"\r\r\n", b"\n",
              b"\r", b"data: \xe6\x97\xa5\n\n"]
    for _ in range(500):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(0, 6))))
        reads = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True) if b > a]
        batches = asyncio.run(_batches(reads))
        assert all(batches), data
        assert [p for batch in batches for p in batch] == asyncio.run(_payloads(reads)), data
        assert asyncio.run(_payloads(reads)) == split_events(data), (data, reads)  # the whole body's reader


TAKEN = [b'data: {"a":1}\n\n', b'data: {"a":1}\n\ndata: {"b":2}\n\n', b"data:x\n\n", b"data:\n\n", b"data: \n\n",
         b"\n\n\n", b"data: [DONE]\n\n", b"data:  [DONE] \n\ndata: late\n\n", b"data: 1\n\ndata: [DONE]\n\n",
         b"data: [DONE]x\n\n", b"data: \t[DONE]\x0c\n\n", b"data: 1", b"data: 1\n\ndata: 2", b"data: 1\n\n\nda", b""]
# left to Python: an event cut after a line end, a CR, another field, data on two lines, an error line
LEFT = [b"data: 1\n", b"data: 1\n\ndata: 2\n", b"data: 1\r\n\r\n", b": ping\n\n", b"event: e\ndata: 1\n\n",
        b"data: 1\ndata: 2\n\n", b'error: {"code":500}\n\n', b"dat: 1\n\n", b"data: 1\n\n: ping\n\n", b"data: 1\r"]


@pytest.mark.skipif(fastpath is None, reason="the C extension was not built (no compiler at install)")
@pytest.mark.parametrize(("read", "taken"), [(read, True) for read in TAKEN] + [(read, False) for read in LEFT])
def test_the_compiled_event_reader_reads_what_the_line_reader_reads(read, taken):
    compiled = fastpath.sse_events(read)
    assert (compiled is not None) is taken
    if taken:
        payloads, done, cut = compiled
        lines = (read if done else read[:cut]).split(b"\n")  # after [DONE] nothing is read
        rest = lines.pop()
        assert (payloads, done) == _events(lines, buffer := [])
        assert done or (not buffer and not rest and b"\n" not in read[cut:])  # what is left: a line's start


_MIB = b"x" * (1024 * 1024)


async def test_the_reader_refuses_an_event_past_the_bound_and_not_many_events_past_it():
    over = MAX_EVENT_BYTES // len(_MIB) + 1
    with pytest.raises(UpstreamFormatError, match="without ending an event"):
        await _batches([b"data: {"] + [_MIB] * over)
    with pytest.raises(UpstreamFormatError):  # data lines that never come to a blank line
        await _batches([b"data: " + _MIB[:-8] + b"\n"] * over)
    event = b"data: " + _MIB[:-8] + b"\n\n"  # ~1 MiB events, as many as the bound and more: all read
    batches = await _batches([event] * over + [b"data: [DONE]\n\n"])
    assert sum(len(batch) for batch in batches) == over


def test_the_events_of_one_read_come_as_one_batch():
    read = b"".join(b'data: {"n":%d}\n\n' % i for i in range(5))
    assert asyncio.run(_batches([read, b'data: {"n":5}\n', b"\n", b"data: [DONE]\n\ndata: late\n\n"])) == [
        [b'{"n":%d}' % i for i in range(5)], [b'{"n":5}']]


# --- through the gateway -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


async def _recorded_frames(aiohttp_server, vocab) -> list[bytes]:
    """A vLLM chat stream with token-id logprobs, as the gateway would get it, one frame per event."""
    simulator = await aiohttp_server(create_simulator(vocab, MODEL))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 3,
            "stream": True, "stream_options": {"include_usage": True}, "return_tokens_as_token_ids": True,
            "max_tokens": 40, "ignore_eos": True}
    async with aiohttp.ClientSession() as session, session.post(
            str(simulator.make_url("/v1/chat/completions")), json=body) as reply:
        raw = await reply.read()
    frames = [frame + b"\n\n" for frame in raw.split(b"\n\n") if frame.strip()]
    assert frames[-1] == b"data: [DONE]\n\n" and len(frames) > 30
    return frames


def _replay(frames: list[bytes], reads: list[int]) -> web.Application:
    """An upstream that writes `frames` grouped into writes of `reads[i]` frames, pausing in between
    so that each write reaches the gateway as its own read."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        start = 0
        for count in reads:
            if start < len(frames):
                await response.write(b"".join(frames[start:start + count]))
                await asyncio.sleep(0.01)
            start += count
        if start < len(frames):
            await response.write(b"".join(frames[start:]))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def _through_gateway(aiohttp_server, frames, reads, writes: list[int]):
    upstream = await aiohttp_server(_replay(frames, reads))
    config = parse_config({"upstreams": {"sim": {"urls": [str(upstream.make_url("")).rstrip("/")],
                                                 "health_interval": 0}},
                           "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "none"}}, base_dir=__import__("pathlib").Path("."))
    gateway = await aiohttp_server(create_app(config))
    body = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 40, "top_logprobs": 3,
            "include": ["message.output_text.logprobs"]}
    before = len(writes)
    async with aiohttp.ClientSession() as session, session.post(
            str(gateway.make_url("/v1/responses")), json=body) as reply:
        assert reply.status == 200
        data = await reply.read()
    metrics = gateway.app[STATE].metrics
    from_ids = metrics.from_ids.labels(MODEL, "sim")._value.get()
    return data, len(writes) - before, from_ids


_RANDOM = re.compile(rb'"(resp|msg)_[0-9a-f]{48}"|"(created_at|completed_at)":\d+')


def _normalized(data: bytes) -> bytes:
    return _RANDOM.sub(b"<random>", data)


@pytest.fixture
def writes(monkeypatch):
    """Every body write the gateway makes to a streaming client, by size."""
    calls: list[int] = []
    original_write, original_eof = app_module._EventStreamResponse.write, app_module._EventStreamResponse.write_eof

    async def write(self, data):
        calls.append(len(data))
        await original_write(self, data)

    async def write_eof(self, data=b""):
        calls.append(len(data))
        await original_eof(self, data)

    monkeypatch.setattr(app_module._EventStreamResponse, "write", write)
    monkeypatch.setattr(app_module._EventStreamResponse, "write_eof", write_eof)
    return calls


async def test_the_same_bytes_whether_the_upstream_sends_one_event_per_read_or_all_at_once(aiohttp_server, vocab,
                                                                                         writes):
    frames = await _recorded_frames(aiohttp_server, vocab)
    _FROM_IDS_REPORTS.clear()  # a cache: emptied so that what fills it below came from these streams
    one_by_one, many, ids_one = await _through_gateway(aiohttp_server, frames, [1] * len(frames), writes)
    at_once, few, ids_all = await _through_gateway(aiohttp_server, frames, [len(frames)], writes)
    uneven, _, ids_uneven = await _through_gateway(aiohttp_server, frames, [3, 1, 7, 2, 11, 5], writes)
    assert _normalized(one_by_one) == _normalized(at_once) == _normalized(uneven)
    assert re.findall(rb"^event: (\S+)$", one_by_one, flags=re.M)[-1] == b"response.incomplete"  # at max tokens
    # One write per read: the start, the whole upstream body (a read or a few, as TCP delivers it),
    # then the closing events with the end of the chunked body; one by one: a write per event.
    assert many > 20 and few < many / 4
    assert ids_one == ids_all == ids_uneven > 0  # the counters end the same, however often they were updated
    # ... and count every output token (each read from its id), whether its chunk became a frame or a Step
    usage = re.findall(rb'"output_tokens":(\d+)', one_by_one)[-1]
    assert ids_one == int(usage) == 40
    # A chunk read from ids shares its count's report with every other such chunk: none may have changed it.
    assert _FROM_IDS_REPORTS  # these streams' chunks went that way
    assert all(report == TranslationReport(from_ids=count) for count, report in _FROM_IDS_REPORTS.items())


async def test_a_broken_event_in_a_read_still_sends_the_events_before_it(aiohttp_server, vocab, writes):
    frames = await _recorded_frames(aiohttp_server, vocab)
    broken = [*frames[:10], b"data: {not json\n\n", *frames[10:]]
    data, count, ids_broken = await _through_gateway(aiohttp_server, broken, [len(broken)], writes)
    events = re.findall(rb"^event: (\S+)$", data, flags=re.M)
    assert events[-1] == b"response.failed" and b"response.completed" not in events
    deltas = events.count(b"response.output_text.delta")
    assert deltas > 0  # the good chunks before the broken one reached the client
    good, _, ids_good = await _through_gateway(aiohttp_server, [*frames[:10], b"data: [DONE]\n\n"], [1] * 11, writes)
    assert deltas == re.findall(rb"^event: (\S+)$", good, flags=re.M).count(b"response.output_text.delta")
    assert ids_broken == ids_good > 0  # the tokens read before the broken event (in the same read) are counted
    assert count < 10  # not one write per event


async def test_startup_raises_the_first_gc_threshold(aiohttp_server):
    config = parse_config({"upstreams": {"sim": {"urls": ["http://127.0.0.1:9"], "health_interval": 0}},
                           "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "none"}}, base_dir=__import__("pathlib").Path("."))
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        await aiohttp_server(create_app(config))
        assert gc.get_threshold() == (app_module._GC_GEN0_THRESHOLD, 10, 10)
    finally:
        gc.set_threshold(*saved)


def _delayed(frames: list[bytes], delay: float) -> web.Application:
    """An upstream that answers with its headers at once and its first event only after `delay`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": warming up\n\n")
        await asyncio.sleep(delay)
        await response.write(b"".join(frames))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handler)
    return app


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/responses", {"input": "hi", "max_output_tokens": 40}),  # starts with events: headers come with them
    ("/v1/completions", {"prompt": "hi", "max_tokens": 40}),  # starts with nothing: headers alone
])
async def test_the_client_gets_the_headers_before_the_first_token(aiohttp_server, vocab, path, body):
    frames = await _recorded_frames(aiohttp_server, vocab)
    upstream = await aiohttp_server(_delayed(frames, 0.8))
    config = parse_config({"upstreams": {"sim": {"urls": [str(upstream.make_url("")).rstrip("/")],
                                                 "health_interval": 0, "api": "chat"}},
                           "models": {MODEL: {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
                           "store": {"backend": "none"}}, base_dir=__import__("pathlib").Path("."))
    gateway = await aiohttp_server(create_app(config))
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with aiohttp.ClientSession() as session, session.post(
            str(gateway.make_url(path)), json={"model": MODEL, "stream": True, **body}) as reply:
        assert reply.status == 200 and loop.time() - started < 0.5
        assert (await reply.read()).rstrip().endswith(b"}") or path == "/v1/completions"


def test_metric_children_are_the_labelled_series_and_appear_only_once_used():
    from gateway.logprobs.report import TranslationReport
    from gateway.metrics import Metrics

    metrics = Metrics()
    assert metrics.child(metrics.tokens, "m", "u", "in") is metrics.tokens.labels("m", "u", "in")
    assert metrics.child(metrics.tokens, "m", "u", "in") is metrics.child(metrics.tokens, "m", "u", "in")
    counters = metrics.report_counters("m", "u")
    assert counters is metrics.report_counters("m", "u")
    counters.add(TranslationReport(from_ids=3))
    counters.add(TranslationReport(from_ids=2, sentinels=1, ambiguous_positions=[4, 5]))
    assert b"gateway_logprob_tokens_from_ids_total{" not in metrics.exposition()  # pending until flushed
    counters.flush()
    counters.flush()  # nothing pending: no change
    metrics.count_report("m", "u", TranslationReport(aligned=1))
    metrics.count_report("m", "u", None)
    text = metrics.exposition().decode()
    assert 'gateway_logprob_tokens_from_ids_total{model="m",upstream="u"} 5.0' in text
    assert 'gateway_logprob_sentinels_mapped_total{model="m",upstream="u"} 1.0' in text
    assert 'gateway_logprob_ambiguous_positions_total{model="m",upstream="u"} 2.0' in text
    assert 'gateway_logprob_tokens_aligned_total{model="m",upstream="u"} 1.0' in text
    assert "gateway_logprob_collisions_resolved_total{" not in text  # never counted: no series


def _reference_final_prefix(data):
    """What `_final_prefix` answers, by the definition: replace every invalid subpart, stop before an
    unfinished last character (the only "unexpected end of data" error the decoder reports)."""
    import codecs

    cut = []

    def handler(err):
        if err.reason == "unexpected end of data":
            cut.append(err.start)
            return "", err.end
        return "\ufffd", err.end

    codecs.register_error("test-final-prefix", handler)
    text = data.decode("utf-8", errors="test-final-prefix")
    used = cut[0] if cut else len(data)
    return text, used


def test_grouping_decodes_the_final_prefix_like_the_definition():
    import itertools

    from gateway.translate.grouping import _final_prefix

    for length in (1, 2):
        for values in itertools.product(range(256), repeat=length):
            data = bytes(values)
            assert _final_prefix(data) == _reference_final_prefix(data), data
    edges = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED,
             0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]
    for length in (3, 4):
        for values in itertools.product(edges, repeat=length):
            data = bytes(values)
            assert _final_prefix(data) == _final_prefix(bytearray(data)) == _reference_final_prefix(data), data
