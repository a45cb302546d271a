"""SGLang: OpenAI-compatible APIs with lossy `bytes` (UTF-8 of each id decoded alone, `"�"`),
alternatives keyed by text (colliding strings collapse) and float32-lowest sentinels.

Without a tokenizer the text repairs the sampled tokens; its native `/generate` with token ids
(`api: generate`) is the exact route.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.canonical.generation import Generation
from gateway.canonical.step import Step, UpstreamFormatError
from gateway.logprobs.parse import LogprobParseError, ParseOptions, parse_chat
from gateway.upstreams.base import UpstreamCall, unsupported
from gateway.upstreams.openai_compatible import Flavor, check_cap
from gateway.upstreams.verdicts import rejected

FLAVOR = Flavor(name="SGLang", trust_bytes=None)


# --- native /generate -----------------------------------------------------------------------------


def _triple_entry(triple: Any, top: Any = None) -> dict[str, Any]:
    """SGLang's `[logprob, token_id, text|None]` -> a chat-style entry keyed by id."""
    if not isinstance(triple, list | tuple) or len(triple) < 2:
        raise UpstreamFormatError("SGLang logprob entries must be [logprob, id, text]")
    logprob, token_id = triple[0], triple[1]
    text = triple[2] if len(triple) > 2 and isinstance(triple[2], str) else f"token_id:{token_id}"
    entry: dict[str, Any] = {"token": text, "logprob": logprob, "id": token_id}
    entry["top_logprobs"] = [_triple_entry(t) for t in top or []]
    return entry


def _finish(meta: Mapping[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    return "length" if kind == "length" else "stop"


class GenerateParser:
    """Reads `/generate` bodies; streamed frames are cumulative (whole text and arrays so far), so
    each frame yields only what is new since the last one. One instance per request."""

    def __init__(self) -> None:
        self._text = ""
        self._tokens = 0

    def __call__(self, body: Mapping[str, Any], options: ParseOptions, *, streaming: bool) -> Step:
        error = body.get("error")
        if error is not None:
            raise rejected(body)
        meta = body.get("meta_info")
        text = body.get("text")
        if not isinstance(meta, Mapping) or not isinstance(text, str):
            raise UpstreamFormatError("SGLang /generate body needs text and meta_info")
        values = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        new_values, new_tops = values[self._tokens:], tops[self._tokens:] if tops else []
        delta = text[len(self._text):] if text.startswith(self._text) else text
        self._text, self._tokens = text, len(values)
        entries = [_triple_entry(v, new_tops[i] if i < len(new_tops) else None) for i, v in enumerate(new_values)]
        if options.vocab is None:
            raise UpstreamFormatError("SGLang's native API sends ids only: configure the model's tokenizer")
        try:
            tokens = parse_chat(entries, options).tokens
        except LogprobParseError as exc:
            raise UpstreamFormatError(f"upstream logprobs unreadable: {exc}") from None
        finish = _finish(meta)
        usage = None
        if finish is not None or not streaming:
            prompt, completion = meta.get("prompt_tokens") or 0, meta.get("completion_tokens") or 0
            usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return Step(delta, tokens, finish, usage)


def generate_call(gen: Generation, prompt: str, *, cap: int | None, param: str) -> UpstreamCall:
    """SGLang's native API with ids only (`return_text_in_logprobs: false`): exact with a tokenizer."""
    check_cap(gen, cap, param)
    if gen.echo_prompt and gen.logprobs:
        raise unsupported("Prompt logprobs through SGLang's native API are not supported yet.", "echo")
    sampling: dict[str, Any] = {key: value for key, value in gen.sampling().items() if key != "user"}
    if gen.max_tokens is not None:
        sampling["max_new_tokens"] = gen.max_tokens
    sampling.update(gen.extensions)  # vendor fields (ignore_eos, top_k, ...) are sampling params here
    body = {"text": prompt, "sampling_params": sampling, "return_logprob": True,
            "top_logprobs_num": gen.top_k_logprobs, "return_text_in_logprobs": False, "stream": gen.stream}
    return UpstreamCall("/generate", body, GenerateParser())
