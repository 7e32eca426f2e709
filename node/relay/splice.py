"""Zero-copy shard transfer on Linux: the socket's bytes go to the checkpoint file by splice(2).

Receiving through aiohttp copies every byte from the kernel into Python objects, and writing them copies them
back; with the hash, each receiving process touches each byte three times. Here the body moves socket → pipe
→ file inside the kernel, and the hash reads the freshly written pages through a read-only mmap of the file,
so the only pass over the bytes in user space is the sha256 itself.

This is a deliberately small HTTP/1.1 client for exactly one request shape: `GET` of a shard, answered with
a `Content-Length` body (what `ShardServer` sends). Anything else (chunked bodies, TLS, another platform)
raises `Unsupported`, and the caller uses the aiohttp path instead. Connections are kept alive and reused
per source. Every wait has a timeout; a peer that sends more than it announced, or stops early, is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from multidict import CIMultiDict

from node.relay import RelayError

PIPE_SIZE = 1024 * 1024
RCVLOWAT = 256 * 1024  # bytes buffered in the socket before it reads as ready during a body
MAX_HEADER_BYTES = 16 * 1024
MAX_ERROR_BODY = 64 * 1024
AVAILABLE = sys.platform == "linux" and hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")

Absorb = Callable[[int, int], Awaitable[None]]  # (offset within the body, length): bytes now in the file


class Unsupported(RelayError):
    """This transfer cannot use splice (scheme, platform or response shape); use the general path."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: CIMultiDict[str]  # names match in any case, as in aiohttp
    length: int


class ConnectionPool:
    """Idle keep-alive connections per (host, port), for one event loop."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._pipe: tuple[int, int] | None = None

    def close(self) -> None:
        """Close idle connections and the pipe; the pool can be used again afterwards."""
        for sockets in self._idle.values():
            for sock in sockets:
                sock.close()
        self._idle.clear()
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    async def _connect(self, host: str, port: int) -> socket.socket:
        idle = self._idle.get((host, port))
        if idle:
            return idle.pop()
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout=5.0)
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    async def _readable(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(sock.fileno(), wake)
        try:
            await asyncio.wait_for(ready, timeout=self.timeout)
        finally:
            loop.remove_reader(sock.fileno())

    async def _read_head(self, sock: socket.socket) -> tuple[Reply, bytes]:
        """The status line and headers, and any body bytes that arrived with them."""
        loop = asyncio.get_running_loop()
        data = b""
        while b"\r\n\r\n" not in data:
            if len(data) > MAX_HEADER_BYTES:
                raise ConnectionError(f"response headers over {MAX_HEADER_BYTES} bytes")
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), timeout=self.timeout)
            if not chunk:
                raise ConnectionError("connection closed before the response headers")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ConnectionError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ConnectionError(f"malformed header line {line[:80]!r}")
            headers[name.strip()] = value.strip()
        if "chunked" in headers.get("Transfer-Encoding", "").lower():
            raise Unsupported("a chunked response")
        length_text = headers.get("Content-Length", "")
        if not length_text.isdigit():
            raise Unsupported("a response without Content-Length")
        return Reply(int(parts[1]), headers, int(length_text)), rest

    def _pipe_fds(self) -> tuple[int, int]:
        if self._pipe is None:
            read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            self._pipe = (read_end, write_end)
        return self._pipe

    async def get(self, url: str, headers: dict[str, str]) -> Response:
        """Send a GET and read the response head; the caller then takes the body with `Response`'s methods."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not AVAILABLE:
            raise Unsupported(f"{parts.scheme} on {sys.platform}")
        host, port = parts.hostname or "", parts.port or 80
        sock = await self._connect(host, port)
        try:
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            request = f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n{extra}\r\n".encode("latin-1")
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.sock_sendall(sock, request), timeout=self.timeout)
            reply, early = await self._read_head(sock)
        except BaseException:
            sock.close()
            raise
        return Response(self, (host, port), sock, reply, early)

    def _release(self, key: tuple[str, int], sock: socket.socket, reusable: bool) -> None:
        if reusable:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            self._idle.setdefault(key, []).append(sock)
        else:
            sock.close()


class Response:
    """A response whose head is read; exactly one of `discard` or `splice_into` takes its body."""

    def __init__(self, pool: ConnectionPool, key: tuple[str, int], sock: socket.socket, reply: Reply, early: bytes):
        self.pool, self.key, self.sock, self.reply, self.early = pool, key, sock, reply, early
        self.status, self.headers, self.length = reply.status, reply.headers, reply.length
        self._stray = False
        self._released = False

    def _keep_alive(self) -> bool:
        return self.headers.get("Connection", "").lower() != "close"

    def _release(self, reusable: bool) -> None:
        """Hand the connection back once: a socket closed after it went back to the pool would be handed out again
        closed (a 429 was discarded, then closed by the caller's status check, and every later request through the
        pool failed with EBADF)."""
        if not self._released:
            self._released = True
            self.pool._release(self.key, self.sock, reusable)

    def close(self) -> None:
        """Drop the connection without reading the body (idempotent; nothing after `discard` or `splice_into`)."""
        self._release(False)

    async def discard(self) -> None:
        """Read and drop a small body (an error message), keeping the connection if it ends cleanly."""
        reusable = False
        try:
            if self.length > MAX_ERROR_BODY:
                return
            loop = asyncio.get_running_loop()
            body = self.early
            while len(body) < self.length:
                more = await asyncio.wait_for(loop.sock_recv(self.sock, self.length - len(body)), self.pool.timeout)
                if not more:
                    return
                body += more
            reusable = len(body) == self.length and self._keep_alive()
        finally:
            self._release(reusable)

    async def splice_into(self, fd: int, file_offset: int, absorb: Absorb, every: int) -> None:
        """Move the body into `fd` at `file_offset`; `absorb(offset, n)` is called in order for every `every` bytes
        and for the remainder, each once the previous one has returned, while the next bytes are being read (the
        hash of one piece overlaps the receipt of the next); all have returned when this does, also on an error.
        A short or overlong body raises `ConnectionError`."""
        reusable = False
        try:
            if len(self.early) > self.length:
                raise ConnectionError("more bytes than Content-Length")
            await self._body(fd, file_offset, absorb, every)
            reusable = self._keep_alive() and not self._stray
        finally:
            self._release(reusable)

    async def _body(self, fd: int, file_offset: int, absorb: Absorb, every: int) -> None:
        sock, length, early = self.sock, self.length, self.early
        done = absorbed = 0
        while done < len(early):  # body bytes that came with the headers: a plain write
            done += os.pwrite(fd, early[done:], file_offset + done)
        read_end, write_end = self.pool._pipe_fds()
        lowat = 1
        running: asyncio.Future[None] | None = None  # the absorb of the previous piece

        async def hand_over(offset: int, n: int) -> None:
            nonlocal running
            if running is not None:
                await running
            running = asyncio.ensure_future(absorb(offset, n))

        try:
            while done < length:
                try:
                    moved = os.splice(
                        sock.fileno(),
                        write_end,
                        min(PIPE_SIZE, length - done),
                        flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK,
                    )
                except BlockingIOError:
                    # wake only once a worthwhile amount is buffered (or the peer closed): fewer, larger splices
                    want = min(RCVLOWAT, length - done)
                    if want != lowat:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                        lowat = want
                    await self.pool._readable(sock)
                    continue
                if moved == 0:
                    raise ConnectionError(f"connection closed after {done} of {length} body bytes")
                drained = 0  # the pipe is emptied before the next await, so concurrent transfers can share it
                while drained < moved:
                    drained += os.splice(read_end, fd, moved - drained, offset_dst=file_offset + done + drained)
                done += moved
                if done - absorbed >= every:
                    await hand_over(absorbed, done - absorbed)
                    absorbed = done
        except (OSError, TimeoutError):
            if done > absorbed:  # keep the prefix that arrived: the next source is asked only for the rest
                await hand_over(absorbed, done - absorbed)
            if running is not None:
                await running
            raise
        except BaseException:  # cancelled: the piece being absorbed still ends before the file is let go
            if running is not None:
                with contextlib.suppress(Exception):  # the cancellation is what this answers
                    await asyncio.shield(running)
            raise
        if done > absorbed:
            await hand_over(absorbed, done - absorbed)
        if running is not None:
            await running
        try:  # a well-behaved server sends nothing more; stray bytes make the connection unusable, not the body
            self._stray = bool(self.sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            self._stray = False
