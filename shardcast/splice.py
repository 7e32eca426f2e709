"""Zero-copy shard transfer on Linux: the socket's bytes go to the checkpoint file by splice(2).

Receiving through aiohttp copies every byte from the kernel into Python objects, and writing them copies them
back; with the hash, each receiving process touches each byte three times. Here the body moves socket → pipe
→ file inside the kernel, and the hash reads the freshly written pages through a read-only mmap of the file,
so the only pass over the bytes in user space is the shard hash itself.

The body of each response is moved by one thread of the pool's own, in a loop of system calls that release the
GIL, hashing each piece as it lands: the event loop sees one hand-off per shard instead of a wake-up per 256 KiB
and a task and a thread hand-off per 1 MiB, which was a fifth of a receiving process's CPU. The transfers in
flight (2 per source) overlap one another's receiving and hashing.

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
import select
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from multidict import CIMultiDict

from shardcast import RelayError

PIPE_SIZE = 1024 * 1024
RCVLOWAT = 256 * 1024  # bytes buffered in the socket before it reads as ready during a body
MAX_HEADER_BYTES = 16 * 1024
MAX_ERROR_BODY = 64 * 1024
AVAILABLE = sys.platform == "linux" and hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")

Absorb = Callable[[int, int], None]  # (offset within the body, length): bytes now in the file; in the body's thread
MAX_THREADS = 64  # bodies moved at once by one pool (a download has at most --parallel transfers in flight)


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
        self._pipes: list[tuple[int, int]] = []  # empty pipes, one taken by each body in flight
        self._threads: ThreadPoolExecutor | None = None
        self._write_locks: dict[tuple[int, int], threading.Lock] = {}  # per file (st_dev, st_ino)

    def close(self) -> None:
        """Close idle connections and pipes; the pool can be used again afterwards. Call it when no body is in
        flight (every `splice_into` has returned)."""
        for sockets in self._idle.values():
            for sock in sockets:
                sock.close()
        self._idle.clear()
        for pipe in self._pipes:
            for fd in pipe:
                os.close(fd)
        self._pipes.clear()
        self._write_locks.clear()
        if self._threads is not None:
            self._threads.shutdown(wait=True)  # idle by now: every body has ended
            self._threads = None

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

    def _take_pipe(self) -> tuple[int, int]:
        if self._pipes:
            return self._pipes.pop()
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        return read_end, write_end

    def _give_pipe(self, pipe: tuple[int, int], empty: bool) -> None:
        """Keep an emptied pipe for the next body; close one a failed body may have left bytes in."""
        if empty:
            self._pipes.append(pipe)
        else:
            for fd in pipe:
                os.close(fd)

    def _write_lock(self, fd: int) -> threading.Lock:
        """One lock per target file, held while a body's thread copies its pipe into the file. ext4 holds the inode's
        lock through each buffered write, and a second writer of the same file spins on it while the first copies:
        with 2 transfers in flight, a client spent 0.71 CPU-s per 512 MiB, 0.53-0.56 with this lock
        (benchmarks/shardcast.py --trace). A thread waiting for this lock sleeps instead."""
        info = os.fstat(fd)
        return self._write_locks.setdefault((info.st_dev, info.st_ino), threading.Lock())

    def _executor(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="splice")
        return self._threads

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
        """Move the body into `fd` at `file_offset` in a thread of the pool's; `absorb(offset, n)` is called in
        that thread, in order, for every `every` bytes and for the remainder, each once its bytes are in the file.
        A short or overlong body raises `ConnectionError`, a silent peer `TimeoutError`; the bytes that did arrive
        are absorbed first. Cancelled, it shuts the connection down so the thread stops at once, and returns only
        once the thread has (no absorb runs after the caller lets the file go)."""
        reusable = False
        try:
            if len(self.early) > self.length:
                raise ConnectionError("more bytes than Content-Length")
            pipe = self.pool._take_pipe()
            emptied = False
            loop = asyncio.get_running_loop()
            lock = self.pool._write_lock(fd)
            moving = loop.run_in_executor(self.pool._executor(), self._body, fd, file_offset, absorb, every, pipe, lock)
            try:
                await _finish(moving, self.sock)
                emptied = True
            finally:
                self.pool._give_pipe(pipe, emptied)
            reusable = self._keep_alive() and not self._stray
        finally:
            self._release(reusable)

    def _body(
        self, fd: int, file_offset: int, absorb: Absorb, every: int, pipe: tuple[int, int], lock: threading.Lock
    ) -> None:
        """The receiving loop, in a worker thread: splice, drain the pipe into the file, absorb every `every`
        bytes. Waits use poll(2) with SO_RCVLOWAT, so the thread wakes once a worthwhile amount is buffered."""
        sock, length, early = self.sock, self.length, self.early
        done = absorbed = 0
        while done < len(early):  # body bytes that came with the headers: a plain write
            done += os.pwrite(fd, early[done:], file_offset + done)
        read_end, write_end = pipe
        waiter = select.poll()
        waiter.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        timeout_ms = int(self.pool.timeout * 1000)
        lowat = 1
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
                    want = min(RCVLOWAT, length - done)
                    if want != lowat:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                        lowat = want
                    if not waiter.poll(timeout_ms):
                        raise TimeoutError(f"no body bytes for {self.pool.timeout:g} s") from None
                    continue
                if moved == 0:
                    raise ConnectionError(f"connection closed after {done} of {length} body bytes")
                drained = 0
                with lock:
                    while drained < moved:
                        drained += os.splice(read_end, fd, moved - drained, offset_dst=file_offset + done + drained)
                done += moved
                if done - absorbed >= every:
                    absorb(absorbed, done - absorbed)
                    absorbed = done
        finally:
            if done > absorbed:  # also on an error: the next source is asked only for the rest
                absorb(absorbed, done - absorbed)
        try:  # a well-behaved server sends nothing more; stray bytes make the connection unusable, not the body
            self._stray = bool(sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            self._stray = False


async def _finish(moving: asyncio.Future[None], sock: socket.socket) -> None:
    """Wait for a body's thread; if cancelled meanwhile, shut the connection down (its splice and poll return at
    once), wait for the thread all the same, and then raise the cancellation."""
    try:
        await asyncio.shield(moving)
        return
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        while not moving.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({moving})  # returns when the thread has, raising nothing of its own
        if not moving.cancelled():
            moving.exception()  # the thread's error (the shut-down connection) is the cancellation's consequence
        raise
