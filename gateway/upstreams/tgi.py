"""Text Generation Inference: native `/generate` details -> canonical tokens.

TGI's `details.tokens[]` are `{id, text, logprob, special}`: ids are exact when the model's
tokenizer is configured; without it the text is incrementally decoded (`""` on the first tokens of
a split character, the whole character on the completing one), so we align against the text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.logprobs.align import AlignmentError
from gateway.logprobs.parse import LogprobParseError, Parsed, ParseOptions, parse_chat
from gateway.upstreams.openai_compatible import Flavor

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
