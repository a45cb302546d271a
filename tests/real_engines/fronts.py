"""One request through each of the gateway's front doors, read back as (text, entries, finish).

Every answer is parsed by the OpenAI SDK with strict validation (the Responses ones also event by event,
tests.e2e.create_response); entries are (bytes, logprob, [(bytes, logprob), ...]) whatever the format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.e2e import LOGPROBS, create_response, stream_response

FRONTS = ("responses", "chat", "completions")
PROMPT = "Write something."

Entry = tuple[bytes, float, list[tuple[bytes, float]]]


@dataclass
class Answer:
    text: str
    entries: list[Entry]
    finish: str | None  # chat/completions finish_reason; Responses: "stop" or the incomplete reason
    raw: Any  # the SDK object (Responses: the final Response)
    events: list[dict[str, Any]]  # Responses streams: every event


def completions_token_bytes(spelling: str) -> bytes:
    """The bytes a legacy completions token string stands for: text, or `bytes:` + `\\xNN` escapes."""
    if spelling.startswith("bytes:"):
        escapes = spelling.removeprefix("bytes:")
        assert re.fullmatch(r"(\\x[0-9a-f]{2})*", escapes), spelling
        return bytes(int(escapes[i + 2:i + 4], 16) for i in range(0, len(escapes), 4))
    return spelling.encode()


def _chat_entries(content: list[Any]) -> list[Entry]:
    return [(bytes(e.bytes), e.logprob, [(bytes(t.bytes), t.logprob) for t in e.top_logprobs]) for e in content]


async def ask(stack: Any, front: str, *, stream: bool, k: int | None = 5, max_tokens: int = 12,
              temperature: float = 1.0, prompt: str = PROMPT) -> Answer:
    """One generation through `front` (k None: no logprobs asked)."""
    if front == "responses":
        params: dict[str, Any] = {"input": prompt, "max_output_tokens": max_tokens, "temperature": temperature}
        if k is not None:
            params.update(top_logprobs=k, include=LOGPROBS)
        if stream:
            response, events = await stream_response(stack, **params)
            # the streamed text and entries are the final ones
            deltas = [e for e in events if e["type"] == "response.output_text.delta"]
            streamed = "".join(e["delta"] for e in deltas)
            streamed_entries = [(bytes(x["bytes"]), x["logprob"], [(bytes(t["bytes"]), t["logprob"])
                                                                  for t in x["top_logprobs"]])
                                for e in deltas for x in e.get("logprobs") or []]
        else:
            response, events = await create_response(stack, False, **params)
        message = [item for item in response.output if item.type == "message"]
        parts = message[0].content if message else []
        text = "".join(p.text for p in parts)
        entries = _chat_entries([e for p in parts for e in (p.logprobs or [])])
        finish = "stop" if response.status == "completed" else response.incomplete_details.reason
        if stream:
            assert (streamed, streamed_entries) == (text, entries)
        return Answer(text, entries, finish, response, events)
    if front == "chat":
        params = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                  "temperature": temperature}
        if k is not None:
            params.update(logprobs=True, top_logprobs=k)
        if not stream:
            answer = await stack.client.chat.completions.create(model=stack.model, **params)
            choice = answer.choices[0]
            content = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
            return Answer(choice.message.content or "", _chat_entries(content), choice.finish_reason, answer, [])
        text, content, finish = [], [], None
        async for chunk in await stack.client.chat.completions.create(model=stack.model, stream=True, **params):
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                content += choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
                finish = choice.finish_reason or finish
        return Answer("".join(text), _chat_entries(content), finish, None, [])
    assert front == "completions"
    params = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
    if k is not None:
        params["logprobs"] = k
    choices = []
    if stream:
        # OpenAI's SDK types legacy completion chunks with a non-null finish_reason (see the README): lenient
        client = stack.client.with_options()
        client._strict_response_validation = False
        async for chunk in await client.completions.create(model=stack.model, stream=True, **params):
            choices += chunk.choices
    else:
        choices = (await stack.client.completions.create(model=stack.model, **params)).choices
    text, entries, finish = [], [], None
    for choice in choices:
        text.append(choice.text)
        finish = choice.finish_reason or finish
        lp = choice.logprobs
        if lp is None or not lp.tokens:
            continue
        for i, spelling in enumerate(lp.tokens):
            top = (lp.top_logprobs or [])[i] if lp.top_logprobs and i < len(lp.top_logprobs) else None
            entries.append((completions_token_bytes(spelling), lp.token_logprobs[i],
                            [(completions_token_bytes(s), v) for s, v in (top or {}).items()]))
    return Answer("".join(text), entries, finish, None, [])
