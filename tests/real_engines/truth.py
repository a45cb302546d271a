"""The truth about what a real vLLM generated, from its own token ids.

`Recorder` is a transparent HTTP relay between the gateway and the real server: it forwards every
request and answer byte for byte (streams chunk by chunk) and keeps each exchange, so a test reads
what vLLM itself sent for exactly the request the gateway made. With a tokenizer configured the
gateway asks vLLM for `return_tokens_as_token_ids`, so the recorded wire names every token by id;
`TokenTable` turns ids into bytes with the `tokenizers` library (not the gateway's vocabulary code).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from tokenizers import Tokenizer

_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "host"}


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable stand-in of each byte, inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stand_ins = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in stand_ins:
            stand_ins[b] = chr(256 + extra)
            extra += 1
    return {char: b for b, char in stand_ins.items()}


class TokenTable:
    """Token id -> bytes and whether it is a control (added special) token, from tokenizer.json."""

    def __init__(self, tokenizer_json: Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self._decoder = _gpt2_byte_decoder()
        self.special = {i for i, t in self._tokenizer.get_added_tokens_decoder().items() if t.special}

    def bytes(self, token_id: int) -> bytes:
        piece = self._tokenizer.id_to_token(token_id)
        assert piece is not None, token_id
        if token_id in self.special:
            return piece.encode()
        return bytes(self._decoder[c] for c in piece)


def token_id(spelling: str) -> int:
    assert spelling.startswith("token_id:"), spelling
    return int(spelling.removeprefix("token_id:"))


@dataclass
class TrueToken:
    id: int
    data: bytes
    logprob: float
    top: list[tuple[int, bytes, float]]  # as vLLM listed them


@dataclass
class Truth:
    """One vLLM answer: its text, finish reason and tokens (by id), from the recorded wire."""

    text: str
    finish_reason: str | None
    tokens: list[TrueToken]
    special: set[int] = field(default_factory=set)

    @property
    def visible(self) -> list[TrueToken]:
        """The tokens that spell the text (control tokens such as <|im_end|> left out)."""
        return [t for t in self.tokens if t.id not in self.special]

    @property
    def joined(self) -> bytes:
        return b"".join(t.data for t in self.visible)

    def top_k(self, position: int, k: int) -> list[tuple[bytes, float]]:
        """The true top k at a visible position, sorted by logprob (then bytes, for ties)."""
        top = sorted(((data, lp) for _, data, lp in self.visible[position].top), key=lambda c: (-c[1], c[0]))
        return top[:k]


@dataclass
class Exchange:
    path: str
    request: dict[str, Any]
    status: int = 0
    body: bytes = b""
    reads: list[bytes] = field(default_factory=list)  # the body as the relay's network reads brought it
    headers: dict[str, str] = field(default_factory=dict)
    started: asyncio.Event = field(default_factory=asyncio.Event)  # the server's status and headers came
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set once the server's answer has ended
    truth_tokens: list[TrueToken] = field(default_factory=list)  # a test's note: what truth() read

    @property
    def streamed(self) -> bool:
        return bool(self.request.get("stream"))

    def json_frames(self) -> list[dict[str, Any]]:
        """The answer's JSON: one object, or every `data:` frame of a stream (without [DONE])."""
        if not self.streamed:
            return [json.loads(self.body)]
        frames = []
        for line in self.body.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                frames.append(json.loads(line[6:]))
        return frames

    def truth(self, table: TokenTable) -> Truth:
        """What vLLM generated (choice 0), its tokens by id; needs `return_tokens_as_token_ids`."""
        assert self.request.get("return_tokens_as_token_ids"), "the gateway did not ask for token ids"
        text, finish, tokens = [], None, []
        for frame in self.json_frames():
            if not frame.get("choices"):
                continue
            choice = frame["choices"][0]
            finish = choice.get("finish_reason") or finish
            if self.path.endswith("/chat/completions"):
                text.append((choice.get("delta") or choice.get("message") or {}).get("content") or "")
                for entry in (choice.get("logprobs") or {}).get("content") or []:
                    top = [(token_id(t["token"]), t["logprob"]) for t in entry["top_logprobs"]]
                    tokens.append(self._token(table, token_id(entry["token"]), entry["logprob"], top))
            else:
                text.append(choice.get("text") or "")
                logprobs = choice.get("logprobs") or {}
                for i, spelling in enumerate(logprobs.get("tokens") or []):
                    tops = logprobs.get("top_logprobs") or []
                    top = [(token_id(s), lp) for s, lp in (tops[i] or {}).items()] if i < len(tops) else []
                    tokens.append(self._token(table, token_id(spelling), logprobs["token_logprobs"][i], top))
        return Truth("".join(text), finish, tokens, table.special)

    @staticmethod
    def _token(table: TokenTable, tid: int, logprob: float, top: list[tuple[int, float]]) -> TrueToken:
        return TrueToken(tid, table.bytes(tid), logprob, [(i, table.bytes(i), lp) for i, lp in top])


class Recorder:
    """A relay to `target` that keeps every exchange (`exchanges`, newest last)."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        # What a test may add to the gateway's generation requests on their way (the server's answer to
        # them is still its own): e.g. a logit_bias no front door offers, to make vLLM stop sooner.
        self.add_to_requests: dict[str, Any] = {}
        self.exchanges: list[Exchange] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._relay)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()

    def generations(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.endswith("completions")]

    async def last(self) -> Exchange:
        """The newest generation request, once its answer has ended (the gateway may have finished its
        own answer a moment before the relay has seen the end of the server's)."""
        found = self.generations()
        assert found, "the gateway sent the upstream no generation request"
        await asyncio.wait_for(found[-1].done.wait(), 30)
        return found[-1]

    async def _read(self, exchange: Exchange, method: str, path: str, body: bytes, headers: dict[str, str],
                    chunks: asyncio.Queue[bytes | None]) -> None:
        assert self._session is not None
        kept = bytearray()
        try:
            async with self._session.request(method, self.target + path, data=body, headers=headers) as upstream:
                exchange.status = upstream.status
                exchange.headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
                exchange.started.set()
                async for chunk in upstream.content.iter_any():
                    kept += chunk
                    exchange.reads.append(chunk)
                    chunks.put_nowait(chunk)
        finally:
            exchange.body = bytes(kept)
            exchange.status = exchange.status or 502
            exchange.started.set()
            exchange.done.set()
            chunks.put_nowait(None)

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        body = await request.read()
        exchange = Exchange(request.path, json.loads(body) if request.method == "POST" and body else {})
        if exchange.request:
            self.exchanges.append(exchange)
            if self.add_to_requests and request.path.endswith("completions"):
                exchange.request.update(self.add_to_requests)
                body = json.dumps(exchange.request).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        answer = web.StreamResponse()
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        # The server's answer is read to its end by a task of its own: if the gateway hangs up (its handler
        # here is then cancelled), the exchange still holds everything the server sent.
        reading = asyncio.create_task(self._read(exchange, request.method, request.path_qs, body, headers, chunks))
        self._tasks.add(reading)
        reading.add_done_callback(self._tasks.discard)
        await asyncio.shield(exchange.started.wait())
        answer.set_status(exchange.status)
        answer.headers.update(exchange.headers)
        await answer.prepare(request)
        while (chunk := await chunks.get()) is not None:
            await answer.write(chunk)
        await answer.write_eof()
        return answer
