"""Reading an HTTP body whole, up to a limit.

aiohttp's `StreamReader.read(n)` returns what is buffered when it is called (often 64 KiB), not n bytes: a body
read with one call is a prefix of the body whenever the sender is slower than the reader. A coordinator that
hashed such a prefix refused honest uploads of 256 KB as `signer_mismatch`, and a validator that downloaded one
judged an honest file by a prefix of it and slashed its worker for a hash mismatch. Every body is read here.
"""

from __future__ import annotations

import aiohttp


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
