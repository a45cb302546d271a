"""The usual stream chunk goes straight to its frame (the upstream's `chunk_fields`, the front door's
`frame_writer`: a Responses `response.output_text.delta`, a chat `data:` chunk), as the server's stream loop
takes it; every other chunk is fed as a Step. The client must get the same bytes as when every chunk is fed
as a Step and its events encoded, and the counters the same counts.

Real upstream bytes: the vLLM simulator's chat and completions streams (token-id logprobs, as the
gateway asks for them), with text whose characters span tokens and steps of several tokens, so that both
ways are taken within one stream."""

from __future__ import annotations

import re

import aiohttp
import pytest

from gateway.app import OPENAI_CHUNK_FRAMING, RESPONSES_FRAMING
from gateway.canonical.generation import Generation
from gateway.logprobs.compiled import fastpath
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.parse import ParseOptions
from gateway.simulator.vllm import create_app as create_simulator
from gateway.sse import split_events
from gateway.translate.fronts import ChatFront, FrontTranslator, ResponsesFront
from gateway.translate.response_object import ResponseSettings
from gateway.upstreams.base import step_of_fields
from gateway.upstreams.dispatch import build_call

pytestmark = pytest.mark.skipif(fastpath is None, reason="the C extension was not built (no compiler at install)")

MODEL = "demo-model"
PROMPT = "say something"
# ASCII words, then characters of 2, 3 and 4 bytes, which the demo tokenizer spells in pieces.
REPLY = "Hello there, café and naïve; 日本語のテキスト 🎉🎉 and back to plain words. " * 2
_RANDOM = re.compile(rb'"(resp|msg|chatcmpl)_[0-9a-f]{48}"|"(created_at|completed_at|created)":\d+')


def _generation(k: int) -> Generation:
    return Generation(model=MODEL, messages=[{"role": "user", "content": PROMPT}], plain_input=PROMPT, max_tokens=120,
                      logprobs=k > 0, top_k_logprobs=k, stream=True)


async def _upstream_payloads(aiohttp_server, vocab, api: str, tokens_per_step, k: int) -> tuple[list[bytes], object]:
    simulator = await aiohttp_server(create_simulator(vocab, MODEL, default_reply=REPLY,
                                                      tokens_per_step=tokens_per_step))
    call = build_call(_generation(k), "vllm", api, MODEL, cap=20, token_ids=True, k_param="top_logprobs",
                      prompt=lambda: PROMPT)
    async with aiohttp.ClientSession() as session, session.post(
            str(simulator.make_url(call.path)), json={**call.body, "model": MODEL}) as reply:
        assert reply.status == 200, await reply.text()
        payloads = split_events(await reply.read())  # (the data of each event, [DONE] left out)
    assert payloads and b"[DONE]" not in payloads
    return payloads, call


def without_random(stream: bytes) -> bytes:
    """The stream with its ids and times masked (each translation makes its own)."""
    return _RANDOM.sub(b"<random>", stream)


def _front(door: str, vocab, k: int) -> FrontTranslator:
    """The front door as the server streams it."""
    if door == "chat":
        return ChatFront(_generation(k), include_usage=True, vocab=vocab)
    settings = ResponseSettings(model=MODEL, top_logprobs=k, include_logprobs=k > 0)
    return ResponsesFront(settings, vocab, serialized=True, deltas=True)


def _encode(door: str, items: list) -> bytes:
    return (OPENAI_CHUNK_FRAMING if door == "chat" else RESPONSES_FRAMING).encode(items)


def as_events(door: str, payloads, call, vocab, k: int, options: ParseOptions | None = None) -> tuple[bytes, int]:
    """Every chunk a Step, fed, its events encoded (`options`: the route's; by default the vocabulary's)."""
    front = _front(door, vocab, k)
    read = call.stream_reader(options or ParseOptions(vocab=vocab), front.takes_token_batches)
    items, from_ids, finish = front.start(), 0, None
    for data in payloads:
        step = read(data)
        from_ids += step.report.from_ids if step.report is not None else 0
        items += front.feed_step(step)
        finish = step.finish_reason or finish
    items += front.finish(finish, None)
    return _encode(door, items), from_ids


def as_frames(door: str, payloads, call, vocab, k: int, options: ParseOptions | None = None
              ) -> tuple[bytes, int, int, int, int]:
    """As the server's stream loop: the usual chunk straight to its frame, any other a Step."""
    front = _front(door, vocab, k)
    options = options or ParseOptions(vocab=vocab)
    read, fields_of, frame_of = call.stream_reader(options, True), call.fields_reader(options), front.frame_writer()
    assert fields_of is not None and frame_of is not None
    items: list = front.start()
    from_ids = framed = fed = waited = 0
    finish = None
    for data in payloads:
        fields = fields_of(data)
        if fields is not None:
            if fields[2] is None and (frame := frame_of(fields[0], fields[1])) is not None:
                if frame:
                    items.append(frame)
                else:
                    waited += 1
                framed += 1
                from_ids += len(fields[1])
                continue
            step = step_of_fields(fields)
        else:
            step = read(data)
        fed += 1
        from_ids += step.report.from_ids if step.report is not None else 0
        items += front.feed_step(step)
        finish = step.finish_reason or finish
    items += front.finish(finish, None)
    return _encode(door, items), from_ids, framed, fed, waited


@pytest.mark.parametrize("door", ["responses", "chat"])
@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("tokens_per_step", [1, "vary"])
@pytest.mark.parametrize("k", [0, 3])
async def test_a_stream_written_as_frames_is_the_stream_written_as_events(aiohttp_server, door, api, tokens_per_step,
                                                                         k):
    vocab = build_demo_vocab()
    payloads, call = await _upstream_payloads(aiohttp_server, vocab, api, tokens_per_step, k)
    events, ids_events = as_events(door, payloads, call, vocab, k)
    frames, ids_frames, framed, fed, waited = as_frames(door, payloads, call, vocab, k)
    assert without_random(frames) == without_random(events)
    assert ids_frames == ids_events > 0
    # Both ways were taken, and frames that wait for the rest of a character: the test compares something.
    assert framed > 5 and fed > 2 and waited > 5
