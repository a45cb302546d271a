"""The usual chunk straight to its frame, on what a real server streams: tests/test_delta_frames.py
compares the frames path with the events path on the vLLM simulator's streams; here the chunks are the
ones real vLLM sent the gateway (recorded), replayed through both paths and both front doors. The client
must get the same bytes either way, and the same from_ids counts. (llama-server's chunks never take the
frame: its route has no token-id logprobs to read them from, so there is nothing to compare.)"""

from __future__ import annotations

import pytest

from gateway.app import STATE
from gateway.logprobs.compiled import fastpath
from gateway.sse import split_events
from gateway.translate.front_doors import generation_from_responses
from tests.e2e import LOGPROBS, stream_response
from tests.real_engines.stack import start_gateway
from tests.test_delta_frames import as_events, as_frames, without_random

pytestmark = pytest.mark.skipif(fastpath is None, reason="the C extension was not built (no compiler at install)")

K = 3
# Characters of 1 to 4 UTF-8 bytes, which byte-level tokenizers split across tokens.
PROMPT = "Write one line with the words café, naïve, 日本語 and the emoji 🎉👋🏽, then plain English."


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_a_real_vllm_stream_as_frames_is_the_stream_as_events(aiohttp_server, real_vllm, api):
    stack = await start_gateway(aiohttp_server, real_vllm, api=api)
    params = {"input": PROMPT, "temperature": 0, "max_output_tokens": 64, "top_logprobs": K, "include": LOGPROBS}
    response, _ = await stream_response(stack, **params)
    assert response.output[0].content[0].logprobs
    assert stack.recorder is not None
    exchange = await stack.recorder.last()
    assert exchange.request.get("stream") is True and exchange.status == 200
    payloads = split_events(exchange.body)

    route = stack.gateway.app[STATE].routes[stack.model]
    call = route.upstream_call(generation_from_responses({"model": stack.model, "stream": True, **params}),
                               "top_logprobs")
    options = route.parse_options()
    for door in ("responses", "chat"):
        events, ids_events = as_events(door, payloads, call, route.vocab, K, options)
        frames, ids_frames, framed, fed, _ = as_frames(door, payloads, call, route.vocab, K, options)
        assert without_random(frames) == without_random(events), door
        assert ids_frames == ids_events
        assert framed + fed == len(payloads) and b"logprobs" in frames
        # The usual chunk (one token) took the frame. How many tokens a chunk holds is the server's timing:
        # the first often holds a dozen or more.
        assert framed >= 5, (door, framed, fed)
