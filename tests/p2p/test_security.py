"""Who a host believes it talks to, and who it believes wrote a message (p2p/security.py).

Connections: a host offers noise only. js-libp2p, a second libp2p implementation (tests/p2p/js/dial.mjs,
pinned by package.json and package-lock.json, installed with `npm ci` here when missing), dials it offering
one encrypter: plaintext fails, with its own key or claiming another peer's (issue 19, item 7: a plaintext
dialer claimed the trainer's peer id and had the trainer banned); noise connects, so the refusal is not a
broken interop. A py-libp2p dialer offering only plaintext checks the same where Node.js is missing.

Messages: one whose libp2p signature fails costs the peer that sent it, never the author its `from` names.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import multiaddr
import pytest
import trio
from eth_account import Account
from libp2p import new_host
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pb import rpc_pb2
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport

from p2p import P2PNode, peer_id_of, sign_message
from p2p.identity import key_pair_of
from tests.node_js import node_json, node_script
from tests.p2p.helpers import (
    DOMAIN,
    TOPIC,
    WAIT,
    checkpoint,
    dropped,
    next_message,
    run,
    score,
    started,
    subscribe_all,
    until,
)

pytestmark = pytest.mark.timeout(120)  # the first js test may run `npm ci` (about 10 s)

JS_DIR = Path(__file__).parent / "js"


@pytest.fixture(scope="module")
def js_dialer() -> list[str]:
    """The command that runs dial.mjs (js-libp2p)."""
    return node_script(JS_DIR, "dial.mjs")


async def js_dial(command: list[str], addr: str, encrypter: str, claimed_key: str = "") -> dict[str, Any]:
    """`{"connected": bool, "remotePeer" or "error": str}` from one js-libp2p dial."""
    args = [*command, addr, encrypter, *([claimed_key] if claimed_key else [])]
    outcome: dict[str, Any] = await node_json(args, timeout=3 * WAIT)
    return outcome


async def py_plaintext_dial(addr: str) -> str | None:
    """A py-libp2p host offering only plaintext dials `addr`: None if it connects, else the error. In trio."""
    key_pair = key_pair_of(Account.create())
    listen = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
    insecure = {PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)}
    dialer = new_host(key_pair=key_pair, sec_opt=insecure, listen_addrs=[listen])
    async with dialer.run([listen]):
        try:
            with trio.fail_after(WAIT):
                await dialer.connect(info_from_p2p_addr(multiaddr.Multiaddr(addr)))
        except Exception as exc:
            return repr(exc)
    return None


async def send_in_the_name_of(sender: P2PNode, author: str, data: bytes) -> None:
    """`sender` hands its mesh a message on TOPIC whose `from` is `author`, signed with random bytes."""
    forged = rpc_pb2.Message(
        data=data,
        topicIDs=[TOPIC],
        from_id=ID.from_base58(author).to_bytes(),
        seqno=os.urandom(8),
        signature=os.urandom(64),
    )

    async def send() -> None:
        await sender._require().gossipsub.publish(sender._own_id, forged)  # as if relaying it

    await sender._bridge.run(send)


@pytest.mark.parametrize("claim_the_trainer", [False, True], ids=["own key", "claiming the trainer's id"])
def test_a_js_libp2p_dialer_offering_only_plaintext_cannot_connect(
    js_dialer: list[str], claim_the_trainer: bool
) -> None:
    trainer = Account.create()  # never started: a plaintext dialer needs only its public key to claim its id
    claimed = key_pair_of(trainer).public_key.to_bytes().hex() if claim_the_trainer else ""

    async def scenario() -> None:
        async with started(None) as (worker,):
            outcome = await js_dial(js_dialer, worker.listen_addrs[0], "plaintext", claimed)

            assert outcome["connected"] is False, f"plaintext connected: {outcome}"
            assert "EncryptionFailedError" in outcome["error"]  # refused in the security handshake, not before
            assert await worker.peers() == []
            assert peer_id_of(trainer) not in await worker.peers()

    run(scenario())


def test_a_js_libp2p_dialer_offering_noise_connects_and_proves_who_it_dialed(js_dialer: list[str]) -> None:
    async def scenario() -> None:
        async with started(None) as (worker,):
            outcome = await js_dial(js_dialer, worker.listen_addrs[0], "noise")
            assert outcome == {"connected": True, "remotePeer": worker.peer_id}

    run(scenario())


def test_a_py_libp2p_dialer_offering_only_plaintext_cannot_connect() -> None:
    async def scenario() -> None:
        async with started(None) as (worker,):
            error = await asyncio.to_thread(trio.run, py_plaintext_dial, worker.listen_addrs[0])
            assert error is not None, "plaintext connected"
            assert await worker.peers() == []

    run(scenario())


def test_a_host_offers_noise_and_no_other_security_transport() -> None:
    async def scenario() -> None:
        async with started(None) as (node,):

            async def offered() -> list[str]:
                swarm = node._require().host.get_network()
                assert isinstance(swarm, Swarm)
                return list(swarm.upgrader.security_multistream.transports)

            assert await node._bridge.run(offered) == ["/noise"]

    run(scenario())


def test_a_message_forged_in_the_trainers_name_costs_its_sender_and_not_the_trainer() -> None:
    async def scenario() -> None:
        async with started(None, None, None) as (trainer, rogue, worker):
            await trainer.connect(worker.listen_addrs[0])
            await rogue.connect(worker.listen_addrs[0])
            received = (await subscribe_all([trainer, rogue, worker], TOPIC, peers=[1, 1, 2]))[2]
            junk = sign_message(checkpoint(99), rogue.account, DOMAIN).encode()  # an announcement of step 99
            for _ in range(3):  # 50 points each; scores recover meanwhile, so the third bans at -100
                await send_in_the_name_of(rogue, trainer.peer_id, junk)

            await until(lambda: worker.guard.is_banned(rogue.peer_id), "the rogue's ban")
            assert dropped(worker, "forged_origin") == 3
            assert score(worker, trainer) == 0 and not worker.guard.is_banned(trainer.peer_id)
            announced = await trainer.publish(TOPIC, checkpoint(3))
            got = await next_message(received)
            assert got.message == announced and got.sender == trainer.peer_id

    run(scenario())
