"""Real vLLM behind the gateway with its default store (SQLite): a stored Response reads back byte for byte
as it was sent, streamed or not, over a chat route and a completions route, short (deflated in the writer
thread) and long (past LONG_RESPONSE_TOKENS: encoded at once). Streamed, and whole where the body's text is
what its tokens spell, it is stored from vLLM's token ids (store.codec's batch path); a whole answer whose
text is not (the tiny model's invalid UTF-8 mid-text, common in 300 tokens) is stored from its JSON."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from gateway.store.writer import LONG_RESPONSE_TOKENS
from tests.real_engines.stack import start_gateway


async def _create(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with session.post(url, json=body) as answer:
        assert answer.status == 200, await answer.text()
        if not body["stream"]:
            return orjson.loads(await answer.read())
        terminal = None
        async for line in answer.content:
            if line.startswith(b"data: "):
                event = orjson.loads(line[6:])
                if event["type"] in ("response.completed", "response.incomplete"):
                    terminal = event["response"]
        assert terminal is not None
        return terminal


@pytest.mark.parametrize("tokens", [12, LONG_RESPONSE_TOKENS + 44])
@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_stored_response_reads_back_as_sent(real_vllm, aiohttp_server, tmp_path, route, stream,
                                                    tokens) -> None:
    stack = await start_gateway(aiohttp_server, real_vllm, api=route,
                                store={"backend": "sqlite", "path": str(tmp_path / "responses.sqlite3")})
    body = {"model": stack.model, "input": "hi", "max_output_tokens": tokens, "top_logprobs": 5,
            "include": ["message.output_text.logprobs"], "stream": stream}
    async with aiohttp.ClientSession() as session:
        sent = await _create(session, stack.url("/v1/responses"), body)
        part = sent["output"][0]["content"][0]
        assert part["logprobs"] and len(part["logprobs"][0]["top_logprobs"]) == 5
        async with session.get(stack.url(f"/v1/responses/{sent['id']}"),
                               params={"include[]": "message.output_text.logprobs"}) as stored:
            assert stored.status == 200
            assert orjson.dumps(orjson.loads(await stored.read())) == orjson.dumps(sent)
