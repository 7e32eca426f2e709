"""Real libp2p hosts on loopback for the tests in this folder, and the waits around them.

pytest-asyncio is not installed: each test runs its scenario with `asyncio.run`. Every test waits for the
gossipsub mesh (`wait_for_topic_peers`) before it publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from eth_account import Account

from p2p import P2PConfig, P2PNode, Received, Subscription, checkpoints_topic
from protocol.signing import Checkpoint, SigningDomain

DOMAIN = SigningDomain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
POOL = 7
TOPIC = checkpoints_topic(POOL)
WAIT = 10.0  # seconds for anything that should take milliseconds on loopback


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(scenario)


@contextlib.asynccontextmanager
async def started(*configs: P2PConfig | None) -> AsyncIterator[list[P2PNode]]:
    """One started host per config, none connected yet; all stopped afterwards."""
    async with contextlib.AsyncExitStack() as stack:
        nodes = [P2PNode(Account.create(), DOMAIN, config) for config in configs]
        for node in nodes:
            await stack.enter_async_context(node)
        yield nodes


@contextlib.asynccontextmanager
async def hosts(count: int, config: P2PConfig | None = None) -> AsyncIterator[list[P2PNode]]:
    """`count` started hosts, each connected to every other; all stopped afterwards."""
    async with started(*[config] * count) as nodes:
        for i, node in enumerate(nodes):
            for other in nodes[i + 1 :]:
                await node.connect(other.listen_addrs[0])
        yield nodes


async def subscribe_all(nodes: list[P2PNode], topic: str, peers: list[int] | None = None) -> list[Subscription]:
    """Subscribes every host to `topic` and waits until each has its mesh: `peers[i]` peers for host i, by
    default all the others (hosts fully connected)."""
    subscriptions = [await node.subscribe(topic) for node in nodes]
    for node, count in zip(nodes, peers or [len(nodes) - 1] * len(nodes), strict=True):
        await node.wait_for_topic_peers(topic, count, WAIT)
    return subscriptions


async def next_message(subscription: Subscription) -> Received:
    return await asyncio.wait_for(anext(subscription), WAIT)


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def dropped(node: P2PNode, reason: str) -> float:
    return node.metrics._metrics["p2p_messages_dropped_total"].value(reason=reason)


def score(node: P2PNode, peer: P2PNode) -> float:
    """The score `node`'s guard gives `peer` now."""
    return node.guard.scores.score(peer.peer_id, time.monotonic())


def checkpoint(step: int) -> Checkpoint:
    return Checkpoint(POOL, step, bytes([step % 256]) * 32)
