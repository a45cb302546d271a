"""Reading an upstream's whole (non-streamed) body with a bound on its size: an upstream that keeps
sending (a wrong URL, a broken proxy, a compressed body that inflates without end) would otherwise
grow the gateway's memory, which every client shares, until the total timeout."""

from __future__ import annotations

import aiohttp

# An upstream's error answer is a short JSON object (vLLM's, TGI's, llama.cpp's: well under 1 KB);
# past this its text is of no use to the client and is not read.
MAX_ERROR_BODY_BYTES = 1024 * 1024


class UpstreamBodyTooLarge(Exception):
    """The body went past the bound before it ended; the connection is closed, not reused."""

    def __init__(self, limit: int, declared: int | None) -> None:
        said = f" (its Content-Length says {declared})" if declared is not None else ""
        super().__init__(f"its body is larger than {limit} bytes{said}")


async def read_whole(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or UpstreamBodyTooLarge as soon as more than `limit` bytes have arrived."""
    declared = response.content_length
    if declared is not None and not response.headers.get("Content-Encoding"):
        if declared > limit:  # said before a byte of it is read
            response.close()
            raise UpstreamBodyTooLarge(limit, declared)
        return await response.read()  # aiohttp reads no more than Content-Length
    # Chunked or compressed: count what aiohttp hands over (already inflated) as it arrives.
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            response.close()
            raise UpstreamBodyTooLarge(limit, None)
        chunks.append(chunk)
    return b"".join(chunks)
