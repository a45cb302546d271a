"""Redis store: one conversation served by several gateway replicas.

Each stored item's id (store.item_keys) is a string key `<prefix>item:<key>` holding its response's
id, with the same TTL: an `item_reference` is two reads.
Each Response is one hash (`response`, `input_items`, `events`: store.codec's compact form; plain JSON
as earlier versions wrote it reads too) under `<prefix>response:<id>` with a TTL, so
Redis itself enforces the age limit. The gateway saves through store.writer: a batch of saves is one
pipelined transaction. A sorted set `<prefix>index` (score: save time in ms) caps the
count: a save that takes it past `max_responses` pops the oldest ids (ZPOPMIN is atomic, so two
replicas never pop the same id) and deletes their hashes. The index gets the TTL too, so an idle
gateway leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.store import Item, StoreError, codec
from gateway.store.codec import LogprobList
from gateway.store.writer import Write


class RedisStore:
    def __init__(self, url: str, *, key_prefix: str, ttl_seconds: int, max_responses: int) -> None:
        self.url = url
        self.key_prefix = key_prefix
        self.ttl_seconds = ttl_seconds
        self.max_responses = max_responses
        self._client: aioredis.Redis | None = None

    def _key(self, response_id: str) -> str:
        return f"{self.key_prefix}response:{response_id}"

    def _item_key(self, item_key: str) -> str:
        return f"{self.key_prefix}item:{item_key}"

    @property
    def _index(self) -> str:
        return f"{self.key_prefix}index"

    @property
    def client(self) -> aioredis.Redis:
        assert self._client is not None, "used before open()"
        return self._client

    async def open(self) -> None:
        client = aioredis.from_url(self.url, socket_connect_timeout=5, socket_timeout=10)
        try:
            await client.ping()  # fail at start, not at the first request
        except (RedisError, OSError) as exc:
            await client.aclose()
            raise StoreError(f"store.url: cannot reach Redis: {exc}") from exc
        self._client = client

    async def flush(self) -> None:
        pass  # every save is committed before it returns

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def save(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
                   durable: bool = False, lists: Sequence[LogprobList] = ()) -> None:
        """Save one Response now (the gateway saves through store.writer's queue instead)."""
        await self.write_batch([Write.encoding(response, input_items, events, lists)])

    async def write_batch(self, writes: list[Write]) -> None:
        """Every write in one pipelined transaction (one round trip), as encoded (Write.encoding: store.codec)."""
        now_ms = int(time.time() * 1000)
        async with self.client.pipeline(transaction=True) as pipe:
            for order, write in enumerate(writes):
                response_id, key = write.response_id, self._key(write.response_id)
                fields = {"response": write.response, "input_items": write.input_items}
                if write.events is not None:
                    fields["events"] = write.events
                pipe.delete(key)  # a save replaces the whole entry (no events left from before)
                pipe.hset(key, mapping=fields)
                pipe.expire(key, self.ttl_seconds)
                # Where each item is (an item_reference names it); a pruned response's entries find nothing.
                for item_key in write.keys:
                    pipe.set(self._item_key(item_key), response_id, ex=self.ttl_seconds)
                pipe.zadd(self._index, {response_id: now_ms + order / 1024})  # a batch's saves keep their order
            # Index entries whose hash has expired already.
            pipe.zremrangebyscore(self._index, "-inf", now_ms - self.ttl_seconds * 1000)
            pipe.expire(self._index, self.ttl_seconds)
            pipe.zcard(self._index)
            *_, count = await pipe.execute()
        if count > self.max_responses:
            popped = await self.client.zpopmin(self._index, count - self.max_responses)
            if popped:
                await self.client.delete(*(self._key(member.decode()) for member, _ in popped))

    async def _field(self, response_id: str, field: str) -> Any:
        raw = await self.client.hget(self._key(response_id), field)
        return None if raw is None else codec.decode(raw)

    async def get(self, response_id: str) -> dict[str, Any] | None:
        return await self._field(response_id, "response")

    async def input_items(self, response_id: str) -> list[Item] | None:
        return await self._field(response_id, "input_items")

    async def events(self, response_id: str) -> list[dict[str, Any]] | None:
        return await self._field(response_id, "events")

    async def item_owner(self, item_key: str) -> str | None:
        owner = await self.client.get(self._item_key(item_key))
        return None if owner is None else owner.decode()

    async def delete(self, response_id: str) -> bool:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self._key(response_id))
            pipe.zrem(self._index, response_id)
            deleted, _ = await pipe.execute()
        return bool(deleted)
