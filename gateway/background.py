"""Background responses (`background: true`): run to the end whatever the client does, keep the events.

The request is answered at once (`queued`); a task runs the ordinary stream loop with an `EventLog`
as its sink, so a background response has exactly the events a streamed one has. Its followers (the
creating request when it also asked `stream`, and `GET /v1/responses/{id}?stream=true&starting_after=N`)
read the log from any sequence number and then wait for live events; a follower leaving changes
nothing for the run. The final Response is saved with the whole log (a JSON array) before any
follower sees the terminal event, so polling, replay and `previous_response_id` all work at once.

What holds where: the run and its live log live in the gateway process that started it. The store
(shared Redis, or one SQLite file on one host) has the `queued` Response from the start, the
`in_progress` one once the upstream answers, and the final Response with its events at the end, so
any replica over that store can poll it and replay a finished one. Following live events and
cancelling work only on the process running it: elsewhere cancel answers 409, and a stream of it
waits for the stored events and then replays them (stored_routes.retrieve_response). A process
killed mid-run leaves the stored Response `queued` or `in_progress`; a graceful shutdown fails the
runs it stops and saves them so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.sse import encode_events, frame_json
from gateway.translate.stream import ResponsesStream

log = logging.getLogger("responses_gateway.background")

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
ACTIVE_STATUSES = frozenset({"queued", "in_progress"})

# Saves the final Response (any status) with its events; it reports its own failures.
Save = Callable[[dict[str, Any], bytes | None], Awaitable[None]]


class EventLog:
    """A background response's events in sequence order (event i has `sequence_number` i), kept as the
    SSE frames a follower is sent, and the stream loop's sink. Followers wake on each append."""

    def __init__(self, save: Save, on_begin: Callable[[], Awaitable[None]] | None = None) -> None:
        self.events: list[bytes] = []  # one SSE frame per event: `event: <type>\ndata: <json>\n\n`
        self.begun = False
        self.ending = False  # the terminal events exist; the save before they are published is under way
        self.done = False
        self.final: dict[str, Any] | None = None
        self._save = save
        self._wake = asyncio.Event()
        self.on_begin = on_begin  # saves the `in_progress` Response once the upstream answered (other processes poll)

    def _publish(self, frames: list[bytes]) -> None:
        self.events += frames
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def blob(self, more: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
        """The events as one JSON array (for the store)."""
        return b"[" + b",".join([frame_json(frame) for frame in (*self.events, *more)]) + b"]"

    # --- the sink ---------------------------------------------------------------------------------

    async def begin(self, items: list[dict[str, Any]]) -> None:
        self.begun = True
        self._publish(_frames(items))
        if self.on_begin is not None:
            await self.on_begin()

    async def send(self, items: list[dict[str, Any] | bytes]) -> None:
        self._publish(_frames(items))

    async def end(self, items: list[dict[str, Any] | bytes], failed: bool) -> None:
        self.ending = True
        frames = _frames(items)
        last = items[-1] if items else None
        if isinstance(last, dict) and last.get("type") in TERMINAL_EVENTS:
            final = orjson.loads(frame_json(frames[-1]))["response"]  # what followers will read, not the live dicts
            await self._save(final, self.blob(frames))
            self.final = final
        self._publish(frames)
        self.close()

    def close(self) -> None:
        self.done = True
        self._publish([])

    # --- followers --------------------------------------------------------------------------------

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """SSE frames of the events after sequence number `after`, then live ones until the end."""
        index = max(after + 1, 0)
        while True:
            if index < len(self.events):
                batch = self.events[index:]
                index += len(batch)
                yield b"".join(batch)
                continue
            if self.done:
                return
            await self._wake.wait()


def sse_frames(events: list[dict[str, Any]]) -> bytes:
    return encode_events(events)


def _frames(items: list[dict[str, Any] | bytes]) -> list[bytes]:
    return [item if type(item) is bytes else encode_events((item,)) for item in items]


@dataclass(slots=True)
class BackgroundRun:
    key: str  # the response id as the caller's store view files it
    stream: ResponsesStream
    log: EventLog
    task: asyncio.Task[None] | None = None
    stopping: bool = False  # the gateway is shutting down: the run fails rather than being cancelled

    def current(self) -> dict[str, Any]:
        """The Response as a poll sees it now."""
        if self.log.final is not None:
            return self.log.final
        return self.stream.snapshot("in_progress" if self.log.begun else "queued")


@dataclass
class BackgroundRuns:
    """The runs this process is executing, by scoped id; at most `limit` at once."""

    limit: int
    # How long a stream of a run on another process waits for its stored events: a run longer than its
    # upstream's `total` timeout has died with its process.
    elsewhere_wait_seconds: float = 630.0
    runs: dict[str, BackgroundRun] = field(default_factory=dict)

    def get(self, key: str) -> BackgroundRun | None:
        return self.runs.get(key)

    def admit(self) -> None:
        if self.limit <= 0:
            raise GatewayError(400, "Background responses are turned off on this gateway (limits.background_responses"
                                    " is 0).", param="background", code="unsupported_parameter")
        if len(self.runs) >= self.limit:
            raise GatewayError(429, f"Too many background responses are running ({self.limit}, the configured "
                                    "limits.background_responses); retry later.", type_="requests",
                               code="rate_limit_exceeded")

    def start(self, key: str, stream: ResponsesStream, serve: Callable[[EventLog], Awaitable[Any]],
              save: Save) -> BackgroundRun:
        self.admit()
        run = BackgroundRun(key, stream, EventLog(save, lambda: save(stream.snapshot("in_progress"), None)))
        self.runs[key] = run
        run.task = asyncio.create_task(self._run(run, serve, save), name=f"background {stream.response_id}")
        return run

    async def _run(self, run: BackgroundRun, serve: Callable[[EventLog], Awaitable[Any]], save: Save) -> None:
        stream, event_log = run.stream, run.log
        try:
            await serve(event_log)
        except asyncio.CancelledError:
            if run.stopping:
                await self._fail(run, "The gateway shut down before this response finished.", "server_error")
            else:
                final = stream.snapshot("cancelled")
                await save(final, event_log.blob())
                event_log.final = final
                event_log.close()
        except GatewayError as exc:  # before the stream began: no replica, the upstream refused, ...
            # A Response's error.code is one of a fixed set (the SDK's ResponseError): the message says which.
            await self._fail(run, exc.message, "server_error")
        except Exception:
            log.exception("background response %s failed", stream.response_id)
            await self._fail(run, "The gateway failed while running this response.", "server_error")
        finally:
            self.runs.pop(run.key, None)
            # The creating request's access line was written when it answered; this one says how it ended.
            log.info(orjson.dumps({"event": "background_response_ended", "id": stream.response_id,
                                   "status": run.current()["status"], "events": len(event_log.events)}).decode())

    @staticmethod
    async def _fail(run: BackgroundRun, message: str, code: str) -> None:
        if run.log.done:
            return
        events = [] if run.log.begun else run.stream.start()
        await run.log.end(events + run.stream.fail(message, code), True)

    async def cancel(self, run: BackgroundRun) -> dict[str, Any]:
        """Stop the run (its upstream request is dropped) and return its final Response. A run whose
        terminal events exist already finishes as it was (cancelling then changes nothing)."""
        assert run.task is not None
        if not run.log.ending:
            run.task.cancel()
        await asyncio.wait([run.task])
        return run.current()

    async def stop_all(self) -> None:
        """At shutdown: every run still going fails (and is saved so)."""
        runs = list(self.runs.values())
        for run in runs:
            run.stopping = True
            if run.task is not None and not run.log.ending:
                run.task.cancel()
        tasks = [run.task for run in runs if run.task is not None]
        if tasks:
            await asyncio.wait(tasks)
