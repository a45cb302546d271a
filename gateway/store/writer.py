"""Saving off the critical path: a write-behind queue with group commit, and reads that see it.

`save` only queues the Response (already encoded as stored, gateway.store.codec, so the handler's
dicts are never read again and the queue holds ~45 KB for a 1,000-token k=5 Response, not its ~0.4 MB
of JSON) and returns: the client gets its answer without waiting for the disk or the network. One writer
task per store takes everything pending, up to `batch_size`, and hands it to the backend's
`write_batch` (SQLite: one transaction; Redis: one pipelined round trip), then the next batch:
under load many Responses share a commit. A batch that is not full is taken `linger` (20 ms) after
the writer woke, so that saves finishing together share its commit and thread hop; reads never wait
for that (a pending save is served from the queue).

Bounded: at most `queue_size` saves wait. When the queue is full, `save` waits for room, so the
request that saves (its answer not yet sent, or its stream's terminal event not yet written) is held
back until the writer catches up: backpressure on the clients instead of memory without bound.

Failures: a batch that fails is retried one save at a time, so one bad save loses only itself (unless
the first one fails again: then the store itself is failing and the whole batch is given up at once,
so a store that is down cannot hold the writer for one timeout per save); a save that still fails is
logged with its id and counted (`gateway_store_write_failures_total`), never dropped silently.

Read your own writes:
- A `durable` save (a background response's: each status it shows) returns once committed, so no other
  process reads an older version after this one has shown it.
- In this process, a save still queued (or in the batch being written) is served from memory: every
  read (`get`, `input_items`, `events`, `item_owner`) looks there first, and `delete` waits for it.
- Across processes (workers on one SQLite file, replicas on one Redis), a read that misses an id
  `new_id` made within the last `horizon` seconds (ids carry their creation time) polls the backend
  for up to `read_wait` seconds before answering "not found": the process that answered is committing
  it (its writer commits within milliseconds unless its queue is full or the backend is down).

`close` (graceful shutdown) writes everything queued before closing the backend.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.store import Item, codec, item_keys
from gateway.translate.response_object import id_created_at

log = logging.getLogger("responses_gateway.store")


@dataclass(slots=True, eq=False)
class Write:
    """One queued save, as the backend keeps it: each value in store.codec's compact form (bytes,
    never the handler's dicts), encoded once the answer is on its way (`deferred`, `encode`)."""

    response_id: str
    keys: list[str]
    done: asyncio.Event = field(default_factory=asyncio.Event)
    _values: tuple[dict[str, Any], list[Item], bytes | None, Sequence[codec.LogprobList]] | None = None
    _columns: tuple[tuple[bytes, codec.Parts | None], ...] | None = None  # read from the values, not deflated
    _encoded: tuple[bytes, bytes, bytes | None] | None = None

    @classmethod
    def deferred(cls, response: dict[str, Any], input_items: list[Item], events: bytes | None,
                 lists: Sequence[codec.LogprobList] = ()) -> Write:
        """The save, to be encoded by `encode` (WriteBehind.save schedules it right after the caller's
        turn of the loop: after the answer is written, so the ~0.17 ms of a 100-token k=5 Response is not
        in the client's latency, while the queue still holds the compact form within a loop iteration, not
        the JSON of every save a burst queues; a long one, LONG_RESPONSE_TOKENS or more, is encoded at once)."""
        return cls(response["id"], item_keys(response, input_items), _values=(response, input_items, events, lists))

    @classmethod
    def encoding(cls, response: dict[str, Any], input_items: list[Item], events: bytes | None,
                 lists: Sequence[codec.LogprobList] = ()) -> Write:
        """The save encoded now."""
        write = cls.deferred(response, input_items, events, lists)
        write.packed()
        return write

    def encode(self) -> None:
        """Read the handler's dicts into the codec's columns (on the event loop); deflating them is left to
        `packed()`, which the SQLite writer thread calls (zlib lets the loop run meanwhile)."""
        if self._values is not None:
            response, input_items, events, lists = self._values
            self._columns = (codec.columns_of(response, lists=lists), codec.columns_of(input_items),
                             *(() if events is None else (codec.columns_of(events),)))
            self._values = None  # the handler's dicts go

    def packed(self) -> tuple[bytes, bytes, bytes | None]:
        """The compact form (deflated now if it was not yet; any thread, once `encode` has run)."""
        encoded = self._encoded
        if encoded is None:
            self.encode()
            columns = self._columns
            if columns is None:  # packed meanwhile by the other thread (the writer's, or the loop's read)
                encoded = self._encoded
                assert encoded is not None
                return encoded
            response, items, *events = (codec.pack(raw, parts) for raw, parts in columns)
            encoded = self._encoded = (response, items, events[0] if events else None)
            # The columns go once packed (set after _encoded: a thread that finds no columns finds that): a
            # queued 1,000-token k=5 save kept ~75 KB of them beside its ~45 KB compact form until committed.
            self._columns = None
        return encoded

    @property
    def response(self) -> bytes:
        return self.packed()[0]

    @property
    def input_items(self) -> bytes:
        return self.packed()[1]

    @property
    def events(self) -> bytes | None:
        return self.packed()[2]

    @property
    def size(self) -> int:
        """Bytes held: the compact form, or the columns waiting to be deflated."""
        if self._encoded is not None:
            return sum(len(part) for part in self._encoded if part is not None)
        return sum(len(raw) if parts is None else sum(len(p) for p in parts[:-1])  # type: ignore[misc]
                   for raw, parts in self._columns or ())


class BatchBackend(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def write_batch(self, writes: list[Write]) -> None:
        """Keep every write (in order: a later write of the same id replaces an earlier one), all or none."""

    async def get(self, response_id: str) -> dict[str, Any] | None: ...

    async def input_items(self, response_id: str) -> list[Item] | None: ...

    async def events(self, response_id: str) -> list[dict[str, Any]] | None: ...

    async def delete(self, response_id: str) -> bool: ...

    async def item_owner(self, item_key: str) -> str | None: ...


class StoreCounters(Protocol):
    def written(self, count: int) -> None: ...

    def failed(self, count: int) -> None: ...

    def queued(self, depth: int) -> None: ...


class _NoCounters:
    def written(self, count: int) -> None:
        pass

    def failed(self, count: int) -> None:
        pass

    def queued(self, depth: int) -> None:
        pass


# A Response whose logprobs list has at least this many tokens is encoded as it is saved, not after the
# saving handler's turn of the loop (WriteBehind.save).
LONG_RESPONSE_TOKENS = 256


def is_long(lists: Sequence[codec.LogprobList]) -> bool:
    """Whether a save's logprob lists make it a long answer (LONG_RESPONSE_TOKENS or more): encoded at once."""
    return any(len(batch) >= LONG_RESPONSE_TOKENS for _, batch, _ in lists)


def _is_recent(key: str, horizon: float) -> bool:
    created = id_created_at(key.rpartition("/")[2])
    return created is not None and time.time() - horizon <= created <= time.time() + 60  # 60 s of clock skew


class WriteBehind:
    """A ResponseStore over a `BatchBackend`: saves queued and group-committed, reads that see them."""

    def __init__(self, backend: BatchBackend, *, queue_size: int = 1024, batch_size: int = 256,
                 read_wait: float = 2.0, horizon: float = 3600.0, counters: StoreCounters | None = None,
                 linger: float = 0.02) -> None:
        self.backend = backend
        self.queue_size = queue_size
        self.batch_size = batch_size
        self.read_wait = read_wait
        self.horizon = horizon
        self.linger = linger
        self.counters: StoreCounters = counters or _NoCounters()
        self._queue: deque[Write] = deque()
        self._pending: dict[str, Write] = {}  # the newest queued or in-flight write of each id
        self._pending_items: dict[str, str] = {}  # item key -> response id, for the pending writes
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    # --- life cycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        await self.backend.open()
        self._closing = False
        self._task = asyncio.create_task(self._writer(), name="response-store writer")

    async def close(self) -> None:
        """Write everything queued, then close the backend."""
        if self._task is None:
            return
        self._closing = True
        self._wake.set()
        await self._task
        self._task = None
        await self.backend.close()

    async def flush(self) -> None:
        """Wait until every save queued so far is written (or has failed)."""
        writes = list(self._pending.values())
        for write in writes:
            await write.done.wait()

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        """What the saves not yet written hold, in bytes (their compact form)."""
        return sum(write.size for write in self._pending.values())

    # --- saving ---------------------------------------------------------------------------------

    def has_room(self) -> bool:
        """Whether a save now would be queued without waiting (the queue is not full)."""
        return len(self._queue) < self.queue_size

    async def save(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
                   durable: bool = False, lists: Sequence[codec.LogprobList] = ()) -> None:
        if self._task is None or self._closing:
            raise RuntimeError("the response store is closed")
        while len(self._queue) >= self.queue_size:  # backpressure: wait for the writer to make room
            self._room.clear()
            await self._room.wait()
        write = self.queue(response, input_items, events, lists=lists)
        if durable:
            await write.done.wait()

    def queue(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
              lists: Sequence[codec.LogprobList] = ()) -> Write:
        """Queue the save now, room or not: for a caller that checked `has_room` just before (the server,
        once its answer is written: at most the saves of the answers finished in one turn of the loop go
        past `queue_size`). `save` is the one that waits for room."""
        if self._task is None or self._closing:
            raise RuntimeError("the response store is closed")
        write = Write.deferred(response, input_items, events, lists)
        if is_long(lists):
            # A long answer is encoded now: a 1,000-token stream's save encoded after this turn, while its
            # closing frames go out, left 256 such streams peaking ~50 MB higher (bench.memory: 238-262
            # against 200-205 MB), and ~0.4 ms is little beside the time it took to generate.
            write.packed()
        else:  # after this turn of the loop (the answer written first): see Write.deferred
            asyncio.get_running_loop().call_soon(write.encode)
        self._queue.append(write)
        self._pending[write.response_id] = write
        for key in write.keys:
            self._pending_items[key] = write.response_id
        self.counters.queued(len(self._queue))
        self._wake.set()
        return write

    async def _writer(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.linger > 0 and len(self._queue) < self.batch_size and not self._closing:
                # A save that finds the writer idle waits a moment for the saves of the requests in
                # flight beside it: one commit (and one thread hop) for them all, not one each. 20 ms, not
                # 5: each batch costs a wake of the writer thread, its GIL hand-offs and the commit's shared
                # pages; at one request at a time (~3 saves a batch at 5 ms, ~13 at 20) the writer thread's
                # CPU fell from 0.18-0.26 to 0.16-0.18 ms a request and the event loop was preempted half
                # as often (per-thread CPU, three interleaved runs). A read on another process waits that
                # much longer at most; the same process reads the queue.
                await asyncio.sleep(self.linger)
            batch = [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
            for write in batch:
                write.encode()  # on the loop: the backend may deflate in its own thread, never read the dicts
            self._room.set()
            self.counters.queued(len(self._queue))
            try:
                await self._write(batch)
            finally:
                self._settle(batch)

    async def _write(self, batch: list[Write]) -> None:
        try:
            await self.backend.write_batch(batch)
            self.counters.written(len(batch))
            return
        except Exception:
            if len(batch) == 1:
                self._failed(batch[0])
                return
            log.warning("a batch of %d responses failed to store; retrying them one by one", len(batch),
                        exc_info=True)
        for index, write in enumerate(batch):
            try:
                await self.backend.write_batch([write])
                self.counters.written(1)
            except Exception:
                self._failed(write)
                if index == 0:  # the store itself is failing (down, locked), not one save: no retry each
                    for rest in batch[1:]:
                        self._failed(rest)
                    return

    def _failed(self, write: Write) -> None:
        log.error("could not store response %s", write.response_id.rpartition("/")[2], exc_info=True)
        self.counters.failed(1)

    def _settle(self, batch: list[Write]) -> None:
        for write in batch:
            if self._pending.get(write.response_id) is write:
                del self._pending[write.response_id]
                for key in write.keys:
                    if self._pending_items.get(key) == write.response_id:
                        del self._pending_items[key]
            write.done.set()

    # --- reading (pending writes first) -------------------------------------------------------------

    async def _waiting(self, key: str, read: Callable[[], Awaitable[Any]]) -> Any:
        """`read()`, and while it finds nothing for a recent id, again until `read_wait` has passed."""
        found = await read()
        if found is not None or self.read_wait <= 0 or not _is_recent(key, self.horizon):
            return found
        deadline = time.monotonic() + self.read_wait
        pause = 0.002
        while found is None and time.monotonic() < deadline:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
            found = await read()
        return found

    async def get(self, response_id: str) -> dict[str, Any] | None:
        write = self._pending.get(response_id)
        if write is not None:
            return codec.decode(write.response)
        return await self._waiting(response_id, lambda: self._get_committed(response_id))

    async def _get_committed(self, response_id: str) -> dict[str, Any] | None:
        # A save queued while the backend was read is newer than what the backend had.
        found = await self.backend.get(response_id)
        write = self._pending.get(response_id)
        return codec.decode(write.response) if write is not None else found

    async def input_items(self, response_id: str) -> list[Item] | None:
        write = self._pending.get(response_id)
        if write is not None:
            return codec.decode(write.input_items)
        return await self._waiting(response_id, lambda: self.backend.input_items(response_id))

    async def events(self, response_id: str) -> list[dict[str, Any]] | None:
        write = self._pending.get(response_id)
        if write is not None:
            return None if write.events is None else codec.decode(write.events)
        return await self.backend.events(response_id)  # asked only of a Response found already

    async def item_owner(self, item_key: str) -> str | None:
        owner = self._pending_items.get(item_key)
        if owner is not None:
            return owner
        return await self._waiting(item_key, lambda: self._owner_committed(item_key))

    async def _owner_committed(self, item_key: str) -> str | None:
        found = await self.backend.item_owner(item_key)
        return self._pending_items.get(item_key, found)

    async def delete(self, response_id: str) -> bool:
        write = self._pending.get(response_id)
        if write is not None:
            await write.done.wait()  # then delete what was committed
        return await self.backend.delete(response_id)
