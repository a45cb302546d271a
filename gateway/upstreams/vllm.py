"""vLLM's chat and completions wire format -> canonical steps.

We always send `return_tokens_as_token_ids`, so with a tokenizer every token (sampled and
alternative) is a `token_id:N` placeholder whose bytes are exact; vLLM's own `bytes` (UTF-8 of a
lossy decode) are never used then. Without a tokenizer the lossy strings are aligned against the
final text (non-streaming) — see gateway/logprobs/parse.py.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gateway.logprobs.parse import LogprobParseError, ParseOptions, parse_chat, parse_completions
from gateway.logprobs.tokens import Token
from gateway.translate.generation import Generation
from gateway.upstreams.base import Step, UpstreamCall, UpstreamFormatError, unsupported


def _choice(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise UpstreamFormatError("upstream body has no choices list")
    if not choices:
        return None  # the usage-only chunk at the end of a stream
    if not isinstance(choices[0], Mapping):
        raise UpstreamFormatError("upstream choice is not an object")
    return choices[0]


def _usage(body: Mapping[str, Any]) -> dict[str, Any] | None:
    usage = body.get("usage")
    return usage if isinstance(usage, dict) else None


def _logprobs_or_fail(parse, *args: Any) -> list[Token]:
    try:
        return parse(*args).tokens
    except LogprobParseError as exc:
        raise UpstreamFormatError(f"upstream logprobs unreadable: {exc}") from None


def chat_step(body: Mapping[str, Any], options: ParseOptions, *, streaming: bool) -> Step:
    """A chat completion (or chunk) -> Step."""
    choice = _choice(body)
    if choice is None:
        return Step(usage=_usage(body))
    container = choice.get("delta" if streaming else "message") or {}
    text = container.get("content") or ""
    if not isinstance(text, str):
        raise UpstreamFormatError("upstream content is not a string")
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    # Non-streamed text bounds lossy tokens; a chunk's text may lag its tokens (held-back bytes).
    tokens = _logprobs_or_fail(parse_chat, content, options, None if streaming or options.vocab else text)
    return Step(text, tokens, choice.get("finish_reason"), _usage(body))


def completions_step(body: Mapping[str, Any], options: ParseOptions, *, streaming: bool,
                     echoed_prompt: str | None = None) -> Step:
    """A completion (or chunk) -> Step. With `echoed_prompt` (non-streamed echo), the prompt's
    text and tokens come first in the body and are split off into the Step's prompt fields."""
    choice = _choice(body)
    if choice is None:
        return Step(usage=_usage(body))
    text = choice.get("text") or ""
    if not isinstance(text, str):
        raise UpstreamFormatError("upstream text is not a string")
    logprobs = choice.get("logprobs")
    tokens: list[Token] = []
    if isinstance(logprobs, Mapping):
        tokens = _logprobs_or_fail(parse_completions, logprobs, options,
                                   None if streaming or options.vocab else text)
    step = Step(text, tokens, choice.get("finish_reason"), _usage(body))
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
    step.prompt_tokens, step.tokens = step.tokens[:count], step.tokens[count:]


def error_message(body: Any, status: int) -> str:
    """vLLM's error body (`{"error": {...}}`, or the older `{"object": "error", "message"}`) -> text."""
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(body.get("message"), str):
            return body["message"]
    return f"upstream answered HTTP {status}"


# --- requests -----------------------------------------------------------------------------------


def upstream_top_logprobs(k: int, cap: int) -> int:
    """vLLM puts the sampled token first in a list of k, so ask for k+1 to keep the true top k."""
    return min(k + 1, cap) if k > 0 else 0


def _check_cap(gen: Generation, cap: int, param: str) -> None:
    if gen.top_k_logprobs > cap:
        raise unsupported(f"This upstream returns at most {cap} alternatives per token "
                          f"(its --max-logprobs); {gen.top_k_logprobs} were asked for.", param)


def chat_call(gen: Generation, upstream_model: str, *, cap: int, token_ids: bool, param: str) -> UpstreamCall:
    """vLLM chat: logprobs always on (with a tokenizer, token ids make every byte exact)."""
    _check_cap(gen, cap, param)
    if gen.echo_prompt and gen.logprobs:
        raise unsupported("Prompt logprobs (echo) need a completions upstream.", "echo")
    messages = gen.messages if gen.messages is not None else [{"role": "user", "content": gen.prompt}]
    body: dict[str, Any] = {
        **gen.extensions,
        "model": upstream_model,
        "messages": messages,
        "logprobs": True,
        "top_logprobs": upstream_top_logprobs(gen.top_k_logprobs, cap),
        "return_tokens_as_token_ids": token_ids,
        "stream": gen.stream,
        **gen.sampling(),
    }
    if gen.max_tokens is not None:
        body["max_tokens"] = gen.max_tokens
    if gen.stream:
        body["stream_options"] = {"include_usage": True}
    return UpstreamCall("/v1/chat/completions", body, chat_step)


def completions_call(gen: Generation, upstream_model: str, prompt: str, *, cap: int, token_ids: bool,
                     param: str) -> UpstreamCall:
    """vLLM completions for a prompt (given, or rendered from the chat template)."""
    _check_cap(gen, cap, param)
    body: dict[str, Any] = {
        **gen.extensions,
        "model": upstream_model,
        "prompt": prompt,
        # The completions dict holds the sampled token *plus* the top k, so k is enough here.
        "logprobs": gen.top_k_logprobs,
        "return_tokens_as_token_ids": token_ids,
        "stream": gen.stream,
        # Legacy completions defaults to 16 tokens; no cap from the client means none upstream.
        "max_tokens": gen.max_tokens,
        **gen.sampling(),
    }
    parse = completions_step
    if gen.echo_prompt and gen.logprobs:
        if gen.stream:
            raise unsupported("Streamed prompt logprobs (echo with logprobs) are not supported yet.", "echo")
        body["echo"] = True
        parse = functools.partial(completions_step, echoed_prompt=prompt)
    if gen.stream:
        body["stream_options"] = {"include_usage": True}
    return UpstreamCall("/v1/completions", body, parse)
