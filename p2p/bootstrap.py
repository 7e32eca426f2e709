"""Joining a pool's gossip: dial the bootstrap peers of the pool spec, and dial them again when none is left.

There is no DHT or peer exchange (docs/p2p.md): a node knows the peers it dials and the peers that dial it.
A bootstrap peer that cannot be dialled is logged and tried again later; it never stops the daemon.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from p2p.errors import P2PError
from p2p.host import P2PNode

log = logging.getLogger("p2p")

REDIAL_EVERY_S = 30.0


async def dial_bootstrap(node: P2PNode, addrs: Sequence[str]) -> list[str]:
    """Dials each of `addrs` not connected yet (its own address skipped); returns the peer ids it connected to now."""
    connected = set(await node.peers())
    reached = []
    for addr in addrs:
        peer = addr.rstrip("/").rsplit("/p2p/", 1)[-1]
        if peer == node.peer_id or peer in connected:
            continue  # a bootstrap peer reading its own spec, or a peer that dialled in first
        try:
            reached.append(await node.connect(addr))
        except P2PError as exc:
            log.warning("cannot reach bootstrap peer %s: %s", addr, exc)
            continue
        log.info("connected to bootstrap peer %s", addr)
    return reached


async def keep_bootstrapped(node: P2PNode, addrs: Sequence[str], every: float = REDIAL_EVERY_S) -> None:
    """Runs until cancelled: every `every` s, dials the bootstrap peers again if the node has no peer left."""
    while True:
        await asyncio.sleep(every)
        try:
            if not await node.peers():
                await dial_bootstrap(node, addrs)
        except P2PError as exc:  # the host stopped or crashed: nothing left to keep
            log.warning("stopped re-dialling bootstrap peers: %s", exc)
            return
