"""In-process store: for tests, demos and a single gateway that may forget on restart."""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from gateway.store import Item, codec, item_keys
from gateway.store.codec import LogprobList


class MemoryStore:
    """A dict in insertion order; pruned on every save, expired entries are invisible before that."""

    def __init__(self, *, ttl_seconds: int, max_responses: int, clock: Callable[[], float] = time.time) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_responses = max_responses
        self._clock = clock
        # id -> (saved at, the Response in store.codec's compact form, its input items, events, its item keys)
        self._entries: OrderedDict[str, tuple[float, bytes, list[Item], bytes | None, list[str]]] = OrderedDict()
        self._items: dict[str, str] = {}  # item key -> the response id that holds it (store.item_keys)

    async def open(self) -> None:
        pass

    async def flush(self) -> None:
        pass  # every save is committed before it returns

    async def close(self) -> None:
        self._entries.clear()
        self._items.clear()

    async def save(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
                   durable: bool = False, lists: Sequence[LogprobList] = ()) -> None:
        self.queue(response, input_items, events, lists=lists)

    def has_room(self) -> bool:
        return True

    def queue(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
              lists: Sequence[LogprobList] = ()) -> None:
        """The save, done now (kept in memory: nothing to wait for)."""
        now = self._clock()
        response_id = response["id"]
        self._entries.pop(response_id, None)
        # Copies: the caller's dicts live on in the request handler (and in events already sent). The
        # Response compact, as the other backends keep it (~45 KB for 1,000 tokens at k=5, where its
        # parsed dicts took ~2.5 MB: 256 long answers stored ran a gateway past 3 GB).
        keys = item_keys(response, input_items)
        stored = codec.encode(response, lists=lists)
        self._entries[response_id] = (now, stored, copy.deepcopy(input_items), events, keys)
        for key in keys:
            self._items[key] = response_id
        cutoff = now - self.ttl_seconds
        while self._entries:
            oldest_id, (saved_at, *_) = next(iter(self._entries.items()))
            if saved_at >= cutoff and len(self._entries) <= self.max_responses:
                break
            self._forget(oldest_id)

    def _forget(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        for key in entry[4]:
            if self._items.get(key) == response_id:  # not an item a later Response holds too
                del self._items[key]
        return True

    def _live(self, response_id: str) -> tuple[float, bytes, list[Item], bytes | None, list[str]] | None:
        entry = self._entries.get(response_id)
        if entry is None or entry[0] < self._clock() - self.ttl_seconds:
            return None
        return entry

    async def get(self, response_id: str) -> dict[str, Any] | None:
        entry = self._live(response_id)
        return codec.decode(entry[1]) if entry else None

    async def input_items(self, response_id: str) -> list[Item] | None:
        entry = self._live(response_id)
        return copy.deepcopy(entry[2]) if entry else None

    async def events(self, response_id: str) -> list[dict[str, Any]] | None:
        entry = self._live(response_id)
        return orjson.loads(entry[3]) if entry and entry[3] is not None else None

    async def delete(self, response_id: str) -> bool:
        return self._forget(response_id)

    async def item_owner(self, item_key: str) -> str | None:
        owner = self._items.get(item_key)
        return owner if owner is not None and self._live(owner) is not None else None
