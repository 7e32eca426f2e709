"""Gossip with a second implementation: js-libp2p 2.9 with @chainsafe/libp2p-gossipsub 14 (js/gossip.mjs) joins a
topic of our host.

A js peer whose identity is an Ethereum key (the same secp256k1 secret, as p2p/identity.py derives ours)
publishes a message that key signed: our host delivers it with the js peer as its sender. Our host's message reaches
the js peer as a signed gossipsub message, byte for byte. A js message signed by another key than its peer's is
dropped and costs the js peer; an unsigned one (StrictNoSign) is refused by strict signing, and blamed on the peer
that sent it. Without Node.js these skip, and fail instead under CI=true.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from p2p import P2PNode, peer_id_of, sign_message
from tests.node_js import node_json, node_script
from tests.p2p.helpers import DOMAIN, TOPIC, WAIT, checkpoint, dropped, next_message, run, started, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # the first js test may run `npm ci` (about 10 s)

JS_ACCOUNT: LocalAccount = Account.from_key(b"\x31" * 32)


@pytest.fixture(scope="module")
def js_gossip() -> list[str]:
    return node_script(Path(__file__).parent / "js", "gossip.mjs")


async def js_peer(command: list[str], node: P2PNode, payload: bytes, *args: str) -> asyncio.Task[dict[str, Any]]:
    """gossip.mjs, run as `JS_ACCOUNT` against `node`, publishing `payload`: a task that ends with its JSON line."""

    async def gossip() -> dict[str, Any]:
        key = bytes(JS_ACCOUNT.key).hex()
        argv = [*command, node.listen_addrs[0], TOPIC, key, payload.hex(), *args]
        result: dict[str, Any] = await node_json(argv, timeout=6 * WAIT)
        return result

    return asyncio.create_task(gossip())


def test_a_js_gossipsub_peer_and_our_host_deliver_each_others_signed_messages(js_gossip: list[str]) -> None:
    async def scenario() -> None:
        async with started(None) as (node,):
            subscription = await node.subscribe(TOPIC)
            theirs = sign_message(checkpoint(5), JS_ACCOUNT, DOMAIN)
            js = await js_peer(js_gossip, node, theirs.encode())
            got = await next_message(subscription)
            assert got.sender == peer_id_of(JS_ACCOUNT) and got.message == theirs
            ours = await node.publish(TOPIC, checkpoint(6))
            result = await js
            assert "error" not in result, result["error"]
            assert (result["peerId"], result["remotePeer"]) == (peer_id_of(JS_ACCOUNT), node.peer_id)
            assert result["published"] == [node.peer_id]
            assert result["received"] == {"from": node.peer_id, "data": ours.encode().hex(), "type": "signed"}

    run(scenario())


def test_a_js_message_signed_by_another_key_than_its_peers_is_dropped_and_costs_the_js_peer(
    js_gossip: list[str],
) -> None:
    async def scenario() -> None:
        async with started(None) as (node,):
            subscription = await node.subscribe(TOPIC)
            impostor = sign_message(checkpoint(5), Account.from_key(b"\x32" * 32), DOMAIN)  # not the js peer's key
            js = await js_peer(js_gossip, node, impostor.encode())
            await until(lambda: dropped(node, "signer_mismatch") == 1, "the drop")
            assert node.guard.scores.score(peer_id_of(JS_ACCOUNT), time.monotonic()) < 0
            await node.publish(TOPIC, checkpoint(6))  # the js peer still hears us: it was penalised, not banned
            result = await js
            assert "error" not in result, result["error"]
            assert result["received"]["from"] == node.peer_id
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(subscription), 0.5)

    run(scenario())


def test_an_unsigned_js_message_is_refused_by_strict_signing(js_gossip: list[str]) -> None:
    async def scenario() -> None:
        async with started(None) as (node,):
            subscription = await node.subscribe(TOPIC)
            payload = sign_message(checkpoint(5), JS_ACCOUNT, DOMAIN).encode()  # valid, but gossiped without author
            result = await (await js_peer(js_gossip, node, payload, "nosign", "3000"))
            assert "error" not in result, result["error"]
            assert result["published"] == [node.peer_id]  # it went out to us
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(subscription), 1.0)
            print({r: dropped(node, r) for r in ("forged_origin", "malformed", "bad_signature", "signer_mismatch")})

    run(scenario())
