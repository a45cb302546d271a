"""SSE both ways: frames that share one logprob list serialize it once and still read back exactly;
a long message's closing frames go out holding that list once (no copy per frame, no joined copy);
splitting a byte stream by reads gives the same payloads as reading it line by line."""

import asyncio
import random
import socket
import threading
import tracemalloc

import orjson
from aiohttp import web

from gateway.app import RESPONSES_FRAMING, SSESink
from gateway.logprobs.tokens import Candidate, Token
from gateway.sse import SPLIT_AT, data_payloads, encode_event, encode_events, encode_pieces
from gateway.translate.response_object import ResponseSettings
from gateway.translate.stream import ResponsesStream
from tests.test_packed_tokens import _long_steps


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


def _long_message_ending(serialized):
    """The closing frames of a 1,000-token message with k=5 (its logprob list's JSON ~360 KB)."""
    stream = ResponsesStream(ResponseSettings(model="m", top_logprobs=5, include_logprobs=True), serialized=serialized)
    stream.start()
    for tokens, text in _long_steps(1000):
        stream.feed(tokens, text)
    return stream.finish("stop", {"input_tokens": 1, "output_tokens": 1000})


def test_closing_frames_in_pieces_share_one_copy_of_the_long_list():
    for serialized in (True, False):  # the list as the server's Fragment, or as dicts
        events = _long_message_ending(serialized)
        pieces = encode_pieces(events)
        assert b"".join(pieces) == encode_events(events) == b"".join(_plain(e) for e in events)
        long = [piece for piece in pieces if len(piece) >= SPLIT_AT]
        assert len(long) == 4 and all(piece is long[0] for piece in long)  # one object, four frames
        assert orjson.loads(long[0]) == orjson.loads(encode_event(events[-1]).split(b"data: ", 1)[1])[
            "response"]["output"][0]["content"][0]["logprobs"]
        assert sum(len(piece) for piece in pieces if piece is not long[0]) < 20_000  # the rest is small


def test_short_lists_stay_in_one_joined_piece():
    events = _finished_stream_events(40)
    assert encode_pieces(events) == [b"".join(_plain(e) for e in events)]


def _read_all(port, into):
    """A client on its own thread reading into a buffer made beforehand (it allocates nothing per read)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        view, size = memoryview(into[0]), 0
        while count := sock.recv_into(view[size:]):
            size += count
        into.append(size)


def _dechunked(raw):
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    body = []
    while True:
        length, _, rest = rest.partition(b"\r\n")
        if int(length, 16) == 0:
            return b"".join(body)
        body.append(rest[:int(length, 16)])
        rest = rest[int(length, 16) + 2:]


async def test_a_long_messages_ending_is_written_holding_its_list_about_once(aiohttp_server):
    """What a stream's ending holds while it is written, measured (tracemalloc) inside a real aiohttp
    server writing to a real socket: before, the four frames each copied the list, were joined, and
    aiohttp joined that again with the chunk header (~8x the list); now ~1x, plus a 64 KB slice."""
    events = _long_message_ending(True)
    expected = encode_events(events)
    list_size = max(len(piece) for piece in encode_pieces(events))
    measured = {}

    async def handler(request):
        request["request_id"] = "req_1"
        sink = SSESink(request, RESPONSES_FRAMING)
        await sink.begin([])
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        await sink.end(events, False)
        measured["peak"] = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        return sink.response

    app = web.Application()
    app.router.add_get("/", handler)
    server = await aiohttp_server(app)
    received = [bytearray(4 * len(expected))]
    client = threading.Thread(target=_read_all, args=(server.port, received))
    client.start()
    await asyncio.get_running_loop().run_in_executor(None, client.join)
    assert _dechunked(bytes(received[0][:received[1]])) == expected
    assert list_size > 300_000 and measured["peak"] < 2 * list_size, (measured, list_size)


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
