"""Text Generation Inference: the Messages API flavor and the native `/generate` API.

TGI's `details.tokens[]` are `{id, text, logprob, special}`: ids are exact when the model's
tokenizer is configured; without it the text is incrementally decoded (`""` on the first tokens of
a split character, the whole character on the completing one), so we align against the text.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gateway.canonical.generation import Generation
from gateway.canonical.step import Step, UpstreamFormatError
from gateway.logprobs.align import AlignmentError
from gateway.logprobs.parse import LogprobParseError, Parsed, ParseOptions, parse_chat
from gateway.upstreams.base import UpstreamCall, unsupported
from gateway.upstreams.openai_compatible import Flavor, check_cap
from gateway.upstreams.verdicts import rejected

# The Messages API (/v1/chat/completions): no `bytes`, no ids; `""` on the first tokens of a split
# character. Its /v1/completions never returns logprobs.
CHAT_FLAVOR = Flavor(name="TGI", trust_bytes=None, completions_logprobs=False)


def _as_chat_entries(tokens: list[Mapping[str, Any]], top_tokens: list[list[Mapping[str, Any]]] | None,
                     with_ids: bool) -> list[dict[str, Any]]:
    entries = []
    for index, token in enumerate(tokens):
        top = top_tokens[index] if top_tokens and index < len(top_tokens) else []
        entries.append({
            "token": token.get("text"),
            "logprob": token.get("logprob"),
            "id": token.get("id") if with_ids else None,
            "special": token.get("special"),
            "top_logprobs": [{"token": t.get("text"), "logprob": t.get("logprob"),
                              "id": t.get("id") if with_ids else None} for t in top],
        })
    return entries


def parse_generate_details(body: Mapping[str, Any], options: ParseOptions) -> tuple[str, Parsed]:
    """A `/generate` response -> (generated text, tokens).

    With `return_full_text` TGI puts the prompt before the generated text; the tokens spell only
    the generated part, so an unmatched head of the text is split off and returned text excludes it.
    """
    details = body.get("details")
    if not isinstance(details, Mapping) or not isinstance(details.get("tokens"), list):
        raise LogprobParseError("TGI response has no details.tokens; send details: true")
    text = body.get("generated_text")
    if not isinstance(text, str):
        raise LogprobParseError("TGI response has no generated_text")
    entries = _as_chat_entries(details["tokens"], details.get("top_tokens"), options.vocab is not None)
    try:
        return text, parse_chat(entries, options, text)
    except AlignmentError:
        spelled = "".join(t.get("text") or "" for t in details["tokens"] if not t.get("special"))
        if spelled and text.endswith(spelled) and len(spelled) < len(text):
            generated = text[len(text) - len(spelled):]
            return generated, parse_chat(entries, options, generated)
        raise


# --- native /generate and /generate_stream ---------------------------------------------------------


def _finish(reason: Any) -> str | None:
    """TGI's `eos_token` / `stop_sequence` / `length` -> OpenAI's words."""
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"


def _usage(options: ParseOptions, prompt: str, generated_tokens: Any) -> dict[str, Any]:
    # TGI reports no prompt token count; the model's tokenizer, when configured, can count it.
    prompt_tokens = len(options.vocab.encode(prompt)) if options.vocab is not None else 0
    completion = generated_tokens if isinstance(generated_tokens, int) else 0
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def generate_step(body: Mapping[str, Any], options: ParseOptions, *, streaming: bool, prompt: str) -> Step:
    """A `/generate` body, or one `/generate_stream` event (one token each), -> Step."""
    if isinstance(body.get("error"), str):
        raise rejected(body)  # TGI's in-band `{"error": text, "error_type": ...}`
    try:
        if not streaming:
            text, parsed = parse_generate_details(body, options)
            details = body["details"]
            return Step(text, parsed.tokens, _finish(details.get("finish_reason")),
                        _usage(options, prompt, details.get("generated_tokens")))
        token = body.get("token")
        if not isinstance(token, Mapping):
            raise UpstreamFormatError("TGI stream event has no token")
        top = body.get("top_tokens")
        entries = _as_chat_entries([token], [top] if isinstance(top, list) else None, options.vocab is not None)
        tokens = parse_chat(entries, options).tokens
    except LogprobParseError as exc:
        raise UpstreamFormatError(f"upstream logprobs unreadable: {exc}") from None
    details = body.get("details")
    finish = _finish(details.get("finish_reason")) if isinstance(details, Mapping) else None
    usage = _usage(options, prompt, details.get("generated_tokens")) if isinstance(details, Mapping) else None
    text = "" if token.get("special") else token.get("text") or ""
    return Step(text, tokens, finish, usage)


def generate_call(gen: Generation, prompt: str, *, cap: int | None, param: str) -> UpstreamCall:
    """TGI's native API: the only TGI route with token ids, so bytes are exact with a tokenizer."""
    check_cap(gen, cap, param)
    if gen.echo_prompt and gen.logprobs:
        raise unsupported("Prompt logprobs through TGI's native API are not supported yet.", "echo")
    parameters: dict[str, Any] = {"details": True, "return_full_text": False, **gen.extensions}
    if gen.top_k_logprobs:
        parameters["top_n_tokens"] = gen.top_k_logprobs
    if gen.max_tokens is not None:
        parameters["max_new_tokens"] = gen.max_tokens
    if gen.temperature:  # TGI refuses 0: greedy is its default without sampling
        parameters.update(temperature=gen.temperature, do_sample=True)
    if gen.top_p is not None and 0 < gen.top_p < 1:  # TGI accepts only 0 < top_p < 1
        parameters["top_p"] = gen.top_p
    if gen.stop:
        parameters["stop"] = gen.stop
    path = "/generate_stream" if gen.stream else "/generate"
    return UpstreamCall(path, {"inputs": prompt, "parameters": parameters},
                        functools.partial(generate_step, prompt=prompt))
