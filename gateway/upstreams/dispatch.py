"""A dialect and API's name + Generation -> the upstream call that speaks it.

Plain parameters only: routes, replicas and chat templates belong to the shell (`gateway.routing`),
which passes what the dialect needs, including the prompt, rendered only if the API takes one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from gateway.canonical.generation import Generation
from gateway.logprobs.parse import ParseOptions
from gateway.logprobs.vocab import Vocab
from gateway.upstreams import llamacpp, openai, sglang, tgi, vllm
from gateway.upstreams.base import UpstreamCall, unsupported
from gateway.upstreams.openai_compatible import Flavor, chat_call, completions_call

FLAVORS: dict[str, Flavor] = {
    "vllm": vllm.FLAVOR, "sglang": sglang.FLAVOR, "llamacpp": llamacpp.FLAVOR, "openai": openai.FLAVOR,
    "tgi": tgi.CHAT_FLAVOR,
}


def build_call(gen: Generation, dialect: str, api: str, upstream_model: str, *, cap: int, token_ids: bool,
               k_param: str, prompt: Callable[[], str]) -> UpstreamCall:
    """`prompt()` gives the one string a completions-style API needs; it is called only for those, after
    the request was checked for what they cannot carry."""
    flavor = FLAVORS[dialect]
    if api == "chat":
        return chat_call(flavor, gen, upstream_model, cap=cap, token_ids=token_ids, param=k_param)
    _refuse_chat_only(gen, api)
    if api == "generate":
        if dialect == "tgi":
            return tgi.generate_call(gen, prompt(), cap=cap, param=k_param)
        return sglang.generate_call(gen, prompt(), cap=cap, param=k_param)
    return completions_call(flavor, gen, upstream_model, prompt(), cap=cap, token_ids=token_ids, param=k_param)


def _refuse_chat_only(gen: Generation, api: str) -> None:
    """Tools and images need a chat server (its tool parser, its image processor); a prompt cannot carry them."""
    if gen.tool_options.get("tools"):
        raise unsupported(f"Tools need a chat upstream; this model is served through the {api} API.", "tools")
    if gen.has_images:
        raise unsupported(f"Images need a chat upstream; this model is served through the {api} API.",
                          gen.input_param)
    if api == "generate" and (gen.response_format or {}).get("type", "text") != "text":
        raise unsupported("Structured output is not supported through a native generate API.", gen.format_param)


@functools.lru_cache(maxsize=256)
def parse_options(dialect: str, vocab: Vocab | None) -> ParseOptions:
    """How to read a dialect's logprobs with the model's tokenizer.

    Built once per route rather than per request (options are frozen; vocabularies hash by identity)."""
    return FLAVORS[dialect].parse_options(vocab)


def bytes_precision(dialect: str, api: str, has_tokenizer: bool) -> tuple[str, bool]:
    """What a route's logprob bytes are, in one line, and whether they are per character (the split of
    a character's bytes across its tokens is not what the route shows): for check-config and start-up."""
    if dialect == "llamacpp":
        return ("per character: llama.cpp's raw bytes, one entry per completed character (the token that"
                " completes it carries the whole character; tokens that leave it unfinished, or whose text it"
                " holds back, have none)"), True
    if has_tokenizer:
        if dialect == "vllm" or api == "generate":
            return "exact bytes from token ids", False
        return "lossy strings aligned against the text; the tokenizer rules out spans that are not tokens", False
    if dialect == "openai":
        return "exact bytes from the server's `bytes`", False
    return ("per character (no tokenizer): a split character's lead tokens have empty bytes and the"
            " token that completes it carries the whole character, as vLLM spells them"), True
