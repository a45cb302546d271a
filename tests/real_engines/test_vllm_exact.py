"""Real vLLM 0.32.0 behind the gateway with the Qwen2 tokenizer configured: every token's bytes and
logprob are exactly vLLM's own (its token ids, recorded on the wire, read with `tokenizers`), and the
top lists are the true top k, sorted, on all three front doors, streamed and not, over a chat route
and a completions route.

The tiny model writes mostly CJK characters split across two tokens, and at temperature 1 now and
then starts a character it never finishes (invalid UTF-8 mid-text, which vLLM writes as U+FFFD).
"""

from __future__ import annotations

import pytest

from tests.real_engines.exact import FINISH, exact_case
from tests.real_engines.fronts import FRONTS
from tests.real_engines.stack import start_gateway


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("front", FRONTS)
async def test_exact_against_vllm_ids(real_vllm, aiohttp_server, vllm_tokens, front, stream, route) -> None:
    stack = await start_gateway(aiohttp_server, real_vllm, api=route)
    answer, truth = await exact_case(stack, vllm_tokens, front, stream, max_tokens=12)
    assert truth.visible, "vLLM generated nothing"
    assert answer.finish == FINISH[front].get(truth.finish_reason, truth.finish_reason)
