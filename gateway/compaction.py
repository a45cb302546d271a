"""`compaction` items: a summary the gateway wrote, sealed so that only the gateway can read or make one.

`POST /v1/responses/compact` (gateway/compact_route.py) has the route's model summarise a conversation
and returns the summary as a `compaction` item's `encrypted_content`: AES-256-GCM (an AEAD) over the
summary, with the caller (a hash of its API key, or "" where keys are not in use) as associated data.
A client can neither read it, nor edit or forge one (the tag fails: 400), nor use another key's item.
Sent back in `input`, an item is expanded to the one user message it stands for (the configured
prefix, then the summary) before the request is translated, wherever it came from: this request's
input or a replayed previous_response_id chain.

The key: `compaction.key_env` names an environment variable holding 32 bytes in base64; without one,
each process makes a key at start (items then outlive neither a restart nor a move to another replica).
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from gateway.config import Compaction, Config, ConfigError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from gateway.errors import GatewayError, bad_request

_FORMAT = "gwc1."  # the token's version; the rest is base64url(nonce || ciphertext+tag)
_AAD = b"responses-gateway compaction v1\0"
_NONCE_BYTES = 12
_ITEM_KEYS = frozenset({"type", "id", "encrypted_content", "created_by", "status"})  # status: as stored


def compaction_key(config: Config) -> bytes:
    """The configured key (ConfigError naming the key when it is unusable), else a fresh one."""
    env = config.compaction.key_env
    if env is None:
        return secrets.token_bytes(32)  # what AESGCM.generate_key(bit_length=256) returns
    raw = os.environ.get(env)
    if not raw:
        raise ConfigError(f"compaction.key_env: the environment variable {env} is not set")
    try:
        key = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"compaction.key_env: {env} is not base64") from None
    if len(key) != 32:
        raise ConfigError(f"compaction.key_env: {env} must hold 32 bytes (base64), not {len(key)}")
    return key


@dataclass(frozen=True)
class Sealer:
    """Seals and opens compaction payloads with one key; `settings` is the config's `compaction`."""

    key: bytes
    settings: Compaction

    def seal(self, payload: dict[str, Any], caller: str) -> str:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = _cipher(self.key).encrypt(nonce, orjson.dumps(payload), _AAD + caller.encode())
        return _FORMAT + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, token: str, caller: str) -> dict[str, Any] | None:
        """The payload, or None when the token was not sealed by this key for this caller."""
        if not token.startswith(_FORMAT):
            return None
        try:
            raw = base64.urlsafe_b64decode(token[len(_FORMAT):])
            plain = _cipher(self.key).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _AAD + caller.encode())
            payload = orjson.loads(plain)
        except (binascii.Error, ValueError, _invalid_tag()):
            return None
        return payload if isinstance(payload, dict) and isinstance(payload.get("summary"), str) else None

    def message(self, item: dict[str, Any], caller: str, param: str) -> dict[str, Any]:
        """The user message a compaction item stands for; 400 naming `param` when it is not genuine."""
        unknown = sorted(set(item) - _ITEM_KEYS)
        if unknown:
            raise bad_request(f"Unknown parameter: '{param}.{unknown[0]}'.", f"{param}.{unknown[0]}",
                              "unknown_parameter")
        token = item.get("encrypted_content")
        if not isinstance(token, str):
            raise bad_request(f"Missing required parameter: '{param}.encrypted_content'.",
                              f"{param}.encrypted_content", "missing_required_parameter")
        payload = self.open(token, caller)
        if payload is None:
            raise GatewayError(400, f"The encrypted content of {param} could not be verified: it was not made by "
                                    "this gateway's /v1/responses/compact for this API key, or it was changed.",
                               param=f"{param}.encrypted_content", code="invalid_encrypted_content")
        return {"type": "message", "role": "user", "content": self.settings.summary_prefix + payload["summary"]}


SEALER_KEY = web.AppKey("compaction_sealer", Sealer)


def add_sealer(app: web.Application, config: Config) -> None:
    app[SEALER_KEY] = Sealer(compaction_key(config), config.compaction)


def is_compaction(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "compaction"


def expand_compactions(sealer: Sealer | None, caller: str, items: list[Any], param: str) -> list[Any]:
    """`items` with each compaction item replaced by its message (a new list; the others as they are).
    `param` is where the items sit (`input`, or `previous_response_id` for a replayed chain)."""
    if not any(is_compaction(item) for item in items):
        return items
    if sealer is None:
        raise bad_request("compaction items are not supported here.", param)
    return [sealer.message(item, caller, param if param != "input" else f"input[{index}]")
            if is_compaction(item) else item for index, item in enumerate(items)]


@lru_cache(maxsize=4)  # one key per process (a reload may bring another)
def _cipher(key: bytes) -> AESGCM:
    """`cryptography` is imported on the first compaction item, not at start-up: its Rust bindings
    cost each worker ~7 MB of RSS that most deployments never use."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag
