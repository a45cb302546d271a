"""The compiled SSE reader (`fastpath.sse_events`) against each real server's own stream framing: the
unit tests (tests/test_stream_batching.py) feed it framings we wrote; here the bytes are what vLLM and
llama-server sent the gateway, read by read as the network brought them (the recording relay's reads)."""

from __future__ import annotations

import pytest

from gateway.logprobs.compiled import fastpath
from gateway.sse import split_events
from tests.e2e import LOGPROBS, stream_response
from tests.real_engines.stack import start_gateway
from tests.test_stream_batching import _batches

pytestmark = pytest.mark.skipif(fastpath is None, reason="the C extension was not built (no compiler at install)")

ENGINES = {"vllm": "real_vllm", "llama": "real_llama_server"}


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("engine", list(ENGINES))
async def test_the_compiled_reader_takes_the_servers_own_stream_whole(request, aiohttp_server, engine, api):
    served = request.getfixturevalue(ENGINES[engine])
    stack = await start_gateway(aiohttp_server, served, api=api)
    response, _ = await stream_response(stack, input="Say hello with emoji 👋🏽 and 你好", temperature=0,
                                        max_output_tokens=24, top_logprobs=5, include=LOGPROBS)
    assert response.output[0].content[0].logprobs
    assert stack.recorder is not None
    exchange = await stack.recorder.last()
    assert exchange.request.get("stream") is True and exchange.status == 200
    body = exchange.body

    whole = fastpath.sse_events(body)
    assert whole is not None, body[:300]  # the server's framing is the compiled reader's: no Python fallback
    payloads, done, cut = whole
    assert done and cut <= len(body)
    assert payloads == split_events(body) and len(payloads) > 2
    # Read as it came: each read that starts at an event's start is taken by the compiled reader, and the
    # splitter's batches over the real reads are the whole body's events.
    arrived, checked = b"", 0
    for read in exchange.reads:
        if (not arrived or arrived.endswith(b"\n\n")) and b"\n" in read:
            assert fastpath.sse_events(read) is not None, read[:300]
            checked += 1
        arrived += read
    assert checked, [read[:80] for read in exchange.reads[:5]]
    batches = await _batches(exchange.reads)  # as aiohttp's reader would give them
    assert [p for batch in batches for p in batch] == payloads

