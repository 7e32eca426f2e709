"""The worker's gossip: checkpoint announcements to prefetch, relay adverts to fetch from (docs/worker.md).

Service layer over `p2p.P2PNode` (DESIGN section 10):
- `/prime/<pool>/checkpoints`: an announcement signed by the pool's trainer of a step newer than the weights
  held starts a background `Weights.hold(step)`, so the next assignment of that step finds it loaded. Any
  other signer is ignored (the transport only proved the signer is the sending peer, not that it may sign).
- `/prime/<pool>/relays`: each advertised http(s) URL is offered to the checkpoint sources' `SourcePool`, which
  caps, scores and expires learned sources (shardcast/sources.py: a hostile advert costs at most a few failed
  fetches, never an honest source's ban); with `--relay` this node advertises its own relay every `ADVERT_EVERY_S`.

Gossip only ever helps: every failure here is logged, and the loop of `node.daemon.worker` goes on without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from core.signals import cancel_and_wait
from node.daemon.weights import Weights
from p2p import P2PError, P2PNode, Received, RelayAdvert, checkpoints_topic, relays_topic
from p2p.bootstrap import dial_bootstrap, keep_bootstrapped
from protocol.signing import Checkpoint, SignatureError
from shardcast.sources import SourcePool

log = logging.getLogger("node.worker")

ADVERT_EVERY_S = 30.0
PUBLISH_TIMEOUT_S = 10.0


def worth_prefetching(received: Received, *, pool_id: int, trainer: str, held: int | None) -> Checkpoint | None:
    """The checkpoint `received` announces if it is worth prefetching: one of `pool_id`, signed by `trainer`,
    of a step newer than the step `held` (None: nothing held yet). None otherwise."""
    payload = received.message.payload
    if not isinstance(payload, Checkpoint) or payload.pool_id != pool_id:
        return None
    if received.signer != trainer:
        log.warning("ignored a checkpoint announcement of step %d signed by %s, not the trainer", payload.step,
                    received.signer)  # fmt: skip
        return None
    return payload if held is None or payload.step > held else None


@dataclass
class WorkerGossip:
    """Reads announcements and adverts for one worker; publishes its relay's advert. Owns the host once started."""

    node: P2PNode
    pool_id: int
    trainer: str
    weights: Weights
    relays: SourcePool  # the checkpoint sources `weights` fetches from; its own relay is one of the configured
    bootstrap: tuple[str, ...] = ()  # dialled at start, and again whenever no peer is left
    relay_url: str | None = None  # this node's relay, advertised every ADVERT_EVERY_S
    bytes_served: Callable[[], float] | None = None  # the relay's shard bytes sent so far, for its throughput

    def __post_init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Subscribes, then dials the bootstrap peers (so the first exchange already carries the subscriptions)."""
        announcements = await self.node.subscribe(checkpoints_topic(self.pool_id))
        adverts = await self.node.subscribe(relays_topic(self.pool_id))
        self._tasks = [
            asyncio.create_task(self._follow_announcements(announcements)),
            asyncio.create_task(self._follow_adverts(adverts)),
        ]
        await dial_bootstrap(self.node, self.bootstrap)
        self._tasks.append(asyncio.create_task(keep_bootstrapped(self.node, self.bootstrap)))
        if self.relay_url is not None:
            self._tasks.append(asyncio.create_task(self._advertise(self.relay_url)))

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        await self.node.stop()

    async def _follow_announcements(self, announcements: AsyncIterator[Received]) -> None:
        async for received in announcements:
            checkpoint = worth_prefetching(received, pool_id=self.pool_id, trainer=self.trainer, held=self.weights.step)
            if checkpoint is None:
                continue
            step, announced_hash = checkpoint.step, checkpoint.manifest_hash
            log.info("announced: step %d (manifest 0x%s)", step, announced_hash.hex()[:12])
            started = time.perf_counter()
            try:
                await self.weights.hold(step)
            except Exception as exc:  # a source down, a version pruned: the loop fetches on demand instead
                log.warning("prefetching step %d failed; it is fetched when assigned: %s", step, exc)
                continue
            if self.weights.step == step and self.weights.manifest_hash != announced_hash:
                log.warning("step %d: the sources serve manifest 0x%s, the trainer announced 0x%s", step,
                            self.weights.manifest_hash.hex()[:12], announced_hash.hex()[:12])  # fmt: skip
            log.info("prefetched step %d in %.1f s", step, time.perf_counter() - started)

    async def _follow_adverts(self, adverts: AsyncIterator[Received]) -> None:
        async for received in adverts:
            payload = received.message.payload
            if isinstance(payload, RelayAdvert) and self.relays.advertise(payload.url, received.signer):
                log.info("relay advertised by %s: %s (%.1f MB/s); checkpoint sources now %s", received.signer,
                         payload.url, payload.throughput_mb_s, ", ".join(self.relays.urls()))  # fmt: skip

    async def _advertise(self, url: str) -> None:
        topic = relays_topic(self.pool_id)
        last_bytes, last_time = self._served(), time.monotonic()
        while True:
            with contextlib.suppress(P2PError, TimeoutError):  # nobody on the topic yet: advertise anyway
                await self.node.wait_for_topic_peers(topic, 1, timeout=ADVERT_EVERY_S / 3)
            served, now = self._served(), time.monotonic()
            kbps = int((served - last_bytes) / max(now - last_time, 1e-3) / 1000)
            last_bytes, last_time = served, now
            try:
                advert = RelayAdvert(self.pool_id, url, kbps, int(time.time()))
                await asyncio.wait_for(self.node.publish(topic, advert), PUBLISH_TIMEOUT_S)
            except (P2PError, SignatureError, TimeoutError) as exc:
                log.warning("could not advertise the relay %s: %s", url, exc)
            await asyncio.sleep(ADVERT_EVERY_S)

    def _served(self) -> float:
        return self.bytes_served() if self.bytes_served is not None else 0.0
