"""The SHARDCAST client: find a trusted version, download its shards from several sources, publish it.

Protocol calls (`list_versions`, `fetch_manifest`) read untrusted servers with size limits and strict
parsing. `resolve_version` counts only versions whose manifest the trainer signed: a source that lists a
step it cannot back with a signed manifest is not asked about its other steps, so junk step numbers cost
one request per source, never a failed download. `Downloader` spreads shards over sources in parallel,
choosing a source at random with weight proportional to its measured throughput (shared among its
transfers in flight), so a fast relay carries most of the load while a slow one still helps. A transfer
that breaks keeps the bytes it received and asks another source for the rest (HTTP Range). Bad bytes are
pinned on the source that sent them: a shard of one source that fails its hash bans that source; a shard
of several is fetched again whole from one, and only a source whose piece differs from the verified
bytes is banned. A source that errors backs off, and is dropped after repeated failures. Shards go into
a `PartialCheckpoint`, so a killed download resumes where it stopped.

A receiver that holds an earlier step rebuilds what it can from deltas (`_rebuild`, format 3): the step's own delta
when it holds the base, a chain of deltas when that is fewer bytes than the step whole, and then fetches whatever
did not rebuild and verify, whole. Every rebuilt shard is checked against the signed manifest like a downloaded one.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import random
import shutil
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import blake3

from core.bodies import read_body
from shardcast import (
    DownloadFailed,
    ManifestError,
    RelayError,
    ShardHashMismatch,
    SourceError,
    UntrustedManifest,
    splice,
    trace,
)
from shardcast.fileio import start_writeback
from shardcast.manifest import (
    Hasher,
    Manifest,
    ShardInfo,
    check_json_depth,
    encode_manifest,
    manifest_hash,
    parse_manifest,
)
from shardcast.partial import PartialCheckpoint, partial_path
from shardcast.protocol import (
    MAX_MANIFEST_BYTES,
    MAX_VERSIONS_BYTES,
    SIGNATURE_HEADER,
    VERSIONS,
    VersionList,
    manifest_url,
    read_versions,
    shard_url,
    versions_url,
)
from shardcast.rebuild import SIGNED_MANIFEST_NAME, apply_link, base_files, held_bases, take_rebuilt
from shardcast.sources import Source, SourcePool
from shardcast.trust import TrustPolicy

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024  # bytes hashed and written at a time
MAX_ATTEMPTS = 60  # requests for one shard before the download gives up (busy answers included)
# Transfers in flight to one source. Shards of one source then complete nearly in manifest order, so a relay has
# its first shard verified (and served on) after about two shards' time, not `parallel` shards' time: with 8 at
# once from its one upstream, each hop of a relay tree held back 8 shards (128 MiB). Two keep a source busy while
# one transfer ends and the next begins; more sources still get `parallel` transfers in all.
PER_SOURCE = 2
STEP_DIR_PREFIX = "step_"
MAX_CHAIN = 16  # deltas a receiver chains at most from a step it holds
Progress = Callable[[int], None]  # bytes just verified and written
ShardDone = Callable[[], Awaitable[None]]


def client_timeout(read: float = 30.0) -> aiohttp.ClientTimeout:
    """Connect fast or fail; a read may wait for a relay still mirroring the shard (its wait is 20 s)."""
    return aiohttp.ClientTimeout(total=None, connect=5.0, sock_connect=5.0, sock_read=read)


async def _read_limited(response: aiohttp.ClientResponse, limit: int, what: str, source: str) -> bytes:
    body = await read_body(response.content, limit)
    if len(body) > limit:
        raise SourceError(source, f"{what} is over {limit} bytes")
    return body


async def list_versions(
    session: aiohttp.ClientSession, source: Source, *, after: int | None = None, wait: float = 0.0
) -> VersionList:
    """The source's versions; with `after`, waits up to `wait` s for one newer than `after` (long-poll)."""
    params = {} if after is None else {"after": str(after), "wait": str(wait)}
    try:
        async with session.get(
            versions_url(source.url), params=params, timeout=client_timeout(wait + 10.0)
        ) as response:
            if response.status != 200:
                raise SourceError(source.url, f"{VERSIONS} answered HTTP {response.status}")
            body = await _read_limited(response, MAX_VERSIONS_BYTES, VERSIONS, source.url)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SourceError(source.url, f"{VERSIONS} failed: {exc or type(exc).__name__}") from None
    try:
        check_json_depth(body, 4)
        return read_versions(body)
    except (ManifestError, ValueError) as exc:
        raise SourceError(source.url, f"{VERSIONS} is malformed: {exc}") from None


async def fetch_manifest(
    session: aiohttp.ClientSession, source: Source, step: int, policy: TrustPolicy | None
) -> tuple[Manifest, bytes]:
    """Version `step`'s manifest and signature from `source`, checked against `policy` when one is given.

    Raises `SourceError` for transport and format problems, `UntrustedManifest` for a bad signature.
    """
    try:
        async with session.get(manifest_url(source.url, step), timeout=client_timeout()) as response:
            if response.status != 200:
                raise SourceError(source.url, f"manifest of step {step} answered HTTP {response.status}")
            body = await _read_limited(response, MAX_MANIFEST_BYTES, "manifest", source.url)
            signature_hex = response.headers.get(SIGNATURE_HEADER, "")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SourceError(source.url, f"manifest of step {step} failed: {exc or type(exc).__name__}") from None
    try:
        manifest = parse_manifest(body, max_bytes=MAX_MANIFEST_BYTES)
    except ManifestError as exc:
        raise SourceError(source.url, str(exc)) from None
    try:
        signature = bytes.fromhex(signature_hex.removeprefix("0x"))
    except ValueError:
        raise UntrustedManifest(step, f"{SIGNATURE_HEADER} is not hex", source.url) from None
    if policy is not None:
        policy.check(manifest, signature, step=step, source=source.url)
    elif manifest.step != step:
        raise UntrustedManifest(step, f"it is the manifest of step {manifest.step}", source.url)
    return manifest, signature


@dataclass
class _Transfer:
    """One shard being fetched: its bytes so far are on disk and in `hasher`; `pending` is not yet written.

    `pieces` says which source sent which bytes: (offset in the shard, url) where each source's bytes begin.
    A shard that fails its hash after bytes from several sources is fetched again whole from one source
    (`single`), and each piece of the failed attempt (`suspects`: start, end, url, hash of what it sent) is
    then compared with the verified bytes: only a source whose piece differs sent bad bytes.
    """

    file: str
    shard: ShardInfo
    received: int = 0  # bytes hashed and written
    hasher: Hasher = field(init=False)  # the shard's kind of hash (BLAKE3 in format 2) over bytes 0..received
    pending: list[bytes] = field(default_factory=list)  # received, not yet hashed and written: no copies
    pending_bytes: int = 0
    pieces: list[tuple[int, str]] = field(default_factory=list)
    single: bool = False
    suspects: list[tuple[int, int, str, bytes]] = field(default_factory=list)
    asked: float = 0.0  # time.monotonic() of its first request, for the trace
    answered: float = 0.0  # ... and of the first answer's headers
    hash_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.hasher = self.shard.hasher()

    @property
    def index(self) -> int:
        return self.shard.index

    @property
    def size(self) -> int:
        return self.shard.size

    def restart(self) -> None:
        self.received, self.hasher = 0, self.shard.hasher()
        self.pending, self.pending_bytes = [], 0
        self.pieces.clear()

    def begin_piece(self, url: str) -> None:
        """Bytes from `url` start arriving at `received` (after any restart this answer caused)."""
        if self.pieces and self.pieces[-1][0] == self.received:
            self.pieces.pop()  # the previous source sent nothing that stayed
        self.pieces.append((self.received, url))

    def ranges(self) -> list[tuple[int, int, str]]:
        """(start, end, url) of the bytes in place, one entry per non-empty piece."""
        ends = [start for start, _ in self.pieces[1:]] + [self.received]
        return [(start, end, url) for (start, url), end in zip(self.pieces, ends, strict=True) if end > start]


def _hash_ranges(sink: PartialCheckpoint, file: str, index: int, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """BLAKE3 of each (start, end) range of a shard as its bytes are now, in memory or on disk (only compared with
    another call's result, so any collision-resistant hash does; this is the fastest here)."""
    fd, offset = sink.open_placed(file, index)
    digests = []
    try:
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:
            for start, end in ranges:
                with memoryview(mapped) as view:
                    digests.append(blake3.blake3(view[offset + start : offset + end]).digest())
    finally:
        os.close(fd)
    return digests


def new_session() -> aiohttp.ClientSession:
    """A session without a connection cap (the downloader bounds itself) and reads of up to a shard chunk."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), read_bufsize=CHUNK)


class Downloader:
    """Downloads the missing shards of one manifest into a `PartialCheckpoint` from several sources."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        sources: Sequence[Source],
        *,
        parallel: int = 8,
        per_source: int = PER_SOURCE,
        on_progress: Progress | None = None,
        on_shard: ShardDone | None = None,
    ) -> None:
        if not sources:
            raise RelayError("no source to download from")
        if parallel < 1 or per_source < 1:
            raise ValueError(f"parallel and per_source must be at least 1, got {parallel} and {per_source}")
        self.session = session
        self.sources = list(sources)
        self.parallel, self.per_source = parallel, per_source
        self._freed = asyncio.Condition()  # a transfer of this download ended: a source may be under its cap again
        self._mine: dict[str, int] = {}  # url -> this download's transfers in flight to it (the cap counts these)
        self.on_progress = on_progress
        self.on_shard = on_shard
        self.errors: list[str] = []
        self._splice = splice.ConnectionPool() if splice.AVAILABLE else None
        self._no_splice: set[str] = set()  # sources whose answers the splice path cannot take

    async def download(self, sink: PartialCheckpoint, files: Collection[str] | None = None) -> None:
        """Fetch every missing shard (of `files` only, when given); raises `DownloadFailed` when no usable source is
        left."""
        shards = {(f.name, s.index): s for f in sink.manifest.files for s in f.shards}
        queue = deque(key for key in sink.missing() if files is None or key[0] in files)
        step = sink.manifest.step

        active = 0  # shards being fetched: at most PER_SOURCE for each usable source

        async def worker() -> None:
            nonlocal active
            while queue:
                usable = sum(s.banned is None for s in self.sources)
                if active >= self.per_source * max(1, usable):  # a shard is taken only when it can be sent for,
                    async with self._freed:  # so they are fetched in manifest order, not held by waiting workers
                        await self._freed.wait()
                    continue
                file, index = queue.popleft()
                active += 1
                try:
                    await self._fetch(sink, _Transfer(file, shards[(file, index)]), step)
                finally:
                    active -= 1
                    async with self._freed:
                        self._freed.notify_all()

        workers = [asyncio.create_task(worker()) for _ in range(min(self.parallel, max(1, len(queue))))]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            if self._splice is not None:
                self._splice.close()

    async def _pick(self) -> Source | None:
        """A usable source under its cap of transfers at random, weighted by throughput per transfer in flight,
        waiting for one to be under its cap; None if all are out."""
        while True:
            usable = [s for s in self.sources if s.banned is None]
            if not usable:
                return None
            open_ = [s for s in usable if self._mine.get(s.url, 0) < self.per_source]
            if open_:
                return self._weighted(open_)
            async with self._freed:
                await self._freed.wait()

    @staticmethod
    def _weighted(usable: list[Source]) -> Source:
        now = time.monotonic()
        ready = [s for s in usable if s.retry_at <= now] or [min(usable, key=lambda s: s.retry_at)]
        known = [s.throughput for s in ready if s.throughput > 0]
        prior = max(known) if known else 1.0  # an unmeasured source is tried as if it were the best
        weights = [(s.throughput or prior) / (1 + s.in_flight) for s in ready]
        return random.choices(ready, weights=weights)[0]

    def _ban(self, source: Source, reason: str, *, offence: bool = False) -> None:
        """Drop `source` from this download; `offence`: for bytes or answers only a hostile or broken peer sends."""
        first = source.banned is None
        if offence:
            source.convict(reason)
        elif first:
            source.banned = reason
        if first:
            log.warning("dropping source %s: %s", source.url, reason)
        self.errors.append(f"{source.url}: {reason}")

    def _source(self, url: str) -> Source:
        return next(s for s in self.sources if s.url == url)

    async def _fetch(self, sink: PartialCheckpoint, transfer: _Transfer, step: int) -> None:
        transfer.asked = time.monotonic()
        trace.event("shard_start", file=transfer.file, index=transfer.index)
        for _ in range(MAX_ATTEMPTS):
            source = await self._pick()
            if source is None:
                break
            delay = source.retry_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            started, before = time.monotonic(), transfer.received
            source.in_flight += 1
            self._mine[source.url] = self._mine.get(source.url, 0) + 1
            try:
                await self._receive(source, sink, transfer, step)
            except SourceError as exc:
                self.errors.append(str(exc))
                source.failed(exc)
                if source.banned:
                    self._ban(source, source.banned)
                if transfer.single:
                    transfer.restart()  # no Range from another source: this shard comes whole from one
                continue
            finally:
                source.in_flight -= 1
                self._mine[source.url] -= 1
                async with self._freed:
                    self._freed.notify_all()
            try:
                sink.commit(transfer.file, transfer.index, transfer.hasher.digest())
            except ShardHashMismatch as exc:
                await self._mismatch(sink, transfer, exc)
                continue
            source.succeeded(transfer.received - before, time.monotonic() - started)
            if trace.enabled():
                wait_s = round(transfer.answered - transfer.asked, 4)
                trace.event(
                    "shard_done", file=transfer.file, index=transfer.index, source=source.url, wait_s=wait_s,
                    hash_s=round(transfer.hash_seconds, 4),
                )  # fmt: skip
            if transfer.suspects:
                await self._convict_suspects(sink, transfer)
            if self.on_progress is not None:
                self.on_progress(transfer.size)
            if self.on_shard is not None:
                await self.on_shard()
            return
        raise DownloadFailed(step, self.errors)

    async def _mismatch(self, sink: PartialCheckpoint, transfer: _Transfer, exc: ShardHashMismatch) -> None:
        """Ban the one source of a bad shard; for a shard of several, note who sent what, and refetch it whole."""
        what, hash_name = f"shard {transfer.file}[{transfer.index}]", transfer.shard.hash_name
        ranges = transfer.ranges()
        senders = {url for _, _, url in ranges}
        if len(senders) == 1:
            self._ban(self._source(senders.pop()), f"sent {what} that failed its {hash_name} ({exc})", offence=True)
        elif not transfer.suspects:  # the first mixed failure: the bytes each source sent, while still held
            pieces = [(a, b) for a, b, _ in ranges]
            digests = await asyncio.to_thread(_hash_ranges, sink, transfer.file, transfer.index, pieces)
            transfer.suspects = [(a, b, url, d) for (a, b, url), d in zip(ranges, digests, strict=True)]
            self.errors.append(f"{what} from {len(senders)} sources failed its {hash_name}; fetching it from one")
        transfer.single = True
        transfer.restart()

    async def _convict_suspects(self, sink: PartialCheckpoint, transfer: _Transfer) -> None:
        """The shard is verified now: ban each source whose piece of the failed attempt differs from it."""
        pieces = [(a, b) for a, b, _, _ in transfer.suspects]
        right = await asyncio.to_thread(_hash_ranges, sink, transfer.file, transfer.index, pieces)
        what = f"shard {transfer.file}[{transfer.index}]"
        for (start, end, url, sent), digest in zip(transfer.suspects, right, strict=True):
            if sent != digest:
                self._ban(self._source(url), f"sent bytes {start}-{end - 1} of {what} that are not its", offence=True)
        transfer.suspects = []

    @staticmethod
    def _write(sink: PartialCheckpoint, transfer: _Transfer, chunks: list[bytes], size: int) -> None:
        began = time.monotonic()
        for chunk in chunks:
            transfer.hasher.update(chunk)
        transfer.hash_seconds += time.monotonic() - began
        sink.write_unverified(transfer.file, transfer.index, transfer.received, chunks)
        transfer.received += size

    async def _absorb(self, sink: PartialCheckpoint, transfer: _Transfer) -> None:
        """Hash and write the pending chunks in a worker thread (both release the GIL), in arrival order."""
        chunks, size = transfer.pending, transfer.pending_bytes
        transfer.pending, transfer.pending_bytes = [], 0
        if chunks:
            await asyncio.to_thread(self._write, sink, transfer, chunks, size)

    async def _receive(self, source: Source, sink: PartialCheckpoint, transfer: _Transfer, step: int) -> None:
        """Move the rest of the shard from `source` to disk (a Range request if some bytes are in): by splice
        where it can, through aiohttp otherwise."""
        if self._splice is not None and source.url not in self._no_splice:
            try:
                await self._receive_spliced(self._splice, source, sink, transfer, step)
                return
            except splice.Unsupported:
                self._no_splice.add(source.url)
        await self._receive_aiohttp(source, sink, transfer, step)

    def _check_status(self, source: Source, transfer: _Transfer, step: int, status: int, headers: Any) -> None:
        """Raise for an answer that carries no usable shard bytes; restart the transfer if Range was ignored."""
        what = f"shard {transfer.file}[{transfer.index}]"
        if status in (429, 503):
            raise SourceError(source.url, f"busy (HTTP {status})", busy_for=_retry_after(headers))
        if status == 404:
            self._ban(source, f"does not have {what} of step {step}")
            raise SourceError(source.url, "HTTP 404")
        if status == 200 and transfer.received:
            transfer.restart()  # the server ignored the Range: take the whole shard
        elif status == 206:
            if not headers.get("Content-Range", "").startswith(f"bytes {transfer.received}-"):
                raise SourceError(source.url, f"{what}: a 206 for another range than asked")
        elif status != 200:
            raise SourceError(source.url, f"{what}: HTTP {status}")

    async def _receive_spliced(
        self, pool: splice.ConnectionPool, source: Source, sink: PartialCheckpoint, transfer: _Transfer, step: int
    ) -> None:
        what = f"shard {transfer.file}[{transfer.index}]"
        url = shard_url(source.url, step, transfer.file, transfer.index)
        headers = {"Range": f"bytes={transfer.received}-"} if transfer.received else {}
        try:
            response = await pool.get(url, headers)
        except (OSError, TimeoutError) as exc:
            raise SourceError(source.url, f"{what}: {exc or type(exc).__name__}") from None
        transfer.answered = transfer.answered or time.monotonic()
        if response.status not in (200, 206):
            await response.discard()
        try:
            self._check_status(source, transfer, step, response.status, response.headers)
        except SourceError:
            response.close()
            raise
        if transfer.received + response.length > transfer.size:
            await response.discard()
            transfer.restart()
            self._ban(source, f"sent more than {transfer.size} bytes for {what}", offence=True)
            raise SourceError(source.url, "oversized shard")
        transfer.begin_piece(source.url)
        fd, shard_offset, _ = sink.open_target(transfer.file, transfer.index)
        start = transfer.received
        try:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:

                def absorb(offset: int, n: int) -> None:  # in the body's thread; the hash releases the GIL
                    at = shard_offset + start + offset
                    began = time.monotonic()
                    with memoryview(mapped) as view:
                        transfer.hasher.update(view[at : at + n])
                    transfer.hash_seconds += time.monotonic() - began
                    if sink.writeback:
                        start_writeback(fd, at, n)
                    transfer.received += n

                try:
                    await response.splice_into(fd, shard_offset + start, absorb, CHUNK)
                except (OSError, TimeoutError) as exc:
                    raise SourceError(source.url, f"{what}: {exc or type(exc).__name__}") from None
        finally:
            os.close(fd)
        if transfer.received < transfer.size:
            raise SourceError(source.url, f"{what} ended early")

    async def _receive_aiohttp(self, source: Source, sink: PartialCheckpoint, transfer: _Transfer, step: int) -> None:
        """Stream the rest of the shard through aiohttp: hashed and written chunk by chunk."""
        what = f"shard {transfer.file}[{transfer.index}]"
        url = shard_url(source.url, step, transfer.file, transfer.index)
        headers = {"Range": f"bytes={transfer.received}-"} if transfer.received else {}
        try:
            async with self.session.get(url, headers=headers, timeout=client_timeout()) as response:
                transfer.answered = transfer.answered or time.monotonic()
                self._check_status(source, transfer, step, response.status, response.headers)
                transfer.begin_piece(source.url)
                async for chunk, _ in response.content.iter_chunks():  # the buffers as received, never joined
                    if transfer.received + transfer.pending_bytes + len(chunk) > transfer.size:
                        transfer.restart()
                        self._ban(source, f"sent more than {transfer.size} bytes for {what}", offence=True)
                        raise SourceError(source.url, "oversized shard")
                    transfer.pending.append(chunk)
                    transfer.pending_bytes += len(chunk)
                    if transfer.pending_bytes >= CHUNK:
                        await self._absorb(sink, transfer)
                await self._absorb(sink, transfer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if transfer.pending:  # keep what arrived: the next source is asked only for the rest
                await self._absorb(sink, transfer)
            raise SourceError(source.url, f"{what}: {exc or type(exc).__name__}") from None
        if transfer.received < transfer.size:
            raise SourceError(source.url, f"{what} ended early")


def _retry_after(headers: Any) -> float:
    try:
        return min(10.0, max(0.1, float(headers.get("Retry-After", "1"))))
    except ValueError:
        return 1.0


async def wait_for_newer(
    session: aiohttp.ClientSession,
    sources: Sequence[Source],
    after: int,
    *,
    timeout: float,
    policy: TrustPolicy | None = None,
) -> None:
    """Long-poll every source until one lists a step newer than `after`; `DownloadFailed` after `timeout` s.

    With `policy`, the newer step must have a manifest the trainer signed: a source that lists newer steps
    it cannot back is not polled again (it would answer every long-poll at once with the same junk).
    """
    deadline = time.monotonic() + timeout
    polling = list(sources)
    while (left := deadline - time.monotonic()) > 0 and polling:
        polls = {
            asyncio.ensure_future(list_versions(session, s, after=after, wait=min(30.0, left))): s for s in polling
        }
        try:
            pending = set(polls)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for poll in done:
                    if poll.exception() is not None:
                        continue
                    listing = poll.result()
                    if listing.latest is None or listing.latest <= after:
                        continue
                    if policy is None or await _backs_newer(session, polls[poll], policy, after):
                        return
                    polling.remove(polls[poll])
        finally:
            for poll in polls:
                poll.cancel()
            await asyncio.gather(*polls, return_exceptions=True)
        await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))  # every source failed or timed out
    if not polling:
        raise DownloadFailed(None, [f"every source lists versions newer than {after} that the trainer did not sign"])
    raise DownloadFailed(None, [f"no version newer than {after} appeared within {timeout:g} s"])


async def _backs_newer(session: aiohttp.ClientSession, source: Source, policy: TrustPolicy, after: int) -> bool:
    try:
        await resolve_version(session, [source], policy, None, newer_than=after)
    except DownloadFailed as exc:
        log.warning("%s lists a version newer than %d but no signed one: %s", source.url, after, exc)
        return False
    return True


async def resolve_version(
    session: aiohttp.ClientSession,
    sources: Sequence[Source],
    policy: TrustPolicy,
    step: int | None,
    *,
    newer_than: int = -1,
) -> tuple[Manifest, bytes, list[Source]]:
    """The trusted manifest of `step` (None: the newest step above `newer_than` with a valid signature).

    Returns it with its signature and the sources that list it. A source whose manifest is not the
    trainer's is banned (an offence); a source that cannot back a step it lists is not asked about any
    other step, so however many junk steps a source lists, it costs one manifest request.
    """
    listings = await asyncio.gather(*(list_versions(session, s) for s in sources), return_exceptions=True)
    offers: dict[int, list[Source]] = {}
    errors: list[str] = []
    for source, listing in zip(sources, listings, strict=True):
        if isinstance(listing, SourceError):
            source.failed(listing)
        if isinstance(listing, BaseException):
            errors.append(str(listing))
            continue
        for s in listing.steps:
            offers.setdefault(s, []).append(source)
    candidates = [step] if step is not None else sorted((s for s in offers if s > newer_than), reverse=True)
    doubted: set[str] = set()  # sources that listed a step they could not back, by url
    for candidate in candidates:
        for source in offers.get(candidate, []):
            if source.banned or source.url in doubted:
                continue
            try:
                manifest, signature = await fetch_manifest(session, source, candidate, policy)
            except UntrustedManifest as exc:
                source.convict(str(exc))
                doubted.add(source.url)
                errors.append(str(exc))
                continue
            except SourceError as exc:
                doubted.add(source.url)
                errors.append(str(exc))
                continue
            having = [s for s in offers[candidate] if s.banned is None]
            return manifest, signature, having
    newer = f" newer than {newer_than}" if newer_than >= 0 else ""
    raise DownloadFailed(step, errors or [f"no source offers a version{newer}"])


@dataclass
class FetchReport:
    """How `fetch_checkpoint` got a step: which held step its deltas started from, how many it applied, and the bytes
    that came as deltas, were rebuilt from them, and came whole."""

    step: int | None = None
    base_step: int | None = None  # None: no delta was used
    links: int = 0  # deltas applied: 1, the step's own; more, a chain
    delta_bytes: int = 0  # delta files downloaded (or resumed)
    rebuilt_bytes: int = 0  # checkpoint bytes rebuilt from deltas and verified
    whole_bytes: int = 0  # checkpoint bytes downloaded as they are
    apply_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)  # why a delta, or part of one, was not used


async def fetch_checkpoint(
    sources: Sequence[str] | SourcePool,
    policy: TrustPolicy,
    out_dir: str | Path,
    *,
    step: int | None = None,
    after: int | None = None,
    wait: float = 3600.0,
    parallel: int = 8,
    on_start: Callable[[Manifest, int], None] | None = None,
    on_progress: Progress | None = None,
    delta: bool = True,
    report: FetchReport | None = None,
) -> Path:
    """Download a trusted checkpoint to `out_dir/step_<N>/`, atomically; returns that path.

    An existing `step_<N>` is returned as is (it was published only after every byte verified). With `after`, it
    first waits up to `wait` s for a version newer than `after` and takes the newest such one. With `delta`, a step
    `out_dir` holds is the base of the step's deltas when they are fewer bytes (`_rebuild`); the folder keeps the
    signed manifest (`SIGNED_MANIFEST_NAME`) so that it can be a base in turn. `on_start(manifest,
    bytes_already_done)` is called once the manifest is trusted; `on_progress` counts checkpoint bytes verified, rebuilt
    or downloaded; `report` is filled in. With a `SourcePool`, the download starts from the pool's measurements and
    its outcome scores the pool's learned sources.
    """
    pool = sources.checkout() if isinstance(sources, SourcePool) else [Source(url) for url in sources]
    out = Path(out_dir)
    report = report if report is not None else FetchReport()
    try:
        async with new_session() as session:
            if after is not None:
                await wait_for_newer(session, pool, after, timeout=wait, policy=policy)
            newer_than = -1 if after is None else after
            manifest, _, having = await resolve_version(session, pool, policy, step, newer_than=newer_than)
            report.step = manifest.step
            target = out / f"{STEP_DIR_PREFIX}{manifest.step}"
            if target.exists():
                return target
            checkpoint = manifest.view(manifest.checkpoint_files)
            sink = PartialCheckpoint(target, checkpoint)
            trace.event("manifest", step=manifest.step, bytes=manifest.checkpoint_size)
            try:
                if on_start is not None:
                    on_start(manifest, sink.done_bytes)
                if delta and manifest.delta is not None and sink.missing():
                    await _rebuild(session, having, policy, manifest, sink, parallel=parallel, report=report)
                    if on_progress is not None and report.rebuilt_bytes:
                        on_progress(report.rebuilt_bytes)

                def progress(size: int) -> None:
                    report.whole_bytes += size
                    if on_progress is not None:
                        on_progress(size)

                downloader = Downloader(session, having, parallel=parallel, on_progress=progress)
                for _ in range(2):  # a second round only if a whole-file check sends shards back
                    await downloader.download(sink)
                    try:
                        path = await asyncio.to_thread(sink.finish, verify_files=False)
                    except RelayError as exc:
                        if not sink.missing():
                            raise
                        log.warning("re-fetching shards after a failed file check: %s", exc)
                        continue
                    # the manifest it was fetched by, as a later step's delta base; not fsynced (a worker fetches
                    # every step): lost in a crash, the folder is only no base, and the next step comes whole
                    (path / SIGNED_MANIFEST_NAME).write_bytes(encode_manifest(manifest))
                    return path
                raise DownloadFailed(manifest.step, downloader.errors)
            finally:
                trace.event("fetched", step=manifest.step, bytes=report.whole_bytes)
                sink.close()
    finally:
        if isinstance(sources, SourcePool):
            sources.settle(pool)


async def _rebuild(
    session: aiohttp.ClientSession,
    sources: Sequence[Source],
    policy: TrustPolicy,
    manifest: Manifest,
    sink: PartialCheckpoint,
    *,
    parallel: int,
    report: FetchReport,
) -> None:
    """Rebuild what it can of `sink` from deltas, starting at a step the sink's folder holds; the rest stays missing,
    for the caller to fetch whole. Any failure (no base, a delta that does not download, apply or verify) costs only
    the bytes already spent on it: it is logged in `report.problems`, never raised."""
    out = sink.target.parent
    sizes = {(f.name, s.index): s.size for f in sink.manifest.files for s in f.shards}
    missing = sum(sizes[key] for key in sink.missing())
    try:
        plan = await _delta_plan(session, sources, policy, out, manifest, budget=missing)
    except (RelayError, OSError) as exc:  # a held folder's manifest unreadable, say
        plan = f"no plan: {exc}"
    if isinstance(plan, str):
        report.problems.append(plan)
        log.info("step %d whole: %s", manifest.step, plan)
        return
    base_dir, base, links = plan
    report.base_step, report.links = base.step, len(links)
    current = base_files(base, base_dir)
    folders: list[Path] = []
    assert manifest.delta is not None  # the plan's last link is the step itself
    released = [name for name in manifest.delta.targets if name in current and sink.release_file(name)]
    try:
        for i, link in enumerate(links):
            folders.append(partial_path(_deltas_folder(out, link.step)))
            report.delta_bytes += await _fetch_deltas(session, sources, out, link, parallel=parallel)
            began = time.monotonic()
            last = i == len(links) - 1
            current, problems = await asyncio.to_thread(apply_link, link, folders[-1], current, verify=not last)
            report.problems += problems
            if last:
                taken, unverified = await asyncio.to_thread(take_rebuilt, sink, current)
                report.rebuilt_bytes += taken
                report.problems += unverified
                for problem in unverified:
                    log.warning("step %d: %s", manifest.step, problem)
            report.apply_seconds += time.monotonic() - began
    except (RelayError, OSError) as exc:  # DownloadFailed included; a disk that filled up
        report.problems.append(f"deltas not used: {exc}")
        log.warning("step %d: deltas not used (%s); fetching what is missing whole", manifest.step, exc)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        for name in released:  # those not rebuilt are downloaded into their full size, allocated up front again
            sink.allocate_file(name)
    trace.event(
        "rebuilt", step=manifest.step, base=base.step, links=len(links), bytes=report.rebuilt_bytes,
        delta_bytes=report.delta_bytes, apply_s=round(report.apply_seconds, 4),
    )  # fmt: skip


def _deltas_folder(out: Path, step: int) -> Path:
    """Where a client assembles a step's delta files (a `PartialCheckpoint` target, never published)."""
    return out / f"{STEP_DIR_PREFIX}{step}.delta"


async def _delta_plan(
    session: aiohttp.ClientSession,
    sources: Sequence[Source],
    policy: TrustPolicy,
    out: Path,
    manifest: Manifest,
    *,
    budget: int,
) -> tuple[Path, Manifest, list[Manifest]] | str:
    """(a held step's folder, its signed manifest, the manifests whose deltas lead from it to `manifest`, oldest
    first), or why there is none: no held step is the base of the step's delta or of a chain of at most `MAX_CHAIN`
    deltas whose bytes are under `budget`, or a manifest of the chain is not to be had signed."""
    held = held_bases(out, STEP_DIR_PREFIX)
    links = [manifest]
    spent = manifest.delta_size
    link = manifest
    while link.delta is not None and spent < budget and len(links) <= MAX_CHAIN:
        folder = held.get(link.delta.base_manifest)
        if folder is not None:
            base = parse_manifest((folder / SIGNED_MANIFEST_NAME).read_bytes(), max_bytes=MAX_MANIFEST_BYTES)
            return folder, base, links[::-1]
        try:
            older = await _signed_manifest(session, sources, policy, link.delta.base_step)
        except RelayError as exc:
            return f"the base of step {link.step}'s delta, step {link.delta.base_step}, is not to be had: {exc}"
        if manifest_hash(older) != link.delta.base_manifest:
            return f"step {link.step}'s delta names another manifest of step {older.step} than its sources sign"
        links.append(older)
        spent += older.delta_size
        link = older
    if link.delta is None:
        return f"no step held here is a base of step {manifest.step}'s deltas (step {link.step} has none)"
    return f"a chain of deltas from a step held here is not fewer bytes than step {manifest.step} whole"


async def _signed_manifest(
    session: aiohttp.ClientSession, sources: Sequence[Source], policy: TrustPolicy, step: int
) -> Manifest:
    """The trainer-signed manifest of `step` from the first source that has it; `DownloadFailed` if none has."""
    errors = []
    for source in sources:
        if source.banned is not None:
            continue
        try:
            manifest, _ = await fetch_manifest(session, source, step, policy)
            return manifest
        except UntrustedManifest as exc:
            source.convict(str(exc))
            errors.append(str(exc))
        except SourceError as exc:
            errors.append(str(exc))
    raise DownloadFailed(step, errors)


async def _fetch_deltas(
    session: aiohttp.ClientSession, sources: Sequence[Source], out: Path, link: Manifest, *, parallel: int
) -> int:
    """Download `link`'s delta files into `<out>/step_<N>.delta.partial/` (resumed if a killed run left them); returns
    their bytes. Each source is asked through a copy, so that a source that no longer holds an older step is dropped
    from this download only; what the copies measured and any offence go back to the source."""
    deltas = PartialCheckpoint(_deltas_folder(out, link.step), link.view(link.delta_files), writeback=False)
    copies = [Source(s.url, throughput=s.throughput) for s in sources if s.banned is None]
    try:
        downloader = Downloader(session, copies, parallel=parallel)
        await downloader.download(deltas)
    finally:
        deltas.close()
        for copy in copies:
            source = next(s for s in sources if s.url == copy.url)
            source.received += copy.received
            source.throughput = copy.throughput or source.throughput
            if copy.offence is not None:
                source.convict(copy.offence)
    return link.delta_size
