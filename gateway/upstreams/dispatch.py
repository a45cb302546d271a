"""Route + Generation -> the upstream call of the route's dialect and API."""

from __future__ import annotations

import functools

from gateway.errors import bad_request
from gateway.logprobs.parse import ParseOptions
from gateway.logprobs.vocab import Vocab
from gateway.routing import Route
from gateway.translate.chat_template import ChatTemplateError, render_prompt
from gateway.translate.generation import Generation
from gateway.upstreams import llamacpp, openai, sglang, tgi, vllm
from gateway.upstreams.base import UpstreamCall, unsupported
from gateway.upstreams.openai_compatible import Flavor, chat_call, completions_call

FLAVORS: dict[str, Flavor] = {
    "vllm": vllm.FLAVOR, "sglang": sglang.FLAVOR, "llamacpp": llamacpp.FLAVOR, "openai": openai.FLAVOR,
    "tgi": tgi.CHAT_FLAVOR,
}


def prompt_for(route: Route, gen: Generation) -> str:
    """A completions-style upstream needs one string: the client's, or the chat template's."""
    if gen.prompt is not None:
        return gen.prompt
    try:
        return render_prompt(gen.messages or [], route.chat_template, gen.plain_input)
    except ChatTemplateError as exc:
        raise bad_request(str(exc), "input") from None


def build_call(route: Route, gen: Generation, k_param: str) -> UpstreamCall:
    upstream = route.upstream
    flavor = FLAVORS[upstream.dialect]
    cap = upstream.top_logprobs_cap
    token_ids = route.vocab is not None
    if upstream.api == "chat":
        return chat_call(flavor, gen, route.upstream_model, cap=cap, token_ids=token_ids, param=k_param)
    _refuse_chat_only(gen, upstream.api)
    if upstream.api == "generate":
        if upstream.dialect == "tgi":
            return tgi.generate_call(gen, prompt_for(route, gen), cap=cap, param=k_param)
        return sglang.generate_call(gen, prompt_for(route, gen), cap=cap, param=k_param)
    return completions_call(flavor, gen, route.upstream_model, prompt_for(route, gen), cap=cap,
                            token_ids=token_ids, param=k_param)


def _refuse_chat_only(gen: Generation, api: str) -> None:
    """Tools and images need a chat server (its tool parser, its image processor); a prompt cannot carry them."""
    if gen.tool_options.get("tools"):
        raise unsupported(f"Tools need a chat upstream; this model is served through the {api} API.", "tools")
    if gen.has_images:
        raise unsupported(f"Images need a chat upstream; this model is served through the {api} API.",
                          gen.input_param)
    if api == "generate" and (gen.response_format or {}).get("type", "text") != "text":
        raise unsupported("Structured output is not supported through a native generate API.", gen.format_param)


def parse_options(route: Route) -> ParseOptions:
    """How to read this route's logprobs: its dialect's flavor with the model's tokenizer."""
    return _parse_options(route.upstream.dialect, route.vocab)


@functools.lru_cache(maxsize=256)
def _parse_options(dialect: str, vocab: Vocab | None) -> ParseOptions:
    # Built once per route rather than per request (options are frozen; vocabularies hash by identity).
    return FLAVORS[dialect].parse_options(vocab)


def bytes_precision(dialect: str, api: str, has_tokenizer: bool) -> tuple[str, bool]:
    """What a route's logprob bytes are, in one line, and whether they are per character (the split of
    a character's bytes across its tokens is not what the route shows): for check-config and start-up."""
    if dialect == "llamacpp":
        return ("per character: llama.cpp sends one entry per completed character (the token that completes"
                " it carries its bytes; tokens that leave it unfinished have no entry)"), True
    if has_tokenizer:
        if dialect == "vllm" or api == "generate":
            return "exact bytes from token ids", False
        return "lossy strings aligned against the text; the tokenizer rules out spans that are not tokens", False
    if dialect == "openai":
        return "exact bytes from the server's `bytes`", False
    return ("per character (no tokenizer): a split character's lead tokens have empty bytes and the"
            " token that completes it carries the whole character, as vLLM spells them"), True
