"""Public model name -> upstream route, with its tokenizer and chat template loaded once.

The shell's side of the arrows: only here do a route's upstream, template and replicas meet; the dialects
(`gateway.upstreams`) get plain parameters from `Route.upstream_call` and never see a Route.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.canonical.generation import Generation
from gateway.config import Config, ConfigError, Upstream
from gateway.errors import bad_request
from gateway.logprobs.parse import ParseOptions, id_table
from gateway.logprobs.vocab import HFVocab, Vocab, VocabError, load_vocab
from gateway.replicas import Outlier, ReplicaSet
from gateway.translate.chat_template import ChatTemplate, ChatTemplateError, render_prompt
from gateway.upstreams import dispatch
from gateway.upstreams.base import UpstreamCall


@dataclass(frozen=True)
class Route:
    model: str  # the name clients send
    upstream_name: str
    upstream: Upstream
    upstream_model: str
    vocab: Vocab | None
    chat_template: ChatTemplate | None
    replicas: ReplicaSet  # shared by every model of the upstream
    hosted_tools: str = "drop"  # the model's policy for tools only OpenAI can run (translate.tools)

    def upstream_call(self, gen: Generation, k_param: str) -> UpstreamCall:
        """Generation -> the request this route's dialect and API take (`k_param`: how the client named k)."""
        upstream = self.upstream
        return dispatch.build_call(gen, upstream.dialect, upstream.api, self.upstream_model,
                                   cap=upstream.top_logprobs_cap, token_ids=self.vocab is not None,
                                   k_param=k_param, prompt=lambda: self.prompt_for(gen))

    def prompt_for(self, gen: Generation) -> str:
        """A completions-style upstream needs one string: the client's, or the chat template's."""
        if gen.prompt is not None:
            return gen.prompt
        try:
            return render_prompt(gen.messages or [], self.chat_template, gen.plain_input)
        except ChatTemplateError as exc:
            raise bad_request(str(exc), "input") from None

    def parse_options(self) -> ParseOptions:
        """How to read this route's logprobs: its dialect's flavor with the model's tokenizer."""
        return dispatch.parse_options(self.upstream.dialect, self.vocab)


def _load_template(config: Config, name: str, path: str | None, tokenizer_dir: Path | None) -> ChatTemplate | None:
    try:
        if path is not None:
            resolved = config.resolve(path)
            if resolved.name.endswith(".json"):
                return ChatTemplate.from_tokenizer_config(resolved)
            return ChatTemplate.from_file(resolved)
        if tokenizer_dir is not None and (tokenizer_dir / "tokenizer_config.json").is_file():
            return ChatTemplate.from_tokenizer_config(tokenizer_dir / "tokenizer_config.json")
    except (ChatTemplateError, OSError) as exc:
        raise ConfigError(f"models.{name}.chat_template: {exc}") from None
    return None


def encodes_per_request(upstream: Upstream) -> bool:
    """Whether requests to `upstream` call `vocab.encode`: TGI's native /generate reports no prompt
    token count, so the gateway counts the prompt itself (gateway.upstreams.tgi)."""
    return upstream.api == "generate" and upstream.dialect == "tgi"


def outlier(upstream: Upstream) -> Outlier:
    return Outlier(upstream.eject_after, upstream.cooldown, max(upstream.max_cooldown, upstream.cooldown),
                   upstream.max_ejection_percent, upstream.health_interval)


#: Told after each model's tokenizer is loaded: (model, vocabulary, seconds the load took).
TokenizerLoaded = Callable[[str, Vocab, float], None]


def build_routes(config: Config, on_tokenizer: TokenizerLoaded | None = None,
                 replica_sets: Mapping[str, ReplicaSet] | None = None) -> dict[str, Route]:
    """Load every model's tokenizer and template now, so a bad one fails at start.

    An HF vocabulary lets its Tokenizer go once its tables are built; routes that encode per
    request keep it loaded from the start (`HFVocab.require_encoder`).

    Aliases map to the same route; replicas are shared per upstream so load balancing and
    health see all of an upstream's traffic. `replica_sets` are existing ones to keep for those
    upstreams (a reload whose upstream did not change keeps its health and in-flight counts).
    """
    given = replica_sets or {}
    replica_sets = {name: given[name] if name in given else ReplicaSet(u.urls, name=name, outlier=outlier(u))
                    for name, u in config.upstreams.items()}
    routes: dict[str, Route] = {}
    for name, model in config.models.items():
        vocab = None
        tokenizer_dir = None
        started = time.perf_counter()
        if model.tokenizer == {"builtin": "demo"}:
            from gateway.logprobs.demo_vocab import build_demo_vocab

            vocab = build_demo_vocab()
        elif model.tokenizer is not None:
            try:
                vocab = load_vocab(model.tokenizer, config.base_dir)
            except VocabError as exc:
                raise ConfigError(f"models.{name}.tokenizer: {exc}") from None
            if "directory" in model.tokenizer:
                tokenizer_dir = config.resolve(model.tokenizer["directory"])
        upstream = config.upstreams[model.upstream]
        if isinstance(vocab, HFVocab) and encodes_per_request(upstream):
            vocab.require_encoder()  # loaded now: a reload would stall the event loop on a request
        if vocab is not None:
            # The id -> bytes table every request with logprobs reads: built now, before `serve --workers`
            # forks (shared copy-on-write), not on the first request (~0.1 s for Qwen2's 151k ids).
            id_table(vocab)
        if vocab is not None and on_tokenizer is not None:
            on_tokenizer(name, vocab, time.perf_counter() - started)
        template = _load_template(config, name, model.chat_template, tokenizer_dir)
        route = Route(name, model.upstream, upstream, model.upstream_model or name, vocab, template,
                      replica_sets[model.upstream], model.hosted_tools)
        for public_name in (name, *model.aliases):
            routes[public_name] = route
    return routes
