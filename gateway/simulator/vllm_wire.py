"""vLLM's JSON bodies, built as plain dicts in vLLM's field order (pure functions, no I/O).

Field sets follow vLLM main (vllm/entrypoints/openai/chat_completion/protocol.py and
completion/protocol.py @ 002032ee, serving.py @ 5e918640 / cc139d8e):

- non-streaming bodies are `model_dump()`ed, so every field appears, unset ones as null;
- chat chunks are dumped with `exclude_unset=True`: only the fields the server set appear
  (the first chunk has `prompt_token_ids`, content chunks have `token_ids`, the finishing chunk
  also `stop_reason`);
- completion chunks: only the envelope and the choice (vLLM 0.32.0 as captured in
  tests/captures/real/vllm-0.32.0-qwen2-tiny.json, "completions stream": no `usage`,
  `system_fingerprint` or `metrics` keys; main's source read as `exclude_unset=False`);
- final usage chunks drop nulls (`exclude_none=True`) and carry the `system_fingerprint`
  (the capture's "chat stream logprobs" / "completions stream": `vllm-0.32.0-2e465bef`);
- the first chat chunk has `prompt_token_ids` and `prompt_text`, null unless asked for (the capture).

tests/test_vllm_real_capture.py replays every captured request against this simulator and checks
the field sets match.

Logprob formatting follows `_create_chat_logprobs` / `_get_top_logprobs` (chat) and
`_create_completion_logprobs` (completions): see `chat_logprobs` and `completion_logprobs`.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.simulator.synthetic import Position

VLLM_MIN_LOGPROB = -9999.0  # vLLM clamps -inf with max(lp, -9999.0)

JSON = dict[str, Any]
TokenStr = Callable[[int], str]
LogprobDict = dict[int, float]  # one position as vLLM's engine stores it: sampled first, then top-k


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _clamp(logprob: float) -> float:
    return max(logprob, VLLM_MIN_LOGPROB)


def _spelling(token_id: int, strings: TokenStr, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else strings(token_id)


# vLLM writes "vllm-<version>-<hash>" (the capture: vllm-0.32.0-2e465bef); the simulator says what it is.
SYSTEM_FINGERPRINT = "vllm-0.32.0-simulator"


def usage_body(prompt_tokens: int, completion_tokens: int, *, drop_nulls: bool = False) -> JSON:
    usage: JSON = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if not drop_nulls:
        usage["prompt_tokens_details"] = None
        usage["completion_tokens_details"] = None  # (the capture's non-streamed bodies)
    return usage


# --- logprobs -------------------------------------------------------------------------------


def chat_logprobs(
    token_ids: Sequence[int], dicts: Sequence[LogprobDict], top_logprobs: int, strings: TokenStr, as_ids: bool,
    spell_at: Callable[[int, int], str] | None = None,
) -> JSON:
    """`choices[].logprobs` of a chat response or chunk (`dicts`: one per token).

    The top list is the first `top_logprobs` entries of the engine's dict (sampled first), so a
    sampled token outside the true top-k pushes out the k-th best and the list is unsorted.
    `bytes` of the entry is the UTF-8 of the *decoded* token even when `token` is a
    `token_id:N` placeholder, while top entries' `bytes` follow their `token` string.
    `spell_at(position, id)`, where given, is a token's string at that position (vLLM's context-
    corrected strings, `detok.ContextualTokenStrings`); `strings(id)` otherwise.
    """
    content: list[JSON] = []
    for position, (token_id, entries) in enumerate(zip(token_ids, dicts, strict=True)):
        at = strings if spell_at is None else functools.partial(spell_at, position)
        top: list[JSON] = []
        if top_logprobs:
            for i, (cand, logprob) in enumerate(entries.items()):
                if top_logprobs != -1 and i >= top_logprobs:
                    break
                spelled = _spelling(cand, at, as_ids)
                top.append(
                    {"token": spelled, "logprob": _clamp(logprob), "bytes": list(spelled.encode("utf-8", "replace"))}
                )
        decoded = at(token_id)
        content.append(
            {
                "token": _spelling(token_id, at, as_ids),
                "logprob": _clamp(entries[token_id]),
                "bytes": list(decoded.encode("utf-8", "replace")),
                "top_logprobs": top,
            }
        )
    return {"content": content}


def completion_logprobs(
    token_ids: Sequence[int],
    dicts: Sequence[LogprobDict | None],
    num_logprobs: int,
    strings: TokenStr,
    as_ids: bool,
    initial_text_offset: int = 0,
    spell_at: Callable[[int, int], str] | None = None,
) -> JSON:
    """`choices[].logprobs` of a legacy completion.

    `top_logprobs[i]` holds the first k+1 dict entries keyed by token string: k keys when the
    sampled token is in the top-k, k+1 when not, fewer when two ids share a string (the later
    value wins, the first key's position stays: a dict comprehension). A position without a
    dict (first echoed prompt token) gets nulls. `text_offset` adds code points of token strings.
    """
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    tops: list[dict[str, float] | None] = []
    offset = initial_text_offset
    for position, (token_id, entries) in enumerate(zip(token_ids, dicts, strict=True)):
        at = strings if spell_at is None else functools.partial(spell_at, position)
        token = _spelling(token_id, at, as_ids)
        if entries is None:
            token_logprobs.append(None)
            tops.append(None)
        else:
            token_logprobs.append(_clamp(entries[token_id]))
            tops.append(
                {
                    _spelling(cand, at, as_ids): _clamp(logprob)
                    for i, (cand, logprob) in enumerate(entries.items())
                    if num_logprobs == -1 or i <= num_logprobs
                }
            )
        tokens.append(token)
        offsets.append(offset)
        offset += len(token)
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": tops}


def raw_prompt_logprobs(
    positions: Sequence[Position | None], num_logprobs: int, strings: TokenStr
) -> list[JSON | None]:
    """vLLM's raw `prompt_logprobs`: per position `{token_id: {logprob, rank, decoded_token}}`."""
    out: list[JSON | None] = []
    for pos in positions:
        if pos is None:
            out.append(None)
            continue
        out.append(
            {
                str(cand): {"logprob": _clamp(lp), "rank": pos.rank_of(cand), "decoded_token": strings(cand)}
                for cand, lp in pos.vllm_dict(num_logprobs).items()
            }
        )
    return out


# --- response bodies ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every body of one response repeats: its id, creation time and served model name."""

    request_id: str
    created: int
    model: str

    def head(self, obj: str) -> JSON:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}


_CHAT_CHUNK = "chat.completion.chunk"
_COMPLETION = "text_completion"


def _response(env: Envelope, obj: str, choice: JSON, usage: JSON, middle: JSON) -> JSON:
    """A non-streaming body: every field of the response model in order, unset ones null; `middle`
    holds the fields one model has between `usage` and `kv_transfer_params`."""
    return {
        **env.head(obj),
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        **middle,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_response(
    env: Envelope,
    *,
    content: str,
    logprobs: JSON | None,
    finish_reason: str,
    token_ids: list[int] | None,
    usage: JSON,
    prompt_logprobs: list[JSON | None] | None,
    prompt_token_ids: list[int] | None,
) -> JSON:
    message = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }  # tool_calls is dropped by vLLM's serializer when empty
    choice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,  # None for EOS / length; vLLM puts a matched stop string/id here
        "token_ids": token_ids,
        "routed_experts": None,
    }
    prompt = {"prompt_logprobs": prompt_logprobs, "prompt_token_ids": prompt_token_ids, "prompt_text": None}
    return _response(env, "chat.completion", choice, usage, prompt)


def chat_role_chunk(env: Envelope, prompt_token_ids: list[int] | None) -> JSON:
    delta = {"role": "assistant", "content": ""}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return {**env.head(_CHAT_CHUNK), "choices": [choice], "prompt_token_ids": prompt_token_ids, "prompt_text": None}


def chat_echo_chunk(env: Envelope, text: str) -> JSON:
    choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
    return {**env.head(_CHAT_CHUNK), "choices": [choice]}


def chat_content_chunk(
    env: Envelope, *, text: str, logprobs: JSON | None, finish_reason: str | None, token_ids: list[int] | None
) -> JSON:
    choice: JSON = {"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = token_ids
    return {**env.head(_CHAT_CHUNK), "choices": [choice]}


def chat_usage_chunk(env: Envelope, usage: JSON) -> JSON:
    return {**env.head(_CHAT_CHUNK), "choices": [], "usage": usage, "system_fingerprint": SYSTEM_FINGERPRINT}


def completion_response(
    env: Envelope,
    *,
    text: str,
    logprobs: JSON | None,
    finish_reason: str,
    token_ids: list[int] | None,
    prompt_logprobs: list[JSON | None] | None,
    prompt_token_ids: list[int] | None,
    usage: JSON,
) -> JSON:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": token_ids,
        "prompt_logprobs": prompt_logprobs,
        "prompt_token_ids": prompt_token_ids,
        "routed_experts": None,
    }
    return _response(env, _COMPLETION, choice, usage, {})


def completion_chunk(
    env: Envelope,
    *,
    text: str,
    logprobs: JSON | None,
    finish_reason: str | None,
    prompt_token_ids: list[int] | None,
    token_ids: list[int] | None,
) -> JSON:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": prompt_token_ids,
        "token_ids": token_ids,
    }
    return {**env.head(_COMPLETION), "choices": [choice]}


def completion_usage_chunk(env: Envelope, usage: JSON) -> JSON:
    return {**env.head(_COMPLETION), "choices": [], "usage": usage, "system_fingerprint": SYSTEM_FINGERPRINT}


# --- models ---------------------------------------------------------------------------------


def model_list(model: str, max_model_len: int, created: int | None = None) -> JSON:
    created = int(time.time()) if created is None else created
    permission = {
        "id": new_request_id("modelperm"),
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}
