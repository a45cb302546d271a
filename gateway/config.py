"""config.yaml -> typed Config. Errors name the bad key, so a bad config fails at start, clearly."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class Timeouts(_Strict):
    """Seconds. `first_token` bounds the wait for the upstream's response headers/first chunk."""

    connect: float = Field(default=5.0, gt=0)
    first_token: float = Field(default=120.0, gt=0)
    idle: float = Field(default=60.0, gt=0)
    total: float = Field(default=600.0, gt=0)


# Alternatives per token each server family returns by default (vLLM --max-logprobs,
# TGI --max-top-n-tokens, ...); `max_top_logprobs` overrides it for a server started otherwise.
# None: the server has no limit (llama-server answers any `top_logprobs`, 25 in its real-server test);
# only the front doors' own (OpenAI's 20) applies.
DEFAULT_TOP_LOGPROBS_CAP: dict[str, int | None] = {"vllm": 20, "tgi": 5, "sglang": 20, "llamacpp": None,
                                                   "openai": 20}


class Upstream(_Strict):
    urls: list[str] = Field(min_length=1)
    dialect: Literal["vllm", "tgi", "sglang", "llamacpp", "openai"] = "vllm"
    api: Literal["chat", "completions", "generate"] = "chat"
    max_top_logprobs: int | None = Field(default=None, ge=0)
    timeouts: Timeouts = Timeouts()
    retries: int = Field(default=1, ge=0)  # other replicas tried before the first byte reaches the client
    # Outlier ejection (Envoy's): `eject_after` consecutive gateway-side failures eject a replica for
    # `cooldown` seconds times its consecutive ejections, at most `max_cooldown`; never the last healthy one.
    eject_after: int = Field(default=5, ge=1)
    cooldown: float = Field(default=10.0, ge=0)
    max_cooldown: float = Field(default=300.0, ge=0)
    max_ejection_percent: float = Field(default=100.0, ge=0, le=100)
    health_path: str = "/health"
    health_interval: float = Field(default=5.0, ge=0)  # seconds between active checks; 0 turns them off
    api_key_env: str | None = None  # environment variable holding the upstream's bearer token
    forward_headers: list[str] = Field(default_factory=list)  # client headers passed through

    @model_validator(mode="after")
    def _api_fits_dialect(self) -> Upstream:
        if self.dialect == "tgi" and self.api == "completions":
            raise ValueError("api: TGI's /v1/completions never returns logprobs; use api: generate or chat")
        if self.api == "generate" and self.dialect not in ("tgi", "sglang"):
            raise ValueError(f"api: generate is TGI's and SGLang's native API, not {self.dialect}'s")
        return self

    @property
    def top_logprobs_cap(self) -> int | None:
        if self.max_top_logprobs is not None:
            return self.max_top_logprobs
        return DEFAULT_TOP_LOGPROBS_CAP[self.dialect]

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) base URL")
        return [url.rstrip("/") for url in urls]


TOKENIZER_FORMS_HINT = ("{hf: Qwen/Qwen2-0.5B} (a Hub repository), {directory: /models/qwen} (a model folder) "
                        "or {file: tokenizer.json}")


class Model(_Strict):
    upstream: str
    upstream_model: str | None = None
    # A mapping naming one form ({hf: ...}, {directory: ...}, {file: ...}, ...); its keys and values
    # are checked by gateway.logprobs.vocab.load_vocab, where each form's options are known.
    tokenizer: dict[str, Any] | None = None
    chat_template: str | None = None
    aliases: list[str] = Field(default_factory=list)  # more names clients may send
    # Tools only OpenAI can run (web_search, file_search, code_interpreter, mcp, ...): `drop` leaves them
    # out of the upstream request (counted, and named in a response header and the access log);
    # `refuse` answers 400.
    hosted_tools: Literal["drop", "refuse"] = "drop"

    @field_validator("tokenizer", mode="before")
    @classmethod
    def _tokenizer_is_a_mapping(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(f"a tokenizer is a mapping, not the string {value!r}; write {TOKENIZER_FORMS_HINT}")
        return value


class Auth(_Strict):
    """Inbound API keys (`Authorization: Bearer`), from an environment variable (comma-separated)
    and/or a file (one per line). No keys configured means no authentication."""

    api_keys_env: str | None = None
    api_keys_file: str | None = None
    forward_client_key: bool = False  # pass the client's Authorization header upstream


class Limits(_Strict):
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # An upstream's whole (non-streamed) answer larger than this is refused with a 502, its connection
    # dropped. The largest legitimate ones are long answers with many alternatives per token (~1.1 KB a
    # token at top_logprobs 20, so ~150 MB for 128k tokens); streamed answers are bounded per event.
    max_upstream_body_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    # `background: true` responses running at once in this process (429 beyond; 0 turns them off).
    background_responses: int = Field(default=32, ge=0)
    # A WebSocket connection on /v1/responses lasts at most this long (then websocket_connection_limit_reached).
    websocket_seconds: float = Field(default=3600.0, gt=0)


class Shutdown(_Strict):
    grace_seconds: float = Field(default=30.0, ge=0)  # in-flight streams may finish within this


class Logging(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    log_bodies: bool = False  # request bodies hold prompts: only when explicitly turned on


class Store(_Strict):
    """Stored responses (`store`, `previous_response_id`, GET/DELETE /v1/responses/{id}).

    `sqlite` is one file (relative paths against the config's folder), good for one gateway process
    or several on one host; `redis` is shared by many replicas (`url`, else the environment variable
    RESPONSES_GATEWAY_REDIS_URL at start); `memory` is lost on restart; `none` stores nothing.
    Retention applies to every backend: older than `ttl_seconds` or beyond the newest
    `max_responses` is gone.
    """

    backend: Literal["sqlite", "redis", "memory", "none"] = "sqlite"
    path: str = "responses.sqlite3"
    url: str | None = None
    key_prefix: str = "responses-gateway:"
    ttl_seconds: int = Field(default=30 * 24 * 3600, gt=0)  # OpenAI keeps responses 30 days
    max_responses: int = Field(default=10_000, gt=0)
    # Saving is queued and group-committed after the answer (gateway.store.writer): at most this many
    # saves wait; when full, answers wait for room.
    queue_size: int = Field(default=1024, gt=0)
    # A read that misses a recently made id waits this long for another process to commit it.
    read_wait_seconds: float = Field(default=2.0, ge=0)

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{url!r} is not a redis://, rediss:// or unix:// URL")
        return url


DEFAULT_COMPACTION_PROMPT = (
    "Write a summary of the conversation above for yourself, to continue it later without the full "
    "text. Keep every fact, decision, name, number, file, code word, open question and pending task, "
    "and what the user asked for last. Leave out pleasantries. Answer with the summary only."
)
DEFAULT_SUMMARY_PREFIX = "Summary of the earlier conversation (written when it was compacted):\n\n"


class Compaction(_Strict):
    """POST /v1/responses/compact: the route's own model summarises the conversation.

    `prompt` is sent as the last user message after the conversation; the summary comes back
    encrypted and authenticated (AES-256-GCM) in a `compaction` item, which a later request expands
    to one user message: `summary_prefix` + the summary. `key_env` names an environment variable
    holding the key (32 bytes, base64); without it each process makes its own at start, so items
    made by one process (or before a restart) are refused by another: set it for replicas.
    """

    prompt: str = Field(default=DEFAULT_COMPACTION_PROMPT, min_length=1)
    summary_prefix: str = DEFAULT_SUMMARY_PREFIX
    max_output_tokens: int = Field(default=2048, gt=0)
    key_env: str | None = None


class Config(_Strict):
    listen: Listen = Listen()
    upstreams: dict[str, Upstream]
    models: dict[str, Model]
    store: Store = Store()
    compaction: Compaction = Compaction()
    auth: Auth = Auth()
    limits: Limits = Limits()
    shutdown: Shutdown = Shutdown()
    logging: Logging = Logging()
    playground: bool = False  # GET /playground: the logprob viewer page (on in `demo`)
    # Worker processes accepting on the listen port (`auto`: the CPUs this process may use); see gateway.workers.
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    base_dir: Path = Field(default=Path("."), exclude=True)

    @model_validator(mode="after")
    def _models_name_known_upstreams(self) -> Config:
        names = set(self.models)
        for name, model in self.models.items():
            if model.upstream not in self.upstreams:
                known = ", ".join(sorted(self.upstreams)) or "none"
                raise ValueError(f"models.{name}.upstream: unknown upstream {model.upstream!r} (known: {known})")
            for alias in model.aliases:
                if alias in names:
                    raise ValueError(f"models.{name}.aliases: {alias!r} names another model or alias")
                names.add(alias)
        return self

    def resolve(self, path: str) -> Path:
        """Relative paths in the config are relative to the config file's folder."""
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else self.base_dir / candidate


def _key_path(location: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in location) or "(top level)"


def _keys_at(location: tuple[Any, ...]) -> list[str]:
    """The keys the config accepts in the section that holds `location`'s last part."""
    section: Any = Config
    for part in location[:-1]:
        if get_origin(section) is dict:  # a named entry (upstreams.NAME, models.NAME): its value type
            section = get_args(section)[1]
        elif isinstance(section, type) and issubclass(section, BaseModel) and str(part) in section.model_fields:
            section = section.model_fields[str(part)].annotation
            if get_origin(section) is not dict:  # `X | None`: X
                models = [arg for arg in get_args(section) if isinstance(arg, type) and issubclass(arg, BaseModel)]
                section = models[0] if models else section
        else:
            return []
    if isinstance(section, type) and issubclass(section, BaseModel):
        return [name for name, info in section.model_fields.items() if not info.exclude]
    return []


def _did_you_mean(location: tuple[Any, ...]) -> str:
    known = _keys_at(location)
    close = difflib.get_close_matches(str(location[-1]), known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (known keys: {', '.join(known)})" if known else ""


def parse_config(data: Any, base_dir: Path) -> Config:
    if not isinstance(data, dict):
        raise ConfigError("config must be a mapping with upstreams: and models:")
    try:
        return Config.model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key also leaves the key it meant missing: the misspelling is the one to name.
        first = next((error for error in errors if error["type"] == "extra_forbidden"), errors[0])
        location = _key_path(first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown key" + _did_you_mean(first["loc"])
        # A validator over several fields names its key first ("api: ..."): make it part of the path.
        field_first = re.match(r"([a-z_]+): ", message)
        if first["type"] == "value_error" and field_first and not message.startswith("models."):
            location = f"{location}.{field_first.group(1)}"
            message = message[field_first.end():]
        raise ConfigError(f"{location}: {message}") from None


def load_config(path: str | Path) -> Config:
    config_path = Path(path)
    try:
        data = yaml.safe_load(config_path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {config_path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{config_path}: invalid YAML: {exc}") from None
    return parse_config(data, config_path.resolve().parent)
