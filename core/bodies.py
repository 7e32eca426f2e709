"""Reading an HTTP body whole, up to a limit.

aiohttp's `StreamReader.read(n)` returns what is buffered when it is called (often 64 KiB), not n bytes: a body
read with one call is a prefix of the body whenever the sender is slower than the reader. A coordinator that
hashed such a prefix refused honest uploads of 256 KB as `signer_mismatch`, and a validator that downloaded one
judged an honest file by a prefix of it and slashed its worker for a hash mismatch. Every body is read here.
"""

from __future__ import annotations

import asyncio

import aiohttp

from core.heap import release_free_memory


async def read_body(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """The whole body when it is at most `limit` bytes, else its first `limit + 1` bytes (the caller refuses it).

    Reads until the end of the stream, never holding more than `limit + 1` bytes of a longer one.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        part = await stream.read(limit + 1 - size)
        if not part:  # the end of the body
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


class HeapTrim:
    """Hands freed heap memory back to the system soon after large bodies are dropped, at most once per `every` s.

    A body is read in pieces of up to 64 KiB, under glibc's mmap threshold: they land in malloc's arenas, and once
    freed glibc keeps the pages for reuse. After ten 60 MiB bodies the coordinator held 600 MB it no longer used
    (issue 32, attack 3). `core.heap.release_free_memory` returns the free pages of every arena (a no-op elsewhere
    than glibc).
    """

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self._scheduled = False

    def soon(self) -> None:
        """Trims once, `every` seconds from now, whatever else asks before then (call it on the event loop)."""
        if self._scheduled:
            return
        self._scheduled = True
        asyncio.get_running_loop().call_later(self.every, self._run)

    def _run(self) -> None:
        self._scheduled = False
        release_free_memory()
