"""The trainer's gossip (`[p2p]` in trainer.toml): a libp2p host with the trainer's key, the pool's bootstrap peer.

After the origin publishes a version, `announce` publishes `Checkpoint(poolId, step, manifestHash)` on
`/prime/<pool>/checkpoints`, signed with the trainer's key under the pool's domain: the same message, and the
same signature, as the manifest's `X-Shardcast-Signature` (shardcast/trust.py). Workers that hear it prefetch
the step before the coordinator hands it out.

The host also subscribes to the pool's relay, attestation and validator topics. It does nothing with those messages
beyond a debug line, but gossipsub forwards only the topics a host subscribes to, so a pool whose only bootstrap
peer is the trainer would otherwise never carry a relay advert, an attestation or a validator's heartbeat from one
node to another.
"""

from __future__ import annotations

import asyncio
import logging

from eth_account.signers.local import LocalAccount

from core.metrics import Registry
from core.signals import cancel_and_wait
from p2p import (
    P2PConfig,
    P2PError,
    P2PNode,
    Subscription,
    attestations_topic,
    checkpoints_topic,
    relays_topic,
    validators_topic,
)
from protocol.signing import SigningDomain
from shardcast.manifest import Manifest
from shardcast.trust import checkpoint_message

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0


class TrainerGossip:
    """Announces each checkpoint the origin publishes; forwards the pool's other topics. Start once, stop once."""

    def __init__(
        self,
        account: LocalAccount,
        domain: SigningDomain,
        pool_id: int,
        *,
        host: str,
        port: int,
        registry: Registry | None = None,
    ) -> None:
        self.node = P2PNode(account, domain, P2PConfig(listen_host=host, listen_port=port), registry=registry)
        self.pool_id = pool_id
        self._drains: list[asyncio.Task[None]] = []

    @property
    def listen_addr(self) -> str:
        return self.node.listen_addrs[0]

    async def start(self) -> None:
        await self.node.start()
        for topic in (relays_topic(self.pool_id), attestations_topic(self.pool_id), validators_topic(self.pool_id)):
            self._drains.append(asyncio.create_task(_drain(await self.node.subscribe(topic))))

    async def stop(self) -> None:
        await cancel_and_wait(self._drains)
        await self.node.stop()

    async def announce(self, manifest: Manifest) -> bool:
        """Publishes the signed announcement of `manifest`; False (logged) if it could not be sent."""
        checkpoint = checkpoint_message(manifest)
        topic = checkpoints_topic(self.pool_id)
        try:
            await asyncio.wait_for(self.node.publish(topic, checkpoint), PUBLISH_TIMEOUT_S)
        except (P2PError, TimeoutError) as exc:
            log.warning("could not announce step %d on %s: %s", manifest.step, topic, exc)
            return False
        log.info("announced step %d (manifest 0x%s) on %s", manifest.step, checkpoint.manifest_hash.hex()[:12], topic)
        return True


async def _drain(subscription: Subscription) -> None:
    async for received in subscription:
        log.debug("%s from %s on %s", received.message.type_name, received.signer, received.topic)
