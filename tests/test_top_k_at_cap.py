"""k at the server's cap: vLLM puts the sampled token first in a list of k, so a sampled token outside
the true top k pushes out the true k-th; below the cap the gateway asks for k+1, at the cap it cannot.
Then the sampled token is shown only where it is provably in the top k (fewer entries otherwise, as
OpenAI allows), never a candidate outside the true top k (the issue: 12 of 12 such positions wrong)."""

import json

import aiohttp
import pytest

from gateway.simulator import vllm
from tests.e2e import start_stack

REPLY = "Hi there, plenty of tokens so that some sampled ones rank below the top twenty: one two three four."
MESSAGES = [{"role": "user", "content": "hello"}]


async def _json(session, url, body):
    async with session.post(url, json=body) as reply:
        assert reply.status == 200, await reply.text()
        return await reply.json()


@pytest.mark.parametrize("stream", [False, True])
async def test_k_at_the_cap_shows_only_the_true_top_k(aiohttp_server, demo_vocab, stream):
    stack = await start_stack(aiohttp_server, demo_vocab, replies={"hello": REPLY}, max_logprobs=20)
    uncapped = await aiohttp_server(vllm.create_app(demo_vocab, stack.model, replies={"hello": REPLY},
                                                    max_logprobs=-1))
    async with aiohttp.ClientSession() as session:
        truth = await _json(session, str(uncapped.make_url("/v1/chat/completions")),
                            {"model": stack.model, "messages": MESSAGES, "logprobs": True, "top_logprobs": 21,
                             "return_tokens_as_token_ids": True})
        body = {"model": stack.model, "messages": MESSAGES, "logprobs": True, "top_logprobs": 20, "stream": stream}
        async with session.post(stack.url("/v1/chat/completions"), json=body) as reply:
            assert reply.status == 200
            if stream:
                chunks = [json.loads(line[6:]) for line in (await reply.text()).splitlines()
                          if line.startswith("data: {")]
                entries = [e for c in chunks for ch in c["choices"] for e in ((ch.get("logprobs") or {})
                                                                               .get("content") or [])]
            else:
                entries = (await reply.json())["choices"][0]["logprobs"]["content"]
    true_entries = truth["choices"][0]["logprobs"]["content"][: len(entries)]  # the gateway sets EOS aside
    shorter = 0
    for entry, true in zip(entries, true_entries, strict=True):
        # The uncapped list of 21 holds the top 20 whichever way the sampled token ranks.
        ranked = sorted(true["top_logprobs"], key=lambda c: -c["logprob"])[:20]
        allowed = {(c["logprob"], demo_vocab.token_bytes(int(c["token"][9:]))) for c in ranked}
        shown = {(c["logprob"], bytes(c["bytes"])) for c in entry["top_logprobs"]}
        assert shown <= allowed, entry["token"]
        assert len(entry["top_logprobs"]) >= 19
        shorter += len(entry["top_logprobs"]) == 19
    assert shorter  # the simulator puts the sampled token outside the top 20 at every 7th position


async def test_below_the_cap_the_gateway_asks_for_one_more(aiohttp_server, demo_vocab):
    stack = await start_stack(aiohttp_server, demo_vocab, replies={"hello": REPLY}, max_logprobs=21,
                              upstream_options={"max_top_logprobs": 21})
    async with aiohttp.ClientSession() as session:
        body = {"model": stack.model, "messages": MESSAGES, "logprobs": True, "top_logprobs": 20}
        entries = (await _json(session, stack.url("/v1/chat/completions"), body))["choices"][0]["logprobs"]["content"]
    assert all(len(e["top_logprobs"]) == 20 for e in entries)
