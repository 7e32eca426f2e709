"""The validator's gossip: each attestation it posts to the coordinator is also published on the pool's topic.

`/prime/<pool>/attestations` carries `Attestation(poolId, workKey, accepted, reason)` signed with the
validator's key, the same message and signature the coordinator receives, so any peer (a trainer, a worker
watching its own files, a monitor) can check who said what. The coordinator stays the record the trainer
trains from; gossip is best effort: a failed publish is logged, never retried, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from eth_account.signers.local import LocalAccount

from node.metrics import Registry
from node.p2p import P2PConfig, P2PError, P2PNode, attestations_topic
from node.p2p.bootstrap import dial_bootstrap, keep_bootstrapped
from node.signing import Attestation, SigningDomain

log = logging.getLogger("validator.daemon")

PUBLISH_TIMEOUT_S = 10.0


class AttestationGossip:
    """A libp2p host with the validator's key that publishes attestations; start once, stop once."""

    def __init__(
        self,
        account: LocalAccount,
        domain: SigningDomain,
        pool_id: int,
        *,
        port: int,
        host: str = "127.0.0.1",
        bootstrap: Sequence[str] = (),
        registry: Registry | None = None,
    ) -> None:
        self.node = P2PNode(account, domain, P2PConfig(listen_host=host, listen_port=port), registry=registry)
        self.topic = attestations_topic(pool_id)
        self.bootstrap = tuple(bootstrap)
        self._redial: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.node.start()
        await dial_bootstrap(self.node, self.bootstrap)
        self._redial = asyncio.create_task(keep_bootstrapped(self.node, self.bootstrap))

    async def stop(self) -> None:
        if self._redial is not None:
            self._redial.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._redial
        await self.node.stop()

    async def publish(self, attestation: Attestation) -> bool:
        """Publishes `attestation`; False (logged) if it could not be sent."""
        short = "0x" + attestation.work_key.hex()[:12]
        try:
            await asyncio.wait_for(self.node.publish(self.topic, attestation), PUBLISH_TIMEOUT_S)
        except (P2PError, TimeoutError) as exc:
            log.warning("%s: could not publish the attestation on %s: %s", short, self.topic, exc)
            return False
        log.info("%s: attestation published on %s", short, self.topic)
        return True
