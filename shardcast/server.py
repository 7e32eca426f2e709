"""The SHARDCAST HTTP server shared by origins and relays (DESIGN section 9), on aiohttp.

Endpoints: `GET /versions` (long-poll with `?after=N&wait=S`), `GET /v/{step}/manifest.json` (canonical
bytes, the trainer's signature in `X-Shardcast-Signature`), `GET /v/{step}/shards/{file}/{index}` (Range
supported; a shard still being mirrored is awaited up to `pending_wait`), `GET /health`, `GET /metrics`.

The server only reads the store. Whoever writes to it (an `Origin` publishing, a `Mirror` copying from
upstream) calls `notify()` afterwards, which wakes long-polls and requests waiting for a shard.

Limits against greedy or hostile clients: open connections overall and per client address, and the time a
connection may take to send its headers (`core.serving`, as every server of ours); requests in flight overall and
per client address, a request
rate per client address, and optionally a byte rate per client address (a token bucket shared by that
address's connections). Long-polls do not count as requests in flight: they wait in a pool of their own
(`shardcast.polls`), so idle ones never crowd out `/health`, manifests or shards. Every refusal is a JSON
error with a 4xx/5xx status and counted in `/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import BinaryIO

from aiohttp import web

from core.metrics import Registry, metrics_response
from core.serving import ConnectionGuard, ConnectionLimits, serve
from shardcast import LongPollRefused, ManifestError, ShardPending, UnknownShard, VersionNotFound, trace
from shardcast.manifest import check_name
from shardcast.polls import LongPolls
from shardcast.protocol import HEALTH, MANIFEST, METRICS, SHARD, SIGNATURE_HEADER, STEP, VERSIONS, VersionList
from shardcast.store import ShardStore

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
_RANGE = re.compile(r"bytes=([0-9]{1,20})-([0-9]{0,20})")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what clients may ask of one server."""

    max_connections: int = 256  # requests in flight, all clients together; more get 503
    max_per_client: int = 64  # requests in flight per client address; more get 429
    requests_per_s: float = 200.0  # request rate per client address (burst of twice this); more get 429
    client_rate: float = 0.0  # bytes/s sent to one client address, 0 for no limit
    pending_wait: float = 20.0  # seconds a request waits for a shard that is still being mirrored
    max_wait: float = 60.0  # longest long-poll on /versions
    max_long_polls: int = 1024  # long-polls held, apart from the requests in flight; then fair shares (polls.py)
    max_long_polls_per_client: int = 32  # long-polls held per client address; more get 429

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_client < 1 or self.requests_per_s <= 0:
            raise ValueError("max_connections, max_per_client and requests_per_s must be positive")
        if self.max_long_polls < 1 or self.max_long_polls_per_client < 1:
            raise ValueError("max_long_polls and max_long_polls_per_client must be positive")
        if self.client_rate < 0 or self.pending_wait < 0 or self.max_wait < 0:
            raise ValueError("client_rate, pending_wait and max_wait must not be negative")


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved; `take` waits (async) for a debt to be paid off."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def try_take(self, amount: float) -> bool:
        self._refill()
        if self.tokens < amount:
            return False
        self.tokens -= amount
        return True

    async def take(self, amount: float) -> None:
        self._refill()
        self.tokens -= amount  # may go negative: this caller (and the next ones) wait for the debt
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


async def _answer(handler: Handler, request: web.Request) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:  # aiohttp's own answers: no route (404), wrong method (405)
        return _error(exc.status, exc.reason)


def _is_long_poll(request: web.Request) -> bool:
    """A `/versions` request that may wait (the handler validates the query); it goes to the long-poll pool."""
    return request.path == VERSIONS and "after" in request.query and "wait" in request.query


class ShardServer:
    """Serves one `ShardStore`; `role` ("origin" or "relay") is reported by /health."""

    def __init__(
        self,
        store: ShardStore,
        *,
        role: str,
        limits: ServerLimits | None = None,
        connections: ConnectionLimits | None = None,
    ) -> None:
        self.store = store
        self.role = role
        self.limits = limits or ServerLimits()
        self.connections = connections or ConnectionLimits()  # open connections, slow headers (core.serving)
        self._changed = asyncio.Condition()
        self._polls = LongPolls(self.limits.max_long_polls, self.limits.max_long_polls_per_client)
        self._in_flight: dict[str, int] = {}
        self._total_in_flight = 0
        self._request_buckets: dict[str, TokenBucket] = {}
        self._byte_buckets: dict[str, TokenBucket] = {}
        self._runner: web.AppRunner | None = None
        self.connection_guard: ConnectionGuard | None = None  # the open connections and their refusals, once started
        self.started = time.time()
        self._serving: dict[int, int] = {}  # step -> shard answers being sent now
        self._served_at: dict[int, float] = {}  # step -> time.monotonic() the last shard answer of it ended

        self.metrics = Registry()
        self._requests = self.metrics.counter("shardcast_requests_total", "HTTP requests by endpoint and status.")
        self._bytes_sent = self.metrics.counter("shardcast_bytes_sent_total", "Shard bytes sent to clients.")
        self._refused = self.metrics.counter("shardcast_refused_total", "Requests refused by a limit, by limit.")
        self.metrics.gauge(
            "shardcast_in_flight", "Requests being served now, long-polls included.", lambda: self.in_flight
        )
        self.metrics.gauge("shardcast_long_polls", "Long-polls of /versions being held.", lambda: len(self._polls))
        self._polls_cut = self.metrics.counter(
            "shardcast_long_polls_cut_total", "Long-polls answered early to make room for another address."
        )
        self.metrics.gauge("shardcast_versions", "Complete versions held.", lambda: len(self.store.versions()))
        self.metrics.gauge("shardcast_incoming_versions", "Versions being mirrored.", lambda: len(store.incoming()))
        self.metrics.gauge(
            "shardcast_latest_step",
            "Newest step held (complete or being mirrored), -1 if none.",
            lambda: float(max([-1, *self.store.versions(), *self.store.incoming()])),
        )

        self.app = web.Application(middlewares=[self._limits_middleware])
        self.app.add_routes(
            [
                web.get(VERSIONS, self._versions),
                web.get(MANIFEST, self._manifest),
                web.get(SHARD, self._shard),
                web.get(HEALTH, self._health),
                web.get(METRICS, self._metrics),
            ]
        )

    # --- life cycle ----------------------------------------------------------------------------------

    @property
    def bytes_sent(self) -> float:
        """Shard bytes sent to clients since the server was built (a relay advertises its rate)."""
        return self._bytes_sent.value()

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (port 0 picks a free one); returns the port."""
        served = await serve(self.app, host, port, self.connections, name=f"shardcast {self.role}")
        self._runner, self.connection_guard = served.runner, served.guard
        return served.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def in_flight(self) -> int:
        """Requests being served now: those within the in-flight limits, and the long-polls held apart."""
        return self._total_in_flight + len(self._polls)

    async def notify(self) -> None:
        """Wake long-polls and shard waits: the store has a new version or a new shard."""
        self._polls.wake_all()
        async with self._changed:
            self._changed.notify_all()

    def idle_for(self, step: int) -> float:
        """Seconds since the last shard answer of `step` ended (infinite if none was sent); 0 while one is sent."""
        if self._serving.get(step, 0):
            return 0.0
        ended = self._served_at.get(step)
        return float("inf") if ended is None else time.monotonic() - ended

    def latest(self) -> int | None:
        steps = self.store.versions() + self.store.incoming()
        return max(steps) if steps else None

    # --- limits --------------------------------------------------------------------------------------

    @web.middleware
    async def _limits_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        client = request.remote or "?"
        endpoint = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
        bucket = self._request_buckets.get(client)
        if bucket is None:
            if len(self._request_buckets) > 10_000:  # forget idle clients rather than grow without bound
                self._request_buckets.clear()
            bucket = self._request_buckets[client] = TokenBucket(
                self.limits.requests_per_s, 2 * self.limits.requests_per_s
            )
        response: web.StreamResponse
        long_poll = _is_long_poll(request)  # held in the long-poll pool by the handler, not counted in flight
        if not long_poll and self._total_in_flight >= self.limits.max_connections:
            response = _error(503, "server busy: too many requests in flight", **{"Retry-After": "1"})
            self._refused.inc(limit="connections")
        elif not long_poll and self._in_flight.get(client, 0) >= self.limits.max_per_client:
            response = _error(
                429, f"at most {self.limits.max_per_client} requests in flight per client", **{"Retry-After": "1"}
            )
            self._refused.inc(limit="per_client")
        elif not bucket.try_take(1):
            response = _error(429, f"over {self.limits.requests_per_s:g} requests/s", **{"Retry-After": "1"})
            self._refused.inc(limit="rate")
        elif long_poll:
            response = await _answer(handler, request)
        else:
            self._total_in_flight += 1
            self._in_flight[client] = self._in_flight.get(client, 0) + 1
            try:
                response = await _answer(handler, request)
            finally:
                self._total_in_flight -= 1
                left = self._in_flight[client] - 1
                if left:
                    self._in_flight[client] = left
                else:
                    del self._in_flight[client]
        self._requests.inc(endpoint=endpoint, status=str(response.status))
        return response

    async def _send_file(self, request: web.Request, file_object: BinaryIO, offset: int, count: int) -> None:
        """Send `count` bytes of the file from `offset` with sendfile(2) (the kernel copies page cache to socket),
        in 1 MiB pieces paced by the client's byte bucket when a client rate is set.

        The response headers were written by `prepare`; asyncio's sendfile flushes them before the file bytes.
        """
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("client went away")
        loop = asyncio.get_running_loop()
        bucket = None
        if self.limits.client_rate > 0:
            client = request.remote or "?"
            bucket = self._byte_buckets.get(client)
            if bucket is None:
                burst = min(self.limits.client_rate, CHUNK)  # the limit holds from the first megabyte on
                bucket = self._byte_buckets[client] = TokenBucket(self.limits.client_rate, burst)
        piece = CHUNK if bucket is not None else count
        sent = 0
        while sent < count:
            n = min(piece, count - sent)
            if bucket is not None:
                await bucket.take(n)
            if await loop.sendfile(transport, file_object, offset + sent, n) != n:
                raise OSError(f"{file_object.name} is shorter than its manifest says")  # a damaged store
            sent += n
            self._bytes_sent.inc(n)

    # --- handlers ------------------------------------------------------------------------------------

    def _versions_body(self) -> dict[str, object]:
        held = VersionList(self.latest(), frozenset(self.store.versions()), frozenset(self.store.incoming()))
        return held.to_json()

    async def _versions(self, request: web.Request) -> web.Response:
        after_text, wait_text = request.query.get("after"), request.query.get("wait", "0")
        if after_text is not None and after_text != "-1" and not STEP.fullmatch(after_text):
            return _error(400, "after must be a step number, or -1 to wait for any version")
        try:
            wait = min(float(wait_text), self.limits.max_wait)
        except ValueError:
            return _error(400, "wait must be a number of seconds")
        if after_text is not None and wait > 0:
            after = int(after_text)

            def newer() -> bool:
                latest = self.latest()
                return latest is not None and latest > after

            try:
                if await self._polls.wait(request.remote or "?", newer, wait):
                    self._polls_cut.inc()
            except LongPollRefused as exc:
                self._refused.inc(limit=f"long_polls_{exc.limit}")
                return _error(429 if exc.limit == "per_client" else 503, exc.reason, **{"Retry-After": "1"})
        return web.json_response(self._versions_body())

    @staticmethod
    def _step(request: web.Request) -> int | None:
        text = request.match_info["step"]
        return int(text) if STEP.fullmatch(text) else None

    async def _manifest(self, request: web.Request) -> web.Response:
        step = self._step(request)
        if step is None:
            return _error(404, "no such step")
        try:
            body, signature = self.store.manifest_bytes(step), self.store.signature(step)
        except VersionNotFound:
            return _error(404, f"no version {step} here")
        return web.Response(
            body=body, content_type="application/json", headers={SIGNATURE_HEADER: "0x" + signature.hex()}
        )

    async def _shard(self, request: web.Request) -> web.StreamResponse:
        step = self._step(request)
        if step is None:
            return _error(404, "no such step")
        file, index_text = request.match_info["file"], request.match_info["index"]
        try:
            check_name(file)
        except ManifestError:
            return _error(404, "no such file")
        if not STEP.fullmatch(index_text):
            return _error(404, "no such shard")
        asked = time.monotonic()
        try:
            file_object, offset, size = await self._locate(step, file, int(index_text))
        except VersionNotFound:
            return _error(404, f"no version {step} here")
        except UnknownShard:
            return _error(404, f"no shard {file}[{index_text}] in version {step}")
        except ShardPending:
            return _error(503, "shard not mirrored yet", **{"Retry-After": "1"})
        with file_object:
            return await self._send_shard(request, step, file, int(index_text), file_object, offset, size, asked)

    async def _send_shard(
        self,
        request: web.Request,
        step: int,
        file: str,
        index: int,
        file_object: BinaryIO,
        offset: int,
        size: int,
        asked: float,
    ) -> web.StreamResponse:
        start, end = 0, size  # [start, end) within the shard
        status, headers = 200, {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if "Range" in request.headers:
            match = _RANGE.fullmatch(request.headers["Range"].strip())
            if match is None or int(match.group(1)) >= size:
                return _error(
                    416, f"range must be bytes=a-[b] within {size} bytes", **{"Content-Range": f"bytes */{size}"}
                )
            start = int(match.group(1))
            end = min(size, int(match.group(2)) + 1) if match.group(2) else size
            if end <= start:
                return _error(416, "empty range", **{"Content-Range": f"bytes */{size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self._serving[step] = self._serving.get(step, 0) + 1
        try:
            response = web.StreamResponse(status=status, headers=headers)
            response.content_length = end - start
            await response.prepare(request)
            waited = time.monotonic() - asked
            await self._send_file(request, file_object, offset + start, end - start)
            await response.write_eof()
            trace.event("served", file=file, index=index, bytes=end - start, waited_s=round(waited, 4))
            return response
        finally:
            left = self._serving[step] - 1
            if left:
                self._serving[step] = left
            else:
                del self._serving[step]
            self._served_at[step] = time.monotonic()
            while len(self._served_at) > 64:  # the steps a server still holds are few; forget the oldest
                del self._served_at[min(self._served_at)]

    async def _locate(self, step: int, file: str, index: int) -> tuple[BinaryIO, int, int]:
        """The shard opened where it is (`ShardStore.open_shard`), waiting up to `pending_wait` while it is still
        being mirrored."""
        deadline = time.monotonic() + self.limits.pending_wait
        while True:
            try:
                return self.store.open_shard(step, file, index)
            except ShardPending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                async with self._changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), timeout=left)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "role": self.role,
                "uptime_s": round(time.time() - self.started, 1),
                **self._versions_body(),
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return metrics_response(self.metrics)
