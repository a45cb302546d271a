"""llama.cpp server: OpenAI-compatible APIs whose entries carry exact raw `bytes` and the token `id`.

Its /v1/completions answers with the chat-style `logprobs: {content: [...]}`. Its entries are one per
piece of text it sent (tools/server/server-context.cpp, `process_token`; captures in
tests/captures/real/llamacpp-b1-smollm2.json):

- a token that leaves a character incomplete gets no entry; the token completing it carries the whole
  character (its `bytes`, with its own logprob). Generation that stops inside a character sends no entry
  for it: non-streamed the text ends in the U+FFFD it writes for those bytes, streamed it sends nothing
  ("chat cut inside a character");
- a token whose text it holds back or has none (the end-of-generation token, a stop string, a partial
  match of one) gets an entry with empty `bytes`, non-streamed and on /v1/completions streams, but not
  in a chat stream ("chat eos" vs "chat eos, stream"). Those are dropped everywhere, so stream and
  non-stream agree: one entry per piece of text;
- non-streamed, a stop string removes as many entries as the stop string has *tokens* (`send_final_response`:
  `common_tokenize(stopping_word)`), although the entries are per piece of text, so real entries vanish
  ("chat stop string": `stop: ["🏽"]` returns "👋" with no entries). Streams are not trimmed: such a
  request (logprobs asked, not streamed) is asked for as a stream and read whole, so no entry is lost;
  its text is then the stream's, which never has the U+FFFD of a character a cap stopped inside.

Logprobs are asked for only when the client wants them; then `top_logprobs` is always sent (it
returns none for 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gateway.canonical.generation import Generation
from gateway.canonical.step import Step, ToolCallDelta
from gateway.logprobs.align import AlignmentError
from gateway.logprobs.parse import ParseOptions
from gateway.logprobs.report import TranslationReport
from gateway.upstreams.base import StepParser, UpstreamCall
from gateway.upstreams.openai_compatible import Flavor

REPLACEMENT = "\ufffd"


def adapt(call: UpstreamCall, gen: Generation) -> UpstreamCall:
    """A llama.cpp call whose entries are settled; streamed upstream where its non-streamed trimming
    would cut real entries (a stop string with logprobs asked)."""
    parse = call.parse
    if gen.logprobs and gen.stop and not gen.stream:
        body = {**call.body, "stream": True, "stream_options": {"include_usage": True}}
        return UpstreamCall(call.path, body, _whole_stream(parse), streamed_whole=True)
    return dataclasses.replace(call, parse=_settled(parse, gen.logprobs))


def _settled(parse: StepParser, asked: bool) -> StepParser:
    def settle(payload: Mapping[str, Any], options: ParseOptions, *, streaming: bool) -> Step:
        step = parse(payload, options, streaming=streaming)
        _drop_empty(step)
        if asked and not streaming:
            _check_entries(step)
        return step
    return settle


def _whole_stream(parse: StepParser) -> StepParser:
    def whole(payloads: list[Any], options: ParseOptions, *, streaming: bool) -> Step:
        steps = [parse(payload, options, streaming=True) for payload in payloads]
        for step in steps:
            _drop_empty(step)
        step = merge_steps(steps)
        _check_entries(step)
        return step
    return whole


def _drop_empty(step: Step) -> None:
    """An entry with no bytes is a token whose text llama.cpp held back or that has none (EOS, a stop
    string): not a piece of the text, and absent from its chat streams."""
    if step.tokens and not all(token.bytes for token in step.tokens):
        step.tokens = [token for token in step.tokens if token.bytes]


def _check_entries(step: Step) -> None:
    """A whole answer's entries spell its text: as UTF-8, or, where bytes are invalid, as their
    replace-decoding; a reply that stopped inside a character ends in the U+FFFD llama.cpp wrote for
    the unfinished character, which no entry covers (it sends none)."""
    if step.reasoning is not None or step.tool_calls:
        return  # the entries cover thinking and markup too; split_content has placed them
    text = step.text
    joined = b"".join(token.bytes for token in step.tokens)
    if joined == text.encode():
        return
    spelled = joined.decode("utf-8", errors="replace")
    if spelled == text or text == spelled + REPLACEMENT:
        return
    raise AlignmentError(f"llama.cpp's entries spell {spelled[-40:]!r}, not the text's end {text[-40:]!r}",
                         len(step.tokens))


def merge_steps(steps: list[Step]) -> Step:
    """A whole stream's steps as the one Step of a non-streamed answer."""
    whole = Step(report=TranslationReport())
    calls: dict[int, ToolCallDelta] = {}
    for step in steps:
        whole.text += step.text
        whole.tokens += step.tokens
        whole.finish_reason = step.finish_reason or whole.finish_reason
        whole.usage = step.usage or whole.usage
        if step.report is not None:
            whole.report.merge(step.report)
        if step.reasoning is not None:
            whole.reasoning = (whole.reasoning or "") + step.reasoning
            whole.reasoning_tokens += step.reasoning_tokens
        for piece in step.tool_calls:
            known = calls.get(piece.index)
            calls[piece.index] = piece if known is None else ToolCallDelta(
                piece.index, known.id or piece.id, known.name or piece.name, known.arguments + piece.arguments)
    whole.tool_calls = [calls[index] for index in sorted(calls)]
    return whole


# Its `bytes` are the truth: a completing token's bytes hold the whole character, more than its id's.
FLAVOR = Flavor(name="llama.cpp", trust_bytes=True, chat_shaped_completions=True, read_ids=False,
                min_top_logprobs=1, logprobs_when_asked=True, text_bounds_entries=False, adapt=adapt)
