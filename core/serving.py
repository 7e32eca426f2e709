"""Starting an aiohttp server that a stranger cannot exhaust (issue 32, attacks 3 and 4): every HTTP server we run
(the coordinator, SHARDCAST origins and relays, the dashboards, the metrics pages) is started by `serve`.

aiohttp alone holds a fresh connection forever while it waits for a request's headers, accepts as many connections
as the process has descriptors, and, once `accept()` fails for want of one, asyncio logs a traceback each time it
tries again. Here, at the transport (a wrapper around each connection's protocol, `_GuardedConnection`):

- connections are counted per client address and in all; one past either bound is closed at once, before aiohttp
  sees it. The bound in all is also kept under three quarters of the process's descriptor limit, shared by all the
  servers of the process, so a flood seldom reaches `EMFILE`. Seldom, not never: asyncio accepts up to a backlog
  of connections per wake-up before any of them reaches the guard, so a burst can hold a few hundred descriptors for
  a moment. When `accept()` does fail, asyncio stops accepting for a second and tries again; that is logged as one
  line per interval (`_quiet_accept_failures`), not as a traceback per attempt;
- a connection whose first request's headers have not ended `header_timeout` seconds after it opened is closed;
  later requests on a kept-alive connection are aiohttp's `keepalive_timeout`, which closes a connection whose next
  request is not complete that long after the last answer, and a body left unread after the answer is read and
  dropped for at most `lingering_time` seconds before the connection closes;
- each refusal is one line per cause per `log_interval` (`RefusalLog`), and the tracebacks asyncio and aiohttp log
  for the same failure over and over are folded to one per interval (`FoldRepeats`).

A body's own time bound is the reader's (`ConnectionLimits.body_deadline`): only the coordinator reads bodies.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

_HEADERS_END = b"\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on the connections one server holds and on how slowly a client may send."""

    max_connections: int = 1024  # connections open at once, all addresses together (and under the process's share)
    max_per_address: int = 64  # connections open at once from one client address
    header_timeout: float = 10.0  # seconds from a connection's opening to the end of its first request's headers
    keepalive_timeout: float = 15.0  # seconds an idle kept-alive connection is held for its next request
    lingering_time: float = 5.0  # seconds a body left unread after the answer is drained before the connection closes
    body_grace: float = 10.0  # seconds a body may take whatever its size ...
    min_body_rate: float = 256 * 1024  # ... plus its size at this many bytes a second
    log_interval: float = 10.0  # seconds between two log lines of one refused cause

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_address < 1:
            raise ValueError("max_connections and max_per_address must be at least 1")
        times = (self.header_timeout, self.keepalive_timeout, self.body_grace, self.min_body_rate, self.log_interval)
        if min(times) <= 0 or self.lingering_time < 0:
            raise ValueError("the timeouts, the body rate and the log interval must be positive")

    def body_deadline(self, size: int) -> float:
        """Seconds a body of `size` bytes may take to arrive."""
        return self.body_grace + size / self.min_body_rate


class RefusalLog:
    """One warning per cause per `interval`, counting the refusals it stands for; `counts` holds them all."""

    def __init__(self, logger: logging.Logger, what: str, interval: float) -> None:
        self.logger, self.what, self.interval = logger, what, interval
        self.counts: Counter[str] = Counter()
        self._pending: Counter[str] = Counter()
        self._logged_at: dict[str, float] = {}

    def note(self, cause: str, address: str) -> None:
        self.counts[cause] += 1
        self._pending[cause] += 1
        now = time.monotonic()
        if now - self._logged_at.get(cause, -self.interval) >= self.interval:
            count = self._pending.pop(cause)
            self._logged_at[cause] = now
            self.logger.warning("%s refused %d for %s (the last from %s)", self.what, count, cause, address)


class FoldRepeats(logging.Filter):
    """Lets one record of each (logger, message) through per `interval`; the next one says how many it stood for.

    On the `asyncio` and `aiohttp.server` loggers: a descriptor shortage or a client that drops connections makes
    them log the same traceback for every attempt (469,720 lines in 25 s, issue 32)."""

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.interval = interval
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last, folded = self._seen.get(key, (-self.interval, 0))
        if now - last < self.interval:
            self._seen[key] = (last, folded + 1)
            return False
        if len(self._seen) > 1024:  # messages are few; forget them all rather than grow
            self._seen.clear()
        self._seen[key] = (now, 0)
        if folded:
            record.msg = f"{record.msg} [and {folded} more like it in the last {now - last:.0f} s]"
        return True


_ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message when accept() fails for a descriptor


def _quiet_accept_failures(loop: asyncio.AbstractEventLoop, refusals: RefusalLog) -> None:
    """Makes `loop` report a failed `accept()` (EMFILE, ENFILE, ENOBUFS: asyncio pauses accepting for a second) as one
    line per interval in `refusals`, not a traceback; every other error goes where it went before."""
    previous = loop.get_exception_handler()
    if getattr(previous, "quiets_accept_failures", False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _ACCEPT_FAILED:
            error = context.get("exception")
            reason = error.strerror if isinstance(error, OSError) and error.strerror else repr(error)
            refusals.note(f"connections the process had no descriptor for ({reason}; accepting again in 1 s)", "?")
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handler.quiets_accept_failures = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)


def fold_repeated_logs(interval: float) -> None:
    """Installs `FoldRepeats` on the loggers that repeat themselves under a flood, once per process."""
    for name in ("asyncio", "aiohttp.server", "aiohttp.web"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, FoldRepeats) for f in logger.filters):
            logger.addFilter(FoldRepeats(interval))


class _Descriptors:
    """Connections open in this process, all servers together, and how many the descriptor limit leaves them."""

    def __init__(self) -> None:
        self.open = 0
        self.limit = 0
        self.read_limit()

    def read_limit(self) -> None:
        """The share of the descriptor limit as it is now (`serve` reads it again: a process may lower it)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.limit = (soft * 3) // 4 if soft != resource.RLIM_INFINITY else 1 << 20  # a quarter for files, pipes


_PROCESS = _Descriptors()


class ConnectionGuard:
    """The connections one server holds: admitted under `limits`, refused past them (`refusals` counts why)."""

    def __init__(self, limits: ConnectionLimits, name: str) -> None:
        self.limits, self.name = limits, name
        self.open = 0
        self.by_address: dict[str, int] = {}
        self.refusals = RefusalLog(log, f"{name}:", limits.log_interval)

    def admit(self, address: str) -> bool:
        if self.by_address.get(address, 0) >= self.limits.max_per_address:
            self.refusals.note("connections over the per-address limit", address)
            return False
        if self.open >= self.limits.max_connections or _PROCESS.open >= _PROCESS.limit:
            self.refusals.note("connections over the limit in all", address)
            return False
        self.open += 1
        _PROCESS.open += 1
        self.by_address[address] = self.by_address.get(address, 0) + 1
        return True

    def release(self, address: str) -> None:
        self.open -= 1
        _PROCESS.open -= 1
        left = self.by_address[address] - 1
        if left:
            self.by_address[address] = left
        else:
            del self.by_address[address]

    def factory(self, make: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """The protocol factory `loop.create_server` takes: `make`'s protocols, each behind this guard."""
        return lambda: _GuardedConnection(self, make)


class _GuardedConnection(asyncio.Protocol):
    """One connection: admitted by the guard, then handed to aiohttp's protocol (made only then); closed when the
    first request's headers do not end within `header_timeout`."""

    def __init__(self, guard: ConnectionGuard, make: Callable[[], asyncio.Protocol]) -> None:
        self._guard, self._make = guard, make
        self._inner: asyncio.Protocol | None = None
        self._address = "?"
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes seen while waiting for the end of the headers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if not self._guard.admit(self._address):
            transport.abort()
            return
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(self._guard.limits.header_timeout, self._too_slow)
        self._inner = self._make()
        self._inner.connection_made(transport)

    def _too_slow(self) -> None:
        self._timer = None
        self._guard.refusals.note("connections whose headers did not arrive in time", self._address)
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if _HEADERS_END in seen or b"\n\n" in seen:  # the blank line that ends the headers (bare LF or not)
                self._timer.cancel()
                self._timer = None
                self._tail = b""
            else:
                self._tail = seen[-(len(_HEADERS_END) - 1) :]
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is None:
            return
        self._guard.release(self._address)
        self._transport = None
        inner, self._inner = self._inner, None
        inner.connection_lost(exc)

    def __getattr__(self, name: str) -> Any:  # what asyncio asks of a protocol beyond the above (sendfile's fallback)
        if name.startswith("__") or self.__dict__.get("_inner") is None:
            raise AttributeError(name)
        return getattr(self.__dict__["_inner"], name)


class _GuardedSite(web.TCPSite):
    """aiohttp's TCPSite with each connection behind `guard`."""

    def __init__(self, runner: web.AppRunner, guard: ConnectionGuard, host: str, port: int) -> None:
        super().__init__(runner, host, port, reuse_address=True)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner, as TCPSite.start does first
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.factory(server), self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


@dataclass
class Served:
    """A server `serve` started: `runner.cleanup()` stops it; `guard` counts its connections and refusals."""

    runner: web.AppRunner
    guard: ConnectionGuard
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


async def serve(
    app: web.Application, host: str, port: int, limits: ConnectionLimits | None = None, *, name: str
) -> Served:
    """Serves `app` on host:port (port 0: any free one) under `limits`; `name` labels its log lines."""
    limits = limits or ConnectionLimits()
    fold_repeated_logs(limits.log_interval)
    _PROCESS.read_limit()
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=2.0,
        keepalive_timeout=limits.keepalive_timeout,
        lingering_time=limits.lingering_time,
    )
    await runner.setup()
    guard = ConnectionGuard(limits, name)
    _quiet_accept_failures(asyncio.get_running_loop(), RefusalLog(log, "this process:", limits.log_interval))
    site = _GuardedSite(runner, guard, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return Served(runner, guard, site.port)
