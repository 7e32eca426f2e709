"""The validator's gossip: its attestations and heartbeats out, the other validators' in.

`/prime/<pool>/attestations` carries `Attestation(poolId, workKey, accepted, reason)` signed with the
validator's key, the same message and signature the coordinator receives, so any peer (a trainer, a worker
watching its own files, a monitor) can check who said what. `/prime/<pool>/validators` carries a signed
`ValidatorHeartbeat` every `heartbeat_seconds`.

Validators that share a pool (validator.sharing) read both topics: a heartbeat keeps its sender alive in this
validator's `Peers`, and another validator's attestation tells this one that a key is judged. The coordinator
stays the record the trainer trains from; gossip is best effort: a failed publish is logged, never retried, never
fatal, and what a lost message would have said is asked of the coordinator before any takeover verifies a key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from eth_account.signers.local import LocalAccount

from core.metrics import Registry
from core.signals import cancel_and_wait
from p2p import (
    P2PConfig,
    P2PError,
    P2PNode,
    Received,
    Subscription,
    ValidatorHeartbeat,
    attestations_topic,
    validators_topic,
)
from p2p.bootstrap import dial_bootstrap, keep_bootstrapped
from protocol.signing import Attestation, SigningDomain

log = logging.getLogger("validator.daemon")

PUBLISH_TIMEOUT_S = 10.0

OnHeartbeat = Callable[[str, ValidatorHeartbeat], None]  # (signer, heartbeat)
OnAttestation = Callable[[str, Attestation], None]  # (signer, attestation)


class ValidatorGossip:
    """A libp2p host with the validator's key; start once, stop once.

    `heartbeat` builds this validator's next heartbeat (None: send none yet); `on_heartbeat` and `on_attestation`
    receive the other validators' messages, signer checked by the transport (whether the signer is appointed is
    the caller's check).
    """

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
        heartbeat: Callable[[], ValidatorHeartbeat] | None = None,
        heartbeat_seconds: float = 5.0,
        on_heartbeat: OnHeartbeat | None = None,
        on_attestation: OnAttestation | None = None,
    ) -> None:
        self.node = P2PNode(account, domain, P2PConfig(listen_host=host, listen_port=port), registry=registry)
        self.pool_id = pool_id
        self.topic = attestations_topic(pool_id)
        self.bootstrap = tuple(bootstrap)
        self.heartbeat, self.heartbeat_seconds = heartbeat, heartbeat_seconds
        self.on_heartbeat, self.on_attestation = on_heartbeat, on_attestation
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def listen_addr(self) -> str:
        return self.node.listen_addrs[0]

    async def start(self) -> None:
        await self.node.start()
        await dial_bootstrap(self.node, self.bootstrap)
        self._tasks.append(asyncio.create_task(keep_bootstrapped(self.node, self.bootstrap)))
        if self.on_attestation is not None or self.on_heartbeat is not None:
            # subscribing also makes this host forward the topics: a pool of validators needs no other relay
            attestations = await self.node.subscribe(self.topic)
            validators = await self.node.subscribe(validators_topic(self.pool_id))
            self._tasks += [asyncio.create_task(self._read(attestations)), asyncio.create_task(self._read(validators))]
        if self.heartbeat is not None:
            self._tasks.append(asyncio.create_task(self._beat()))

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
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

    async def beat_once(self) -> bool:
        """Publishes one heartbeat now; False (logged at debug: peers may not be connected yet) if it failed."""
        assert self.heartbeat is not None
        topic = validators_topic(self.pool_id)
        try:
            await asyncio.wait_for(self.node.publish(topic, self.heartbeat()), PUBLISH_TIMEOUT_S)
        except (P2PError, TimeoutError) as exc:
            log.debug("could not publish a heartbeat on %s: %s", topic, exc)
            return False
        return True

    async def _beat(self) -> None:
        while True:
            await self.beat_once()
            await asyncio.sleep(self.heartbeat_seconds)

    async def _read(self, subscription: Subscription) -> None:
        async for received in subscription:
            self._deliver(received)

    def _deliver(self, received: Received) -> None:
        payload = received.message.payload
        if received.message.pool_id != self.pool_id:
            return  # the guard already drops a message whose pool is not the topic's
        if isinstance(payload, ValidatorHeartbeat) and self.on_heartbeat is not None:
            self.on_heartbeat(received.signer, payload)
        elif isinstance(payload, Attestation) and self.on_attestation is not None:
            self.on_attestation(received.signer, payload)


def heartbeat_now(pool_id: int, next_block: int, backlog: int) -> ValidatorHeartbeat:
    return ValidatorHeartbeat(pool_id, int(time.time()), next_block, backlog)
