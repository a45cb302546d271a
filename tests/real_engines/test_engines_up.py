"""The session's real servers are up and serve the model the fixtures name, and the gateway reaches them."""

from __future__ import annotations

import aiohttp

from tests.real_engines.stack import start_gateway


async def _models(base_url: str) -> list[str]:
    async with aiohttp.ClientSession() as session, session.get(base_url + "/v1/models") as answer:
        assert answer.status == 200
        return [model["id"] for model in (await answer.json())["data"]]


async def test_vllm_serves_the_tiny_qwen2(real_vllm, aiohttp_server) -> None:
    assert real_vllm.model in await _models(real_vllm.base_url)
    assert (real_vllm.model_dir / "tokenizer.json").is_file()
    stack = await start_gateway(aiohttp_server, real_vllm)
    answer = await stack.client.chat.completions.create(model=stack.model, max_tokens=3,
                                                        messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens <= 3


async def test_llama_server_serves_smollm2(real_llama_server, aiohttp_server) -> None:
    assert real_llama_server.model in await _models(real_llama_server.base_url)
    stack = await start_gateway(aiohttp_server, real_llama_server)
    answer = await stack.client.chat.completions.create(model=stack.model, max_tokens=3,
                                                        messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content is not None
    assert answer.usage is not None and answer.usage.completion_tokens <= 3
