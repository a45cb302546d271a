"""The OpenAI-compatible chat and completions APIs that most servers speak, with per-server flavor.

vLLM, SGLang, llama.cpp, TGI's Messages API and OpenAI itself share the request and response
shapes and differ in small ways (token-id placeholders, whether the sampled token is forced into
the top list, how far `bytes` can be trusted, the shape of completions logprobs, the cap on k).
One implementation takes those differences as a `Flavor`, so no dialect keeps its own drifting copy.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.canonical.generation import Generation
from gateway.canonical.step import Step, ToolCallDelta, UpstreamFormatError
from gateway.logprobs.align import AlignmentError
from gateway.logprobs.body_scan import load_chat_body, load_completions_body
from gateway.logprobs.compiled import TokenBatch, fastpath
from gateway.logprobs.parse import LogprobParseError, Parsed, ParseOptions, id_table, parse_chat, parse_completions
from gateway.logprobs.realign import realign
from gateway.logprobs.segment import HELD_BYTES, split_content
from gateway.logprobs.spellings import looks_like_special
from gateway.logprobs.tokens import Origin, Token
from gateway.upstreams.base import (
    ChunkFields,
    ChunkReader,
    ChunkReaderFor,
    FieldsReader,
    FieldsReaderFor,
    UpstreamCall,
    step_of_fields,
    unsupported,
)
from gateway.upstreams.verdicts import rejected


@dataclass(frozen=True, slots=True)
class Flavor:
    """How one server family bends the OpenAI shapes.

    token_id_placeholders: it can spell tokens as `token_id:N` (vLLM's `return_tokens_as_token_ids`).
    sampled_first: its top list is the sampled token first plus k-1 others, so ask for k+1.
    trust_bytes: its `bytes` are exact (True), lossy decodes (False) or to be judged per token (None).
    chat_shaped_completions: its /v1/completions returns `logprobs: {content: [...]}` (llama.cpp).
    completions_logprobs: it can return logprobs on /v1/completions at all.
    prompt_logprobs: it can score the prompt (completions `echo` with logprobs).
    """

    name: str
    token_id_placeholders: bool = False
    sampled_first: bool = False
    trust_bytes: bool | None = None
    chat_shaped_completions: bool = False
    completions_logprobs: bool = True
    prompt_logprobs: bool = False
    escapes: bool = False
    read_ids: bool = True
    min_top_logprobs: int = 0  # llama.cpp returns no logprobs at all for 0 alternatives: ask for 1, cut to k
    # Ask for logprobs only when the client wants them (llama.cpp: its entries are per character and
    # its stop-string trimming cuts them wrongly; text without them is the server's own).
    logprobs_when_asked: bool = False
    # False: a whole answer's text does not bound its entries (llama.cpp's are one per piece of text it
    # sent, and its trimming can leave them short of the text); `adapt` then settles them.
    text_bounds_entries: bool = True
    # The server's own last word on a call built here (llama.cpp: gateway/upstreams/llamacpp.py).
    adapt: Callable[[UpstreamCall, Generation], UpstreamCall] | None = None

    def parse_options(self, vocab: Any) -> ParseOptions:
        return ParseOptions(vocab=vocab, trust_bytes=self.trust_bytes, escapes=self.escapes, read_ids=self.read_ids)


# --- responses ----------------------------------------------------------------------------------


def _is_mapping(value: Any) -> bool:
    # JSON gives dicts: skip the (slower) ABC check for them and for None.
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def _choice(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    error = body.get("error")
    if error is not None and (_is_mapping(error) or isinstance(error, str)):  # str: TGI's Messages API
        raise rejected(body)  # an in-band error frame: the upstream's verdict, not a malformed chunk
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise UpstreamFormatError("upstream body has no choices list")
    if not choices:
        return None  # the usage-only chunk at the end of a stream
    choice = choices[0]
    if not _is_mapping(choice):
        raise UpstreamFormatError("upstream choice is not an object")
    return choice


def _usage(body: Mapping[str, Any]) -> dict[str, Any] | None:
    usage = body.get("usage")
    return usage if isinstance(usage, dict) else None


def _logprobs_or_fail(parse, *args: Any) -> Parsed:
    try:
        return parse(*args)
    except LogprobParseError as exc:
        raise UpstreamFormatError(f"upstream logprobs unreadable: {exc}") from None


def _text_bound(streaming: bool, text: str) -> str | None:
    # A whole response's text bounds lossy tokens; a chunk's text may lag its tokens (held bytes).
    return None if streaming else text


def chat_step(body: Mapping[str, Any], options: ParseOptions, *, streaming: bool, text_only: bool = False,
              bound: bool = True) -> Step:
    """A chat completion (or chunk) -> Step. `text_only`: no logprobs were asked for; none are read.
    `bound`: a whole answer's text bounds its lossy tokens (False: the flavor settles them itself)."""
    choice = _choice(body)
    if choice is None:
        return Step(usage=_usage(body))
    container = choice.get("delta" if streaming else "message") or {}
    text = container.get("content") or ""
    if not isinstance(text, str):
        raise UpstreamFormatError("upstream content is not a string")
    logprobs = None if text_only else choice.get("logprobs")
    content = logprobs.get("content") if _is_mapping(logprobs) else None
    reasoning = _reasoning(container) if "reasoning" in container or "reasoning_content" in container else None
    raw_calls = container.get("tool_calls")
    tool_calls = _tool_calls(raw_calls) if raw_calls else []
    if reasoning is None and not tool_calls:
        # The common chunk, once per token of a stream: `_logprobs_or_fail` and `_usage` written out.
        try:
            parsed = parse_chat(content, options, None if streaming or text_only or not bound else text)
        except LogprobParseError as exc:
            raise UpstreamFormatError(f"upstream logprobs unreadable: {exc}") from None
        tokens = parsed.tokens if text or not streaming else [_hide_control(t) for t in parsed.tokens]
        usage = body.get("usage")
        step = Step(text, tokens, choice.get("finish_reason"), usage if isinstance(usage, dict) else None)
        step.report = parsed.report  # set, not passed: a keyword argument doubles the cost of the call
        return step
    step = Step(text, [], choice.get("finish_reason"), _usage(body), reasoning=reasoning, tool_calls=tool_calls)
    _set_aside(step, content, options, streaming or not bound)
    return step


def _chunk_fields(options: ParseOptions, completions: bool, batches: bool = True) -> FieldsReader | None:
    """A reader of stream chunks of the common shape (text and `token_id:N` logprobs, nothing else): the
    compiled reader (`_fastpath_json.c`) straight to their parts (see ChunkFields), their tokens a
    `TokenBatch` with `batches`; None for any other chunk. None without the compiled twin or a tokenizer."""
    if fastpath is None or options.vocab is None:
        return None
    table, flags = id_table(options.vocab)
    read_fields = fastpath.read_chunk

    def read(raw: bytes) -> ChunkFields | None:
        return read_fields(raw, completions, table, flags, batches) if type(raw) is bytes else None

    return read


def _chunk_reader(options: ParseOptions, batches: bool, completions: bool) -> ChunkReader | None:
    """The Step `chat_step` (or `completions_step`) makes of a chunk of the common shape (`_chunk_fields`);
    None for any other chunk."""
    read_fields = _chunk_fields(options, completions, batches)
    if read_fields is None:
        return None

    def read(raw: bytes) -> Step | None:
        fields = read_fields(raw)
        return None if fields is None else step_of_fields(fields)

    return read


chat_chunk_reader: ChunkReaderFor = functools.partial(_chunk_reader, completions=False)
completions_chunk_reader: ChunkReaderFor = functools.partial(_chunk_reader, completions=True)
chat_chunk_fields: FieldsReaderFor = functools.partial(_chunk_fields, completions=False)
completions_chunk_fields: FieldsReaderFor = functools.partial(_chunk_fields, completions=True)


def _hide_control(token: Token) -> Token:
    """A chunk that added no text but spells a control token (TGI's EOS entry): it carries no text."""
    if token.special or token.origin is not Origin.TEXT or not looks_like_special(token.bytes.decode()):
        return token
    return type(token)(token.bytes, token.logprob, token.top, token.token_id, True, token.origin, token.top_absent)


def _reasoning(container: Mapping[str, Any]) -> str | None:
    """A reasoning parser's output: `reasoning` (newer vLLM) or `reasoning_content` (older vLLM, SGLang).

    An empty string still marks a thinking step (its character is not complete yet); None: none.
    """
    found = None
    for key in ("reasoning", "reasoning_content"):
        value = container.get(key)
        if isinstance(value, str):
            if value:
                return value
            found = value
    return found


def _tool_calls(raw: Any) -> list[ToolCallDelta]:
    """`tool_calls` of a message (whole calls) or of a delta (pieces keyed by `index`)."""
    if not raw:
        return []
    if not isinstance(raw, list) or not all(isinstance(call, Mapping) for call in raw):
        raise UpstreamFormatError("upstream tool_calls is not a list of objects")
    calls = []
    for position, call in enumerate(raw):
        function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):  # TGI sends the arguments as a JSON object
            arguments = json.dumps(arguments, ensure_ascii=False)
        index = call.get("index")
        calls.append(ToolCallDelta(index if isinstance(index, int) else position, call.get("id") or None,
                                   function.get("name") or None, arguments))
    return calls


def _set_aside(step: Step, content: Any, options: ParseOptions, streaming: bool) -> None:
    """Logprobs cover reasoning, text and tool-call markup alike: keep the text's, count the reasoning's.

    A whole lossy response is aligned against reasoning + text when no markup follows; otherwise
    the tokens are split first and the text's re-aligned against the text alone.
    """
    text, reasoning = step.text, step.reasoning or ""
    bound = None
    if not streaming and options.vocab is None and not step.tool_calls:
        bound = reasoning + text
    try:
        parsed = _logprobs_or_fail(parse_chat, content, options, bound)
    except AlignmentError:
        bound = None
        parsed = _logprobs_or_fail(parse_chat, content, options, None)
    step.report = parsed.report
    if step.reasoning is not None and not text and not step.tool_calls:
        step.reasoning_tokens = parsed.tokens  # a chunk of thinking only
        return
    skip = len(reasoning.encode())
    if streaming and reasoning:
        skip -= _held_before(parsed.tokens, reasoning)
    segments = split_content(parsed.tokens, text, skip=skip, last=streaming)
    step.reasoning_tokens = segments.before if step.reasoning is not None else []
    step.tokens = segments.content
    if bound is None and not streaming and options.vocab is None and text:
        step.tokens, _ = realign(step.tokens, text, options.vocab)


def _held_before(tokens: list[Token], reasoning: str) -> int:
    """Bytes of a chunk's first reasoning character that came in an earlier chunk's tokens.

    A server holds back a character until its last byte arrives, so a chunk whose tokens start
    inside a character reports that whole character in its text."""
    head = b"".join(token.bytes for token in tokens[:HELD_BYTES])
    inside = len(head) - len(head.lstrip(bytes(range(0x80, 0xC0))))  # leading continuation bytes
    return max(0, len(reasoning[0].encode()) - inside) if inside else 0


def completions_step(body: Mapping[str, Any], options: ParseOptions, *, streaming: bool,
                     echoed_prompt: str | None = None, chat_shaped: bool = False, text_only: bool = False,
                     bound: bool = True) -> Step:
    """A completion (or chunk) -> Step. With `echoed_prompt` (non-streamed echo), the prompt's
    text and tokens come first in the body and are split off into the Step's prompt fields."""
    choice = _choice(body)
    if choice is None:
        return Step(usage=_usage(body))
    text = choice.get("text") or ""
    if not isinstance(text, str):
        raise UpstreamFormatError("upstream text is not a string")
    logprobs = None if text_only else choice.get("logprobs")
    parsed = Parsed([])
    if type(logprobs) is TokenBatch:  # load_completions_body's
        parsed = _logprobs_or_fail(parse_completions, logprobs, options, _text_bound(streaming or not bound, text))
    elif _is_mapping(logprobs):
        limit = _text_bound(streaming or not bound, text)
        if chat_shaped:
            parsed = _logprobs_or_fail(parse_chat, logprobs.get("content"), options, limit)
        else:
            parsed = _logprobs_or_fail(parse_completions, logprobs, options, limit)
    step = Step(text, parsed.tokens, choice.get("finish_reason"), _usage(body), report=parsed.report)
    if echoed_prompt is not None:
        _split_echo(step, echoed_prompt)
    return step


def _split_echo(step: Step, prompt: str) -> None:
    if not step.text.startswith(prompt):
        raise UpstreamFormatError("echoed text does not start with the prompt")
    count = (step.usage or {}).get("prompt_tokens")
    if not isinstance(count, int) or count > len(step.tokens):
        raise UpstreamFormatError("echo without a usable usage.prompt_tokens")
    step.prompt_text, step.text = prompt, step.text[len(prompt):]
    tokens = list(step.tokens)
    step.prompt_tokens, step.tokens = tokens[:count], tokens[count:]


# --- requests -----------------------------------------------------------------------------------


def requested_top_logprobs(flavor: Flavor, k: int, cap: int | None) -> int:
    """A server that forces the sampled token into a list of k is asked for k+1 (never over its cap)."""
    if k <= 0:
        return flavor.min_top_logprobs
    if flavor.sampled_first:
        return k + 1 if cap is None else min(k + 1, cap)
    return max(k, flavor.min_top_logprobs)


def check_cap(gen: Generation, cap: int | None, param: str) -> None:
    """k above the server's limit (None: it has none) is refused before anything is sent."""
    if cap is not None and gen.logprobs and gen.top_k_logprobs > cap:
        raise unsupported(f"This upstream returns at most {cap} alternatives per token; "
                          f"{gen.top_k_logprobs} were asked for.", param)


def chat_call(flavor: Flavor, gen: Generation, upstream_model: str, *, cap: int | None, token_ids: bool,
              param: str) -> UpstreamCall:
    """Chat: logprobs on (unless the flavor says only when asked), so every token's bytes can be reconstructed."""
    check_cap(gen, cap, param)
    if gen.echo_prompt and gen.logprobs:
        raise unsupported("Prompt logprobs (echo) need a completions upstream that scores prompts.", "echo")
    messages = gen.messages if gen.messages is not None else [{"role": "user", "content": gen.prompt}]
    body: dict[str, Any] = {
        **gen.extensions,
        "model": upstream_model,
        "messages": messages,
        "logprobs": True,
        "top_logprobs": requested_top_logprobs(flavor, gen.top_k_logprobs, cap),
        "stream": gen.stream,
        **gen.sampling(),
        **gen.chat_options(),
    }
    if flavor.token_id_placeholders:
        body["return_tokens_as_token_ids"] = token_ids
    text_only = flavor.logprobs_when_asked and not gen.logprobs
    if text_only:
        del body["logprobs"], body["top_logprobs"]
    if gen.max_tokens is not None:
        body["max_tokens"] = gen.max_tokens
    if gen.stream:
        body["stream_options"] = {"include_usage": True}
    if flavor.sampled_first and gen.top_k_logprobs > 0 and cap is not None and gen.top_k_logprobs + 1 > cap:
        # k at the server's cap: its list of k may be the sampled token plus the top k-1.
        return UpstreamCall("/v1/chat/completions", body, _capped_chat_step, load_chat_body, _capped_chat_chunk_reader)
    if text_only:
        call = UpstreamCall("/v1/chat/completions", body, functools.partial(chat_step, text_only=True))
    elif not flavor.text_bounds_entries:
        call = UpstreamCall("/v1/chat/completions", body, functools.partial(chat_step, bound=False), load_chat_body)
    else:
        call = UpstreamCall("/v1/chat/completions", body, chat_step, load_chat_body, chat_chunk_reader,
                            chunk_fields=chat_chunk_fields)
    return flavor.adapt(call, gen) if flavor.adapt is not None else call


def without_forced_sampled(token: Token) -> Token:
    """A server that puts the sampled token first in a list of k (vLLM) drops the true k-th when the
    sampled token is not in the top k; when we could not ask for k+1 (k at its cap) the list cannot
    tell which. The sampled token is kept only where it is provably in the top k: above the lowest
    of the others (they are the top k-1, or the top k with it). Otherwise it is left out: fewer
    entries than k (OpenAI allows that), never a candidate outside the true top k."""
    top = token.top
    if len(top) < 2:
        return token
    if token.token_id is not None:
        sampled = [i for i, c in enumerate(top) if c.token_id == token.token_id]
    else:
        sampled = [i for i, c in enumerate(top) if c.token_id is None and c.bytes == token.bytes]
    if len(sampled) != 1:
        return token
    others = top[: sampled[0]] + top[sampled[0] + 1:]
    if top[sampled[0]].logprob > min(c.logprob for c in others):
        return token
    return token._replace(top=others)


def _trim_forced(step: Step) -> Step:
    step.tokens = [without_forced_sampled(t) for t in step.tokens]
    return step


def _capped_chat_step(body: Mapping[str, Any], options: ParseOptions, *, streaming: bool) -> Step:
    return _trim_forced(chat_step(body, options, streaming=streaming))


def _capped_chat_chunk_reader(options: ParseOptions, batches: bool) -> ChunkReader | None:
    read_chunk = chat_chunk_reader(options, False)  # _trim_forced rewrites Tokens: a list of them
    if read_chunk is None:
        return None

    def read(raw: bytes) -> Step | None:
        step = read_chunk(raw)
        return None if step is None else _trim_forced(step)

    return read


def completions_call(flavor: Flavor, gen: Generation, upstream_model: str, prompt: str, *, cap: int | None,
                     token_ids: bool, param: str) -> UpstreamCall:
    """Completions for a prompt (given, or rendered from the chat template)."""
    if not flavor.completions_logprobs:
        raise unsupported(f"{flavor.name}'s /v1/completions returns no logprobs; use another api.", param)
    check_cap(gen, cap, param)
    k = gen.top_k_logprobs
    body: dict[str, Any] = {
        **gen.extensions,
        "model": upstream_model,
        "prompt": prompt,
        "stream": gen.stream,
        # Legacy completions defaults to 16 tokens; no cap from the client means none upstream.
        "max_tokens": gen.max_tokens,
        **gen.sampling(),
    }
    if gen.response_format is not None:
        body["response_format"] = gen.response_format  # OpenAI-compatible servers take it here too
    if flavor.chat_shaped_completions:
        # The request is legacy-shaped (`logprobs` is the count); only the answer is chat-shaped.
        if gen.logprobs or not flavor.logprobs_when_asked:
            body["logprobs"] = requested_top_logprobs(flavor, k, cap)
    else:
        # The completions dict holds the sampled token *plus* the top k, so k is enough here.
        body["logprobs"] = k
    if flavor.token_id_placeholders:
        body["return_tokens_as_token_ids"] = token_ids
    text_only = flavor.logprobs_when_asked and not gen.logprobs
    parse = functools.partial(completions_step, chat_shaped=flavor.chat_shaped_completions, text_only=text_only,
                              bound=flavor.text_bounds_entries)
    if gen.echo_prompt and gen.logprobs:
        if not flavor.prompt_logprobs:
            raise unsupported(f"{flavor.name} cannot score the prompt (echo with logprobs).", "echo")
        if gen.stream:
            raise unsupported("Streamed prompt logprobs (echo with logprobs) are not supported yet.", "echo")
        body["echo"] = True
        parse = functools.partial(completions_step, echoed_prompt=prompt, chat_shaped=flavor.chat_shaped_completions)
    if gen.stream:
        body["stream_options"] = {"include_usage": True}
    if flavor.chat_shaped_completions:  # llama.cpp's chat-shaped completions logprobs are Python's to read
        call = UpstreamCall("/v1/completions", body, parse)
    else:
        call = UpstreamCall("/v1/completions", body, parse, load_completions_body, completions_chunk_reader,
                            chunk_fields=completions_chunk_fields)
    return flavor.adapt(call, gen) if flavor.adapt is not None else call
