"""SSE both ways: frames that share one logprob list serialize it once and still read back exactly;
splitting a byte stream by reads gives the same payloads as reading it line by line."""

import asyncio
import random

import orjson

from gateway.logprobs.tokens import Candidate, Token
from gateway.sse import data_payloads, encode_event
from gateway.translate.response_object import ResponseSettings
from gateway.translate.stream import ResponsesStream


def _plain(event):
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _finished_stream_events(count):
    stream = ResponsesStream(ResponseSettings(model="m", top_logprobs=2, include_logprobs=True))
    events = stream.start()
    for index in range(count):
        top = (Candidate(b"x", -0.5, 1), Candidate(b"\xe6", -0.7, 2), Candidate(b"y", -1.5, 3))
        events += stream.feed([Token(b"ab" if index % 2 else b"\xf0\x9f\xa6\x80", -0.25, top, 7)])
    return events + stream.finish("length", None)


def test_frames_repeating_the_whole_logprob_list_encode_exactly_as_plain_json():
    for count in (3, 40):  # below and above the length at which the list is shared
        events = _finished_stream_events(count)
        before = orjson.dumps(events)
        assert [encode_event(e) for e in events] == [_plain(e) for e in events]
        assert orjson.dumps(events) == before  # the events themselves are left as they were
        final = orjson.loads(encode_event(events[-1]).split(b"data: ", 1)[1])
        assert len(final["response"]["output"][0]["content"][0]["logprobs"]) == count


def test_a_list_changed_between_two_frames_is_serialized_again():
    events = _finished_stream_events(40)
    done = next(e for e in events if e["type"] == "response.output_text.done")
    first = encode_event(done)
    done["logprobs"].append(done["logprobs"][0])  # same list object, one more entry
    assert encode_event(done) == _plain(done) != first


class _Reader:
    """What aiohttp's StreamReader offers: lines when iterated, arbitrary reads from iter_any()."""

    def __init__(self, data, sizes):
        self.data, self.sizes = data, sizes

    def __aiter__(self):
        async def lines():  # like readline: split after each b"\n" only
            start = 0
            while start < len(self.data):
                end = self.data.find(b"\n", start)
                end = len(self.data) if end < 0 else end + 1
                yield self.data[start:end]
                start = end
        return lines()

    def iter_any(self):
        async def reads():
            start = 0
            for size in self.sizes:
                if start < len(self.data):
                    yield self.data[start:start + size]
                start += size
            if start < len(self.data):
                yield self.data[start:]
        return reads()


async def _collect(source):
    return [payload async for payload in data_payloads(source)]


async def _lines_only(reader):
    async for line in reader:
        yield line


def test_reading_whatever_arrived_splits_payloads_like_reading_line_by_line():
    rng = random.Random(7)
    pieces = [b'data: {"a":1}\n\n', b"data: x\r\n\r\n", b"event: e\ndata: 1\ndata: 2\n\n", b": comment\n\n",
              b"data:nospace\n\n", b"data: [DONE]\n\n", b"data: after\n\n", b"data: tail", b"\r\r\n", b"\n"]
    for _ in range(500):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        reader = _Reader(data, [rng.randint(1, 12) for _ in range(40)])
        by_line = asyncio.run(_collect(_lines_only(reader)))
        assert asyncio.run(_collect(reader)) == by_line, data
