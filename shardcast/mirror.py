"""The relay's side of SHARDCAST: mirror versions from upstream servers (the origin or other relays).

One long-poll per upstream on `/versions?after=N` learns of a new step within a round trip of its
publication. A listed step counts only once its manifest is verified (the trainer's signature, when a
`TrustPolicy` is given): the mirror checks an upstream's listed steps newest first, at most `keep + 2` per
listing, and remembers the ones that upstream could not back, so junk step numbers from one upstream never
crowd real steps out of the newest `keep`. For each verified step among those, it announces the version at
once and downloads its shards from every upstream that lists it, each shard verified before it is served.
Downstream relays and clients therefore start pulling a version while it is still arriving here. A step with a
delta against a step this relay holds is rebuilt from the delta (`_rebuild`): only the delta crosses the link.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import aiohttp

from shardcast import RelayError, SourceError, UntrustedManifest, VersionExists, trace
from shardcast.client import Downloader, fetch_manifest, list_versions, new_session
from shardcast.manifest import Manifest, manifest_hash
from shardcast.partial import PartialCheckpoint
from shardcast.rebuild import apply_link, base_files, take_rebuilt
from shardcast.server import ShardServer
from shardcast.sources import MAX_FAILURES, Source
from shardcast.trust import TrustPolicy

log = logging.getLogger(__name__)

LONG_POLL_S = 30.0
MAX_TRIES = 3  # manifest requests for one step an upstream lists before that step of that upstream is ignored
MAX_REMEMBERED = 4096  # steps remembered per upstream as not backed (the lowest are forgotten first)
FINISH_QUIET = 0.5  # seconds without a shard of a mirrored version served before it is fsynced and renamed
FINISH_WAIT = 30.0  # ... but no longer than this after its last shard was verified


class Mirror:
    def __init__(
        self,
        server: ShardServer,
        upstreams: list[str],
        *,
        policy: TrustPolicy | None,
        keep: int = 3,
        parallel: int = 8,
    ) -> None:
        if not upstreams:
            raise RelayError("a relay needs at least one upstream")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.server = server
        self.store = server.store
        self.upstreams = [Source(url) for url in upstreams]
        self.policy, self.keep, self.parallel = policy, keep, parallel
        self._offers: dict[str, frozenset[int]] = {}  # upstream url -> steps it listed last
        self._verified: dict[int, tuple[Manifest, bytes]] = {}  # steps not held yet whose manifest checked out
        self._tries: dict[str, dict[int, int]] = {}  # upstream url -> step -> failed manifest requests
        self._active: dict[int, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self.failures = server.metrics.counter("shardcast_mirror_failures_total", "Failed attempts to mirror a step.")
        self.mirrored = server.metrics.counter("shardcast_mirrored_versions_total", "Versions mirrored completely.")

    async def run(self) -> None:
        """Follow every upstream until cancelled."""
        async with new_session() as self._session:
            try:
                await asyncio.gather(*(self._follow(upstream) for upstream in self.upstreams))
            finally:
                for task in self._active.values():
                    task.cancel()
                await asyncio.gather(*self._active.values(), return_exceptions=True)

    async def _follow(self, upstream: Source) -> None:
        assert self._session is not None
        after: int | None = None
        backoff = penalty = 0.5
        while True:
            asked_at = time.monotonic()
            try:
                listing = await list_versions(self._session, upstream, after=after, wait=LONG_POLL_S)
            except SourceError as exc:
                log.warning("upstream %s: %s; retrying in %.1f s", upstream.url, exc.reason, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                after = None  # ask for the current list once it answers again
                continue
            backoff = 0.5
            if upstream.failures >= MAX_FAILURES:  # dropped for failing to answer; it answers again
                upstream.failures, upstream.banned = 0, None
            news = listing.steps != self._offers.get(upstream.url)
            self._offers[upstream.url] = listing.steps
            after = listing.latest if listing.latest is not None else -1
            refused = await self._verify(upstream, listing.steps)
            self._start_new()
            if refused:  # list again soon (a request may have failed by chance), but not in a tight loop
                after = None
                await asyncio.sleep(penalty)
                penalty = min(penalty * 2, 10.0)
            else:
                penalty = 0.5
                if not news and time.monotonic() - asked_at < 1.0:  # a long-poll answered at once with nothing new
                    await asyncio.sleep(1.0)

    def _held(self) -> set[int]:
        return set(self.store.versions()) | set(self._active)

    def _floor(self, held: set[int]) -> int:
        """The step a new one must be above to be among the newest `keep` (-1 while fewer are known)."""
        known = sorted(held | set(self._verified))
        return known[-self.keep] if len(known) >= self.keep else -1

    async def _verify(self, upstream: Source, offered: frozenset[int]) -> int:
        """Check the manifests of the newest steps `upstream` lists that would be among the newest `keep`;
        returns how many it could not back.

        At most `keep + 2` requests per listing. A step whose manifest is untrusted is never asked of this
        upstream again; one whose request failed is asked again, `MAX_TRIES` times in all.
        """
        assert self._session is not None
        tries = self._tries.setdefault(upstream.url, {})
        held = self._held()
        floor, asked, refused = self._floor(held), 0, 0
        for step in sorted(offered, reverse=True):
            if step <= floor or asked >= self.keep + 2:
                break
            if step in self._verified or step in held or tries.get(step, 0) >= MAX_TRIES:
                continue
            asked += 1
            try:
                self._verified[step] = await fetch_manifest(self._session, upstream, step, self.policy)
            except UntrustedManifest as exc:
                log.error("upstream %s sent an untrusted manifest: %s", upstream.url, exc)
                tries[step] = MAX_TRIES
                refused += 1
                continue
            except SourceError as exc:
                log.warning("%s", exc)
                tries[step] = tries.get(step, 0) + 1
                refused += 1
                continue
            held = self._held()
            floor = self._floor(held)
        floor = self._floor(self._held())
        for url_tries in self._tries.values():  # below the newest `keep` no longer matters; the rest is bounded
            for step in [s for s in url_tries if s <= floor] + sorted(url_tries)[:-MAX_REMEMBERED]:
                url_tries.pop(step, None)
        return refused

    def _start_new(self) -> None:
        held = self._held()
        wanted = sorted(held | set(self._verified))[-self.keep :]
        for step in list(self._verified):
            if step not in wanted and step not in self._active:
                del self._verified[step]
        for step in wanted:
            if step not in held:
                self._active[step] = asyncio.create_task(self._mirror(step))

    async def _mirror(self, step: int) -> None:
        try:
            for attempt in range(5):
                try:
                    await self._mirror_once(step)
                    self.mirrored.inc()
                    return
                except VersionExists:
                    return
                except (RelayError, OSError) as exc:
                    self.failures.inc()
                    log.warning("mirroring step %d failed (attempt %d): %s", step, attempt + 1, exc)
                    await asyncio.sleep(min(0.5 * 2**attempt, 10.0))
            log.error("giving up on step %d after 5 attempts", step)
            self.store.abandon_version(step)
            await self.server.notify()
        except asyncio.CancelledError:
            partial = self.store.incoming_version(step)
            if partial is not None:
                partial.close()  # its directory stays: a restarted relay resumes it
            raise
        finally:
            self._active.pop(step, None)
            self._verified.pop(step, None)

    async def _rebuild(self, manifest: Manifest, partial: PartialCheckpoint, downloader: Downloader) -> None:
        """Rebuild the step's files from its delta when this relay holds the base: the delta files first (as for any
        step), then each file applied to the base's and taken into `partial` shard by shard, each shard only if it
        hashes to the signed manifest, and served from then on; what did not rebuild is downloaded whole afterwards.
        A relay tree then moves each step's delta between relays, not the step. Failures cost only the delta."""
        assert manifest.delta is not None
        base = manifest.delta.base_step
        try:
            if manifest_hash(self.store.manifest(base)) != manifest.delta.base_manifest:
                return  # another base under the same step number (another run): the step comes whole
            base_dir = self.store.version_dir(base)
        except RelayError:
            return  # not held here (never was, or pruned): the step comes whole
        await downloader.download(partial, {f.name for f in manifest.delta_files})
        began = time.monotonic()
        scratch = Path(tempfile.mkdtemp(dir=self.store.root / "tmp", prefix=f"{manifest.step}.delta."))
        try:
            base_manifest = self.store.manifest(base)
            taken, problems = await asyncio.to_thread(_rebuild_into, partial, base_dir, base_manifest, scratch)
        except (RelayError, OSError) as exc:  # the base pruned meanwhile, a disk that filled up
            taken, problems = 0, [f"deltas not used: {exc}"]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        await self.server.notify()
        for problem in problems:
            log.warning("step %d: %s; those shards come whole", manifest.step, problem)
        trace.event("rebuilt", step=manifest.step, base=base, bytes=taken, apply_s=round(time.monotonic() - began, 4))

    async def _until_quiet(self, step: int) -> None:
        """Wait, up to `FINISH_WAIT` s, until no shard of `step` has been served for `FINISH_QUIET` s.

        Every shard of the version is verified and served already; what `finish_version` adds is durability (an
        fsync of the whole version, then the rename). That fsync took the disk and the file system's journal from
        this relay's clients while they were still receiving and renaming their own copies (measured on one
        machine: their renames waited 0.15 s for it), so it runs once they are done, and at the latest after
        `FINISH_WAIT` s. Until then the version is listed as incoming and served from its partial folder; a crash
        meanwhile costs a re-hash of its shards on restart, never a byte."""
        deadline = time.monotonic() + FINISH_WAIT
        while (idle := self.server.idle_for(step)) < FINISH_QUIET and time.monotonic() < deadline:
            await asyncio.sleep(FINISH_QUIET - idle)

    async def _mirror_once(self, step: int) -> None:
        assert self._session is not None
        having = [u for u in self.upstreams if step in self._offers.get(u.url, frozenset()) and u.banned is None]
        if not having:
            raise RelayError(f"no upstream lists step {step} any more")
        if step not in self._verified:
            raise RelayError(f"step {step} is no longer among the newest {self.keep} verified")
        manifest, signature = self._verified[step]
        partial = self.store.begin_version(manifest, signature)  # the same one again on a retry
        trace.event("manifest", step=step, bytes=manifest.total_size)
        await self.server.notify()
        downloader = Downloader(self._session, having, parallel=self.parallel, on_shard=self.server.notify)
        if manifest.delta is not None:
            await self._rebuild(manifest, partial, downloader)
        await downloader.download(partial)
        await self._until_quiet(step)
        await asyncio.to_thread(self.store.finish_version, partial)
        await self.server.notify()
        log.info("mirrored step %d (%d bytes)", step, manifest.total_size)
        for pruned in await asyncio.to_thread(self.store.prune, self.keep):
            task = self._active.get(pruned)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await self.server.notify()


def _rebuild_into(partial: PartialCheckpoint, base_dir: Path, base: Manifest, scratch: Path) -> tuple[int, list[str]]:
    """The delta files of `partial`'s manifest copied out of it (they may be held in memory), applied to the base's
    files in `scratch`, and taken into `partial`; returns (bytes taken, what went wrong)."""
    manifest = partial.manifest
    for mf in manifest.delta_files:
        with open(scratch / mf.name, "wb") as out:
            for shard in mf.shards:
                opened = partial.open_verified(mf.name, shard.index)
                if opened is None:
                    return 0, [f"{mf.name}[{shard.index}] is not verified"]
                with opened:
                    data = os.pread(opened.fileno(), shard.size, shard.offset)
                if len(data) != shard.size:
                    return 0, [f"{mf.name}[{shard.index}] read short"]
                out.write(data)
    rebuilt, problems = apply_link(manifest, scratch, base_files(base, base_dir), verify=False)
    taken, unverified = take_rebuilt(partial, rebuilt)
    return taken, problems + unverified
