"""Route + Generation -> the upstream call of the route's dialect and API."""

from __future__ import annotations

from gateway.errors import bad_request
from gateway.routing import Route
from gateway.translate.chat_template import ChatTemplateError, render_prompt
from gateway.translate.generation import Generation
from gateway.upstreams import vllm
from gateway.upstreams.base import UpstreamCall


def prompt_for(route: Route, gen: Generation) -> str:
    """A completions-style upstream needs one string: the client's, or the chat template's."""
    if gen.prompt is not None:
        return gen.prompt
    try:
        return render_prompt(gen.messages or [], route.chat_template, gen.plain_input)  # type: ignore[arg-type]
    except ChatTemplateError as exc:
        raise bad_request(str(exc), "input") from None


def build_call(route: Route, gen: Generation, k_param: str) -> UpstreamCall:
    upstream = route.upstream
    token_ids = route.vocab is not None
    if upstream.api == "chat":
        return vllm.chat_call(gen, route.upstream_model, cap=upstream.max_top_logprobs, token_ids=token_ids,
                              param=k_param)
    return vllm.completions_call(gen, route.upstream_model, prompt_for(route, gen), cap=upstream.max_top_logprobs,
                                 token_ids=token_ids, param=k_param)
