"""Exactness against real vLLM: what the gateway answered vs what vLLM sent it (by token id)."""

from __future__ import annotations

from typing import Any

from tests.e2e import assert_bytes_spell
from tests.real_engines.fronts import Answer, ask
from tests.real_engines.stack import RealStack
from tests.real_engines.truth import TokenTable, Truth

K = 5
# vLLM's finish_reason -> what each front door says (Responses: "stop" = completed, else the incomplete reason)
FINISH = {"responses": {"length": "max_output_tokens"}, "chat": {}, "completions": {}}


def dangling(data: bytes) -> int:
    """How many bytes at the end of `data` start a character that is not finished (0 to 3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last character's first byte
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
            return back if back < need else 0
    return 0


def assert_text_and_bytes(entries: list[bytes], text: str) -> None:
    """tests.e2e.assert_bytes_spell, where a cap may have stopped generation inside a character: vLLM's
    detokenizer then never writes the last tokens it held back (the ones since its text last ended on a
    whole character), so the text is spelled by the tokens before them and they end inside a character."""
    for cut in range(len(entries), -1, -1):
        tail = b"".join(entries[cut:])
        if cut < len(entries) and not dangling(tail):
            continue
        head = b"".join(entries[:cut])
        if head == text.encode() or ("\ufffd" in text and head.decode("utf-8", errors="replace") == text):
            return
    assert_bytes_spell(b"".join(entries), text)  # fails, saying how


def assert_exact(answer: Answer, truth: Truth, k: int, front: str) -> None:
    """The gateway's entries are vLLM's tokens: bytes, logprob, the true top k sorted (legacy completions:
    and the sampled token when it is not among them, as OpenAI's up to k + 1); its text is vLLM's."""
    assert answer.text == truth.text, [t.data for t in truth.visible[-4:]]
    assert_text_and_bytes([e[0] for e in answer.entries], answer.text)
    assert [e[0] for e in answer.entries] == [t.data for t in truth.visible]
    assert [e[1] for e in answer.entries] == [t.logprob for t in truth.visible]
    for position, (data, logprob, top) in enumerate(answer.entries):
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True), (position, top)
        expected = truth.top_k(position, k)
        if front == "completions" and (data, logprob) not in expected:
            expected = [*expected, (data, logprob)]
        assert sorted(top, key=lambda c: (-c[1], c[0])) == expected, position


async def exact_case(stack: RealStack, table: TokenTable, front: str, stream: bool,
                     **options: Any) -> tuple[Answer, Truth]:
    """One request through `front`; its answer is asserted exact against what vLLM sent for it."""
    answer = await ask(stack, front, stream=stream, k=K, **options)
    assert stack.recorder is not None
    exchange = await stack.recorder.last()
    truth = exchange.truth(table)
    assert_exact(answer, truth, K, front)
    return answer, truth
