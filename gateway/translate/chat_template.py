"""Chat templates: render a conversation into the prompt string a Completions-only upstream expects.

The output must match Hugging Face `tokenizer.apply_chat_template(messages, tokenize=False,
add_generation_prompt=True)` byte for byte, so the Jinja environment copies its settings: a sandbox,
`trim_blocks`/`lstrip_blocks`, `loopcontrols`, a `tojson` that does not HTML-escape, and the
`raise_exception` / `strftime_now` globals. Templates come from model repos, so they are untrusted.

Jinja is imported on the first template compiled, not with this module: a gateway whose routes have
no chat template never loads it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from jinja2 import Template
    from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """A chat template could not be loaded or rendered; the message says which and why."""


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <>&' and sorts keys; HF templates expect plain json.dumps output.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    # Local time, like HF: templates use it for "Today Date: ..." lines.
    return datetime.now().strftime(fmt)


@functools.cache  # configuration only, no state: one environment serves every template
def _environment() -> ImmutableSandboxedEnvironment:
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.parser import Parser
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class _StrictSandbox(ImmutableSandboxedEnvironment):
        """HF's sandbox, but unsafe attribute access fails at once.

        Jinja's sandbox returns an Undefined that renders as "" for `''.__class__`; a template probing
        internals is broken or hostile either way, and an error is easier to see than a silently wrong prompt.
        """

        def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
            raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    class _GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}`: HF marks assistant spans with it; rendering emits the body.

        Without the tag, templates written for HF's assistant-mask training support would not even compile.
        """

        tags = frozenset({"generation"})  # immutable: the class attribute is shared by every environment

        def parse(self, parser: Parser) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            # A call block (not the bare body) so `{% set %}` inside stays scoped, as it does in HF.
            return nodes.CallBlock(self.call_method("_emit_body"), [], [], body).set_lineno(lineno)

        def _emit_body(self, caller: Callable[[], str]) -> str:
            return caller()

    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True,
                         extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: Any, key: str, source: Path) -> str:
    """A special token from tokenizer_config.json: a string, `{"content": ...}` (AddedToken), or absent."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ChatTemplateError(f"{source}: {key} must be a string or an object with a string 'content'")


def _pick_template(value: Any, name: str, source: Path) -> str:
    """`chat_template` is a string, or a list of `{"name", "template"}` of which we take `name`."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {entry.get("name"): entry.get("template") for entry in value if isinstance(entry, dict)}
        template = named.get(name)
        if isinstance(template, str):
            return template
        known = ", ".join(sorted(str(key) for key in named)) or "none"
        raise ChatTemplateError(f"{source}: chat_template has no template named {name!r} (found: {known})")
    raise ChatTemplateError(f"{source}: chat_template must be a string or a list of {{name, template}} objects")


class ChatTemplate:
    """A chat template compiled once, rendered per request."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2 import TemplateSyntaxError

        try:
            self._template: Template = _environment().from_string(source)
        except TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template syntax error at line {exc.lineno}: {exc.message}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_file(cls, path: str | Path, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """A bare Jinja template, e.g. a model repo's `chat_template.jinja`."""
        path = Path(path)
        try:
            source = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ChatTemplateError(f"cannot read chat template {path}: {exc.strerror or exc}") from exc
        return cls(source, bos_token=bos_token, eos_token=eos_token)

    @classmethod
    def from_tokenizer_config(cls, path: str | Path, name: str = "default") -> ChatTemplate:
        """A model repo's `tokenizer_config.json`, with its `chat_template` and `bos_token`/`eos_token`.

        Newer transformers save the template beside the config as `chat_template.jinja` instead of
        inside it; that file is used when the config has no `chat_template`.
        """
        path = Path(path)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ChatTemplateError(f"cannot read tokenizer config {path}: {exc.strerror or exc}") from exc
        except json.JSONDecodeError as exc:
            raise ChatTemplateError(f"{path}: not valid JSON: {exc}") from exc
        if not isinstance(config, dict):
            raise ChatTemplateError(f"{path}: expected a JSON object")
        bos = _token_text(config.get("bos_token"), "bos_token", path)
        eos = _token_text(config.get("eos_token"), "eos_token", path)
        if config.get("chat_template") is not None:
            return cls(_pick_template(config["chat_template"], name, path), bos_token=bos, eos_token=eos)
        sibling = path.with_name("chat_template.jinja")
        if sibling.is_file():
            return cls.from_file(sibling, bos_token=bos, eos_token=eos)
        raise ChatTemplateError(f"{path}: no chat_template in the config and no {sibling.name} beside it")

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[Any] | None = None, **extra: Any) -> str:
        """The prompt for `messages`; `extra` reaches the template as variables (HF's chat_template_kwargs)."""
        # Same precedence as HF: extras may override the special tokens, never the conversation.
        # `documents` is set to None (not left undefined) because HF always passes it and templates
        # test it with `is not none`, which an undefined variable passes.
        from jinja2 import TemplateError  # loaded with the template: a lookup in sys.modules
        from jinja2.sandbox import SecurityError

        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, "documents": None, **extra,
                   "messages": messages, "tools": tools, "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise  # raise_exception: the template's own message is the clearest one
        except SecurityError as exc:
            raise ChatTemplateError(f"chat template blocked by the sandbox: {exc}") from exc
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed to render: {exc.message or type(exc).__name__}") from exc
        except Exception as exc:  # any error inside a template is the template's; callers need one type
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc


def render_prompt(messages: list[dict[str, Any]], template: ChatTemplate | None, plain_input: str | None) -> str:
    """The Completions prompt for a Responses request.

    `plain_input` is the request's `input` when it was a bare string with no instructions: with no
    template, sending it as is loses nothing, since there is no conversation structure to render.
    """
    if template is not None:
        return template.render(messages, add_generation_prompt=True)
    if plain_input is not None:
        return plain_input
    raise ChatTemplateError("model has no chat template: cannot render a conversation into a completions prompt; "
                            "configure chat_template or send input as a plain string")
