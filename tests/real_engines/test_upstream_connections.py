"""Streams one after another share one connection to the real vLLM: the gateway reads each stream's body
to its end after `data: [DONE]` (at once when the ending came with it, else `app._read_to_end` after the
client's answer), so the connection goes back to the pool instead of every stream connecting anew.
Counted at the TCP level: a forwarding proxy between the gateway and the server counts the connections
the gateway opens; the bytes pass through unchanged.

Before the ending was read after the client's answer, this held already: vLLM's ending arrived before the
gateway let the connection go (measured, same test). It fails if the gateway stops returning finished
streams' connections to the pool. llama-server is not asked: it closes its connection after every
streamed answer (4 connections for 4 streams through the same proxy, with or without the gateway; curl
finds the connection closed when it tries a second streamed request on it)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from urllib.parse import urlsplit

from tests.e2e import LOGPROBS, stream_response
from tests.real_engines.stack import start_gateway


class _CountingProxy:
    """127.0.0.1:<port> -> the server, byte for byte; `connections` counts the ones accepted."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            with contextlib.suppress(ConnectionError, OSError):
                sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_streams_one_after_another_share_one_connection_to_vllm(aiohttp_server, real_vllm):
    served = real_vllm
    proxy = _CountingProxy(served.base_url)
    through_proxy = dataclasses.replace(served, base_url=await proxy.start())
    try:
        stack = await start_gateway(aiohttp_server, through_proxy, record=False,
                                    upstream_options={"health_interval": 0})
        for count in range(4):
            response, _ = await stream_response(stack, input=f"Count to {count + 3}.", temperature=0,
                                                max_output_tokens=8, top_logprobs=2, include=LOGPROBS)
            assert response.output[0].content[0].logprobs
            await asyncio.sleep(0.1)  # (the body's end is read after the client's answer)
        assert proxy.connections == 1
    finally:
        proxy.close()
