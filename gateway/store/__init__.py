"""Stored responses behind one small async interface, with SQLite, Redis and in-memory backends.

A stored response is self-contained: the Response as sent (full logprobs included) and the input
items the model saw for it, which already hold the replayed history of its own
`previous_response_id`. Replaying a conversation is then one read, and pruning an old turn never
breaks a newer turn that built on it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gateway.config import Config, ConfigError

if TYPE_CHECKING:
    from gateway.store.codec import LogprobList

Item = dict[str, Any]


class ResponseStore(Protocol):
    """Where Responses are kept; every backend enforces the retention limits on its own."""

    async def open(self) -> None:
        """Connect or create what the store needs; raises when it cannot be used."""

    async def close(self) -> None: ...

    async def flush(self) -> None:
        """Return once every save made so far is committed (or has failed and been logged)."""

    async def save(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
                   durable: bool = False, lists: Sequence[LogprobList] = ()) -> None:
        """Keep (or replace) the Response under its `id`, with the input items that produced it and, for
        a background response, its stream's events (a JSON array) for replay. `durable`: return only once it
        is committed, so that every process over the store reads this version from then on (a write-behind
        store otherwise returns when it is queued; the others commit before they return anyway). `lists`:
        the Response's logprobs Fragment with the batch it was rendered from, when the caller has it
        (store.codec encodes from the batch: the same bytes, without reading the list's JSON back)."""

    def has_room(self) -> bool:
        """Whether `queue` can take a save now without going past the store's bound on waiting saves."""

    def queue(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
              lists: Sequence[LogprobList] = ()) -> Any:
        """`save` (not durable) without waiting: for a caller that asked `has_room` first and cannot await
        (a callback that runs once the answer is written). Raises when the store is closed."""

    async def get(self, response_id: str) -> dict[str, Any] | None:
        """The stored Response, or None when unknown, deleted or expired."""

    async def input_items(self, response_id: str) -> list[Item] | None:
        """The Response's input items in conversation order, or None when the Response is gone."""

    async def events(self, response_id: str) -> list[dict[str, Any]] | None:
        """The stream events saved with the Response, or None (gone, or saved without events)."""

    async def delete(self, response_id: str) -> bool:
        """Forget the Response; False when there was nothing to delete."""

    async def item_owner(self, item_key: str) -> str | None:
        """The id of the Response whose output or input items hold the item (`item_keys`), or None."""


class ScopedStore:
    """One caller's view of a store: what a caller saves, only the same caller finds again.

    Callers are told apart by the API key they present (`caller_tag`). A tagged caller's responses
    are kept under `<tag>/<id>`, so another key asking for the same id finds nothing (404, as for an
    unknown id) and cannot continue, read, list or delete it. Untagged callers (keys not in use, or none
    sent) share the plain ids. The Response itself always carries its public id.
    """

    def __init__(self, store: ResponseStore, tag: str | None) -> None:
        self.store = store
        self.prefix = f"{tag}/" if tag else ""

    def _key(self, response_id: str) -> str:
        return self.prefix + response_id

    async def save(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
                   durable: bool = False, lists: Sequence[LogprobList] = ()) -> None:
        if not self.prefix:
            return await self.store.save(response, input_items, events, durable=durable, lists=lists)
        await self.store.save({**response, "id": self._key(response["id"])}, input_items, events, durable=durable,
                              lists=lists)

    def has_room(self) -> bool:
        return self.store.has_room()

    def queue(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
              lists: Sequence[LogprobList] = ()) -> None:
        self.store.queue({**response, "id": self._key(response["id"])} if self.prefix else response, input_items,
                         events, lists=lists)

    async def get(self, response_id: str) -> dict[str, Any] | None:
        found = await self.store.get(self._key(response_id))
        if found is not None and self.prefix:
            found["id"] = response_id
        return found

    async def input_items(self, response_id: str) -> list[Item] | None:
        return await self.store.input_items(self._key(response_id))

    async def events(self, response_id: str) -> list[dict[str, Any]] | None:
        return await self.store.events(self._key(response_id))

    async def delete(self, response_id: str) -> bool:
        return await self.store.delete(self._key(response_id))

    async def find_item(self, item_id: str) -> Item | None:
        """An item this caller's stored Responses hold (an output item, or an input item), by its id:
        what an `item_reference` names. None when unknown, or gone with its Response."""
        owner = await self.store.item_owner(self._key(item_id))
        if owner is None:
            return None
        response = await self.store.get(owner)
        items = await self.store.input_items(owner)
        for item in [*((response or {}).get("output") or []), *(items or [])][::-1]:
            if item.get("id") == item_id:
                return item
        return None


def item_keys(response: dict[str, Any], input_items: list[Item]) -> list[str]:
    """The keys a Response's items are found by: each item's id, in the caller's scope as the Response's
    own key is (`<tag>/<item id>` when the Response is kept under `<tag>/<id>`, see ScopedStore)."""
    key = response["id"]
    scope = key[: key.rfind("/") + 1]
    ids = [item.get("id") for item in (*input_items, *(response.get("output") or []))]
    return list(dict.fromkeys(scope + item_id for item_id in ids if isinstance(item_id, str) and item_id))


def caller_tag(api_key: str) -> str:
    """A stable, non-reversible tag for an API key (the key itself is never stored)."""
    return hashlib.sha256(b"responses-gateway caller\0" + api_key.encode()).hexdigest()[:32]


class StoreError(ConfigError):
    """The store cannot be opened as configured; the message names the key."""


def open_store(gateway_config: Config, counters: Any = None) -> ResponseStore | None:
    """The configured backend (not yet opened), or None for `backend: none`. SQLite and Redis are saved
    to through a write-behind queue (gateway.store.writer; `counters` gets its figures); the memory
    store saves at once."""
    config = gateway_config.store
    if config.backend == "none":
        return None
    if config.backend == "memory":
        from gateway.store.memory import MemoryStore

        return MemoryStore(ttl_seconds=config.ttl_seconds, max_responses=config.max_responses)
    from gateway.store.writer import WriteBehind

    def queued(backend: Any) -> ResponseStore:
        return WriteBehind(backend, queue_size=config.queue_size, read_wait=config.read_wait_seconds,
                           counters=counters)

    if config.backend == "sqlite":
        from gateway.store.sqlite import SQLiteStore

        return queued(SQLiteStore(gateway_config.resolve(config.path), ttl_seconds=config.ttl_seconds,
                                  max_responses=config.max_responses))
    # Deployments hand the URL over in the environment, since it may carry a password.
    url = config.url or os.environ.get("RESPONSES_GATEWAY_REDIS_URL")
    if not url:
        raise StoreError("store.url: the redis backend needs a URL (or RESPONSES_GATEWAY_REDIS_URL)")
    # Imported here so that only Redis deployments load the client.
    from gateway.store.redis import RedisStore

    return queued(RedisStore(url, key_prefix=config.key_prefix, ttl_seconds=config.ttl_seconds,
                             max_responses=config.max_responses))


def page_items(items: list[Item], *, limit: int, order: Literal["asc", "desc"], after: str | None
               ) -> dict[str, Any]:
    """One page of a Response's input items as OpenAI's `ResponseItemList`.

    `after` is the id of the last item of the previous page (in the same `order`); ValueError when
    no item has that id.
    """
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise ValueError(after)
        start = ids.index(after) + 1
    data = ordered[start:start + limit]
    return {
        "object": "list",
        "data": data,
        "has_more": start + limit < len(ordered),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
