"""Canonical `Token`s -> each client wire format.

Renderers take the tokens the client should see (control tokens already set aside) and the
client's k; they normalize alternatives (dedupe, sort, cut to k) and map sentinels, so that no
output ever holds NaN, Infinity or an unsorted top list.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from gateway.logprobs.compiled import TokenBatch, fastpath
from gateway.logprobs.report import TranslationReport
from gateway.logprobs.spellings import chat_token_string, completions_token_string
from gateway.logprobs.tokens import SENTINEL_LOGPROB, Candidate, Token, normalize_candidates, normalize_logprob

_INF = math.inf


def visible_tokens(tokens: Iterable[Token]) -> list[Token]:
    """The tokens that spell the text: control tokens (EOS and the like) are set aside."""
    return [token for token in tokens if not token.special]


def _entry(data: bytes, logprob: float | None) -> dict[str, Any]:
    return {"token": chat_token_string(data), "logprob": normalize_logprob(logprob), "bytes": list(data)}


def render_chat_entry(token: Token, k: int) -> dict[str, Any]:
    # The hot path of every response: chat_token_string and normalize_logprob are written out
    # inline (same results) because a call costs as much as the work here.
    data, logprob, alternatives = token[:3]  # (bytes, logprob, top): tuple unpacking is the fast read
    if type(logprob) is not float or not SENTINEL_LOGPROB < logprob < _INF:
        logprob = normalize_logprob(logprob)
    top = [
        {"token": cand_bytes.decode("utf-8", "backslashreplace"),
         "logprob": value if type(value) is float and SENTINEL_LOGPROB < value < _INF else normalize_logprob(value),
         "bytes": list(cand_bytes)}
        for cand_bytes, value, _, _ in (normalize_candidates(alternatives, k) if k > 0 and alternatives else ())
    ]
    return {"token": data.decode("utf-8", "backslashreplace"), "logprob": logprob, "bytes": list(data),
            "top_logprobs": top}


def render_chat(tokens: Sequence[Token], k: int) -> list[dict[str, Any]]:
    """Chat `logprobs.content`: `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`."""
    if fastpath is not None and type(tokens) is list and type(k) is int:
        return fastpath.render_entries(tokens, k, render_chat_entry)  # the same dicts, built in C
    return [render_chat_entry(token, k) for token in tokens]


# Same keys as chat; bytes are sent everywhere (the Open Responses spec requires them in stream
# events too, and OpenAI's SDK accepts them). The same function, not a wrapper: it runs per token.
render_responses_entry = render_chat_entry


def render_responses(tokens: Sequence[Token], k: int) -> list[dict[str, Any]]:
    """Responses `output_text.logprobs`: `{token, bytes, logprob, top_logprobs}` per token."""
    return render_chat(tokens, k)


def render_responses_json(tokens: Sequence[Token] | TokenBatch, k: int) -> bytes:
    """`render_responses(tokens, k)` as JSON bytes (what orjson writes for it, byte for byte).

    The compiled twin writes the JSON directly, with no dict per entry; other shapes go through the dicts.
    A `TokenBatch` stands for its visible tokens (a group's batch holds no other) and is written from its ids.
    """
    if type(tokens) is TokenBatch:
        return tokens.render_json(k, orjson.dumps)  # type: ignore[attr-defined,no-any-return]
    if fastpath is not None and type(tokens) is list and type(k) is int:
        written = fastpath.render_entries_json(tokens, k, orjson.dumps)
        if written is not None:
            return written
    return orjson.dumps(render_responses(tokens, k))


def _lead_bytes(data: bytes) -> int:
    """How many characters start in `data` (bytes that are not UTF-8 continuation bytes)."""
    return sum(1 for b in data if (b & 0xC0) != 0x80)


# A token's legacy spelling, how many characters start in it, and whether it starts inside one: the same
# few thousand tokens come back in every answer and among every position's alternatives (~6 a token at
# k=5), and spelling them again was most of a legacy completions answer's time (~2.2 ms for 100 tokens
# at k=5, against ~0.15 ms for the same answer as a Response). Bounded: emptied when full.
_SPELLED: dict[bytes, tuple[str, int, bool]] = {}
_SPELLED_MAX = 1 << 16


def _spelled(data: bytes) -> tuple[str, int, bool]:
    known = _SPELLED.get(data)
    if known is None:
        if len(_SPELLED) >= _SPELLED_MAX:
            _SPELLED.clear()
        known = _SPELLED[data] = (completions_token_string(data), _lead_bytes(data),
                                  bool(data) and (data[0] & 0xC0) == 0x80)
    return known


def render_completions(
    tokens: Sequence[Token],
    k: int,
    *,
    text_offset_start: int = 0,
    include_sampled: bool = True,
    report: TranslationReport | None = None,
) -> dict[str, Any]:
    """Legacy completions `{tokens, token_logprobs, top_logprobs, text_offset}`.

    Each dict holds the top k plus, as OpenAI does ("up to logprobs+1 elements"), the sampled token
    when it is not among them. `text_offset` is the code-point offset in the text of the character
    where each token starts, from `text_offset_start`. A token whose logprob is None (first echoed
    prompt token) gets null logprob and null top_logprobs.
    """
    rendered: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    render_completions_groups([(tokens, text_offset_start)], k, rendered, include_sampled=include_sampled,
                              report=report)
    return rendered


def render_completions_groups(groups: Iterable[tuple[Sequence[Token], int]], k: int, into: dict[str, Any], *,
                              include_sampled: bool = True, report: TranslationReport | None = None) -> None:
    """`render_completions` of each (tokens, text_offset_start), appended to `into`'s four lists in one pass
    (a whole answer's groups, without a dict per group)."""
    strings, values, tops, offsets = into["tokens"], into["token_logprobs"], into["top_logprobs"], into["text_offset"]
    spelled = _SPELLED.get
    for tokens, text_offset_start in groups:
        chars_before = text_offset_start
        for token in tokens:
            data, logprob, alternatives, token_id = token[:4]
            known = spelled(data) or _spelled(data)
            strings.append(known[0])
            # A token that starts inside a character points at that character.
            offsets.append(chars_before - 1 if known[2] and chars_before > text_offset_start else chars_before)
            chars_before += known[1]
            if logprob is None:
                values.append(None)
                tops.append(None)
                continue
            values.append(logprob if type(logprob) is float and SENTINEL_LOGPROB < logprob < _INF
                          else normalize_logprob(logprob))
            candidates = normalize_candidates(alternatives, k) if k > 0 and alternatives else ()
            if include_sampled and k > 0:
                for candidate in candidates:  # the sampled token among them: the same id, else the same bytes
                    if (candidate[2] == token_id if candidate[2] is not None and token_id is not None
                            else candidate[0] == data):
                        break
                else:
                    candidates = (*candidates, Candidate(data, logprob, token_id))
            tops.append(completions_top_dict(candidates, report))


def completions_top_dict(
    candidates: Sequence[Candidate], report: TranslationReport | None = None
) -> dict[str, float]:
    """`{token: logprob}` where two candidates can share a key (same bytes, different ids).

    The first keeps the plain spelling; a later one takes the escaped `bytes:` spelling (which
    reads back to the same bytes), then `token_id:N`; only with neither is it merged, and counted.
    """
    spelled = _SPELLED.get
    out: dict[str, float] = {}
    for candidate in candidates:
        data, logprob = candidate[:2]
        key = (spelled(data) or _spelled(data))[0]
        if type(logprob) is not float or not SENTINEL_LOGPROB < logprob < _INF:
            logprob = normalize_logprob(logprob)
        if key in out:
            alternatives = ["bytes:" + "".join(f"\\x{b:02x}" for b in candidate.bytes)]
            if candidate.token_id is not None:
                alternatives.append(f"token_id:{candidate.token_id}")
            free = next((alt for alt in alternatives if alt not in out and candidate.bytes), None)
            if report is not None:
                if free is None:
                    report.collisions_merged += 1
                else:
                    report.collisions += 1
            if free is None:
                out[key] = max(out[key], logprob)
                continue
            key = free
        out[key] = logprob
    return out
