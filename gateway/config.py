"""config.yaml -> typed Config. Errors name the bad key, so a bad config fails at start, clearly."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

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
DEFAULT_TOP_LOGPROBS_CAP = {"vllm": 20, "tgi": 5, "sglang": 20, "llamacpp": 20, "openai": 20}


class Upstream(_Strict):
    urls: list[str] = Field(min_length=1)
    dialect: Literal["vllm", "tgi", "sglang", "llamacpp", "openai"] = "vllm"
    api: Literal["chat", "completions", "generate"] = "chat"
    max_top_logprobs: int | None = Field(default=None, ge=0)
    timeouts: Timeouts = Timeouts()

    @model_validator(mode="after")
    def _api_fits_dialect(self) -> Upstream:
        if self.dialect == "tgi" and self.api == "completions":
            raise ValueError("api: TGI's /v1/completions never returns logprobs; use api: generate or chat")
        if self.api == "generate" and self.dialect not in ("tgi", "sglang"):
            raise ValueError(f"api: generate is TGI's and SGLang's native API, not {self.dialect}'s")
        return self

    @property
    def top_logprobs_cap(self) -> int:
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


class Model(_Strict):
    upstream: str
    upstream_model: str | None = None
    tokenizer: dict[str, str] | None = None
    chat_template: str | None = None


class Config(_Strict):
    listen: Listen = Listen()
    upstreams: dict[str, Upstream]
    models: dict[str, Model]
    base_dir: Path = Field(default=Path("."), exclude=True)

    @model_validator(mode="after")
    def _models_name_known_upstreams(self) -> Config:
        for name, model in self.models.items():
            if model.upstream not in self.upstreams:
                known = ", ".join(sorted(self.upstreams)) or "none"
                raise ValueError(f"models.{name}.upstream: unknown upstream {model.upstream!r} (known: {known})")
        return self

    def resolve(self, path: str) -> Path:
        """Relative paths in the config are relative to the config file's folder."""
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else self.base_dir / candidate


def _key_path(location: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in location) or "(top level)"


def parse_config(data: Any, base_dir: Path) -> Config:
    if not isinstance(data, dict):
        raise ConfigError("config must be a mapping with upstreams: and models:")
    try:
        return Config.model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        first = exc.errors()[0]
        location = _key_path(first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown key"
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
