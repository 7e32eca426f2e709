"""The relay's side of SHARDCAST: mirror versions from upstream servers (the origin or other relays).

One long-poll per upstream on `/versions?after=N` learns of a new step within a round trip of its
publication. For each new step among the newest `keep`, the mirror fetches the manifest (checking the
trainer's signature when a `TrustPolicy` is given), announces the version at once, and downloads its
shards from every upstream that lists it, each shard verified before it is served. Downstream relays
and clients therefore start pulling a version while it is still arriving here.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from node.relay import RelayError, SourceError, UntrustedManifest, VersionExists
from node.relay.client import MAX_FAILURES, Downloader, Source, fetch_manifest, list_versions, new_session
from node.relay.server import ShardServer
from node.relay.trust import TrustPolicy

log = logging.getLogger(__name__)

LONG_POLL_S = 30.0


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
        backoff = 0.5
        while True:
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
            self._offers[upstream.url] = listing.steps
            after = listing.latest if listing.latest is not None else -1
            self._start_new(listing.steps)

    def _start_new(self, offered: frozenset[int]) -> None:
        held = set(self.store.versions()) | set(self._active)
        wanted = sorted(held | offered)[-self.keep :]
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

    async def _mirror_once(self, step: int) -> None:
        assert self._session is not None
        having = [u for u in self.upstreams if step in self._offers.get(u.url, frozenset()) and u.banned is None]
        if not having:
            raise RelayError(f"no upstream lists step {step} any more")
        manifest = signature = None
        for upstream in having:
            try:
                manifest, signature = await fetch_manifest(self._session, upstream, step, self.policy)
                break
            except UntrustedManifest as exc:
                log.error("upstream %s sent an untrusted manifest: %s", upstream.url, exc)
                upstream.banned = str(exc)
            except SourceError as exc:
                log.warning("%s", exc)
        if manifest is None or signature is None:
            raise RelayError(f"no upstream gave a usable manifest of step {step}")
        partial = self.store.begin_version(manifest, signature)  # the same one again on a retry
        await self.server.notify()
        downloader = Downloader(self._session, having, parallel=self.parallel, on_shard=self.server.notify)
        await downloader.download(partial)
        await asyncio.to_thread(self.store.finish_version, partial)
        await self.server.notify()
        log.info("mirrored step %d (%d bytes)", step, manifest.total_size)
        for pruned in await asyncio.to_thread(self.store.prune, self.keep):
            task = self._active.get(pruned)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await self.server.notify()
