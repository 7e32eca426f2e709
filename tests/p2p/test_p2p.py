"""Real libp2p hosts on loopback (DESIGN section 11): announcements, drops, scoring, status, shutdown.

Hosts are fully connected unless a test says otherwise (tests/p2p/helpers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from p2p import (
    NotRunningError,
    P2PConfig,
    P2PError,
    P2PNode,
    PeerError,
    RelayAdvert,
    address_of,
    attestations_topic,
    relays_topic,
    sign_message,
)
from protocol.signing import Attestation, Checkpoint
from tests.p2p.helpers import (
    DOMAIN,
    POOL,
    TOPIC,
    WAIT,
    checkpoint,
    dropped,
    hosts,
    next_message,
    run,
    score,
    started,
    subscribe_all,
    until,
)
from tests.promtool import check_metrics

pytestmark = pytest.mark.timeout(60)


def test_signed_checkpoint_announcement_reaches_the_other_two_hosts_with_its_signer() -> None:
    async def scenario() -> None:
        async with hosts(3) as (trainer, worker, validator):
            subscriptions = await subscribe_all([trainer, worker, validator], TOPIC)
            sent = await trainer.publish(TOPIC, checkpoint(3))

            for subscription in subscriptions[1:]:
                received = await next_message(subscription)
                assert received.message == sent
                assert received.sender == trainer.peer_id
                assert address_of(received.sender) == received.signer == trainer.address
                assert received.message.signer(DOMAIN) == trainer.address
            with pytest.raises(TimeoutError):  # a host does not hear its own messages
                await asyncio.wait_for(anext(subscriptions[0]), 0.3)

    run(scenario())


def test_relay_adverts_and_attestations_travel_on_their_own_topics() -> None:
    async def scenario() -> None:
        async with hosts(2) as (relay, worker):
            adverts = (await subscribe_all([relay, worker], relays_topic(POOL)))[1]
            verdicts = (await subscribe_all([relay, worker], attestations_topic(POOL)))[1]
            advert = RelayAdvert(POOL, "http://127.0.0.1:8000", 12_500, int(time.time()))
            await relay.publish(relays_topic(POOL), advert)
            await relay.publish(attestations_topic(POOL), Attestation(POOL, b"\x01" * 32, False, 7))

            got_advert = (await next_message(adverts)).message.payload
            assert got_advert == advert and isinstance(got_advert, RelayAdvert) and got_advert.throughput_mb_s == 12.5
            assert (await next_message(verdicts)).message.payload == Attestation(POOL, b"\x01" * 32, False, 7)

    run(scenario())


def test_forged_oversized_and_malformed_messages_are_dropped_and_the_host_keeps_serving() -> None:
    async def status(peer: str) -> dict[str, Any]:
        return {"role": "trainer", "asked_by": address_of(peer)}

    async def scenario() -> None:
        async with hosts(3) as (honest, rogue, witness):
            honest.status_handler = status
            subscriptions = await subscribe_all([honest, rogue, witness], TOPIC)
            other_key: LocalAccount = Account.create()

            forged = sign_message(checkpoint(1), other_key, DOMAIN)  # a valid signature, but not the rogue's key
            await rogue.publish_bytes(TOPIC, forged.encode())
            padded = sign_message(checkpoint(2), rogue.account, DOMAIN).encode() + b" " * (64 * 1024)
            await rogue.publish_bytes(TOPIC, padded)
            await rogue.publish_bytes(TOPIC, b'{"type":"checkpoint","step":')
            valid = await rogue.publish(TOPIC, checkpoint(4))

            for node, subscription in ((honest, subscriptions[0]), (witness, subscriptions[2])):
                assert (await next_message(subscription)).message == valid  # none of the three came first
                for reason in ("signer_mismatch", "oversized", "malformed"):
                    await until(lambda n=node, r=reason: dropped(n, r) == 1, f"{reason} counted once")
                assert -100 < node.guard.scores.score(rogue.peer_id, time.monotonic()) <= -89  # 50 + 20 + 20
                assert not node.guard.is_banned(rogue.peer_id)
            assert subscriptions[0].closed is False

            # the host that dropped them still gossips and still answers, the rogue included
            again = await honest.publish(TOPIC, checkpoint(5))
            assert (await next_message(subscriptions[1])).message == again
            assert (await next_message(subscriptions[2])).message == again
            assert await rogue.request_status(honest.peer_id) == {"role": "trainer", "asked_by": rogue.address}
            assert await witness.request_status(honest.peer_id) == {"role": "trainer", "asked_by": witness.address}

    run(scenario())


def test_a_json_nesting_bomb_is_dropped_as_malformed_and_the_host_survives() -> None:
    async def scenario() -> None:
        async with hosts(2) as (target, attacker):
            received = (await subscribe_all([target, attacker], TOPIC))[0]
            await attacker.publish_bytes(TOPIC, b"[" * 65536)  # 64 KiB, not oversized; parsed, it overflows the C stack
            valid = await attacker.publish(TOPIC, checkpoint(1))

            assert (await next_message(received)).message == valid
            await until(lambda: dropped(target, "malformed") == 1, "the bomb counted as malformed")

    run(scenario())


def test_a_peer_scored_to_the_ban_threshold_is_disconnected_and_ignored() -> None:
    async def status(_: str) -> dict[str, Any]:
        return {"ok": True}

    async def scenario() -> None:
        async with hosts(2, P2PConfig(ban_score=-40.0)) as (honest, rogue):
            honest.status_handler = status
            received = (await subscribe_all([honest, rogue], TOPIC))[0]

            await rogue.publish_bytes(TOPIC, sign_message(checkpoint(1), Account.create(), DOMAIN).encode())
            await until(lambda: honest.guard.is_banned(rogue.peer_id), "the ban")
            assert honest.metrics._metrics["p2p_peers_banned_total"].value() == 1
            await until(lambda: honest.metrics._metrics["p2p_peers"].value() == 0, "the disconnect")
            check_metrics(honest.metrics.render())  # the page a worker or validator serves holds these families

            with pytest.raises(PeerError, match="banned"):
                await honest.connect(rogue.listen_addrs[0])
            with pytest.raises(PeerError):  # it may dial back, but it gets no answer
                await rogue.request_status(honest.peer_id)
            with contextlib.suppress(Exception):
                await rogue.publish(TOPIC, checkpoint(2))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(received), 0.5)

    run(scenario())


def test_a_relay_that_forwards_bad_messages_their_author_signed_loses_no_score_and_is_not_banned() -> None:
    """author - relay - worker: the relay's limits are looser than the worker's, so it forwards adverts the
    worker refuses as oversized. The author signed them (libp2p and EIP-712), so the author pays; the relay,
    had it paid as well, would be banned by the fifth and its own advert after them lost."""
    strict = P2PConfig(max_message_bytes=512)
    topic = relays_topic(POOL)

    def advert(url_bytes: int) -> RelayAdvert:
        return RelayAdvert(POOL, "http://relay.example/" + "a" * url_bytes, 1_000, int(time.time()))

    async def scenario() -> None:
        async with started(None, None, strict) as (author, relay, worker):
            await author.connect(relay.listen_addrs[0])
            await worker.connect(relay.listen_addrs[0])
            received = (await subscribe_all([author, relay, worker], topic, peers=[1, 2, 1]))[2]
            for _ in range(6):
                await author.publish(topic, advert(600))  # about 900 bytes encoded: over the worker's 512
            await until(lambda: dropped(worker, "oversized") == 6, "six oversized adverts dropped")

            assert score(worker, relay) == 0 and not worker.guard.is_banned(relay.peer_id)
            assert worker.guard.is_banned(author.peer_id)  # 6 x 20 points: its own doing
            own = await relay.publish(topic, advert(10))
            assert (await next_message(received)).message == own

    run(scenario())


def test_a_peer_over_its_rate_gets_its_burst_through_and_the_rest_dropped() -> None:
    async def scenario() -> None:
        async with hosts(2, P2PConfig(rate_per_s=0.01, burst=3)) as (receiver, chatty):
            received = (await subscribe_all([receiver, chatty], TOPIC))[0]
            for step in range(5):
                await chatty.publish(TOPIC, checkpoint(step))

            await until(lambda: dropped(receiver, "rate_limited") == 2, "two rate-limited drops")
            payloads = [(await next_message(received)).message.payload for _ in range(3)]
            assert len({p.step for p in payloads if isinstance(p, Checkpoint)}) == 3
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(received), 0.3)
            assert not receiver.guard.is_banned(chatty.peer_id)  # 2 points each: far from the threshold

    run(scenario())


def test_status_request_to_a_peer_that_cannot_be_reached_fails_with_a_peer_error() -> None:
    async def scenario() -> None:
        async with hosts(1) as (node,):
            stranger = P2PNode(Account.create(), DOMAIN)
            with pytest.raises(PeerError) as failure:
                await node.request_status(stranger.peer_id)
            assert failure.value.peer_id == stranger.peer_id

    run(scenario())


def test_start_fails_with_a_clear_error_when_the_port_is_taken() -> None:
    async def scenario() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            node = P2PNode(Account.create(), DOMAIN, P2PConfig(listen_port=taken.getsockname()[1]))
            with pytest.raises(P2PError, match="port is in use"):
                await node.start()

    run(scenario())


def test_stopping_ends_subscriptions_and_later_calls_fail_with_not_running() -> None:
    async def scenario() -> None:
        node = P2PNode(Account.create(), DOMAIN)
        await node.start()
        subscription = await node.subscribe(TOPIC)
        reader = asyncio.create_task(anext(subscription, None))
        await asyncio.sleep(0.05)
        await node.stop()

        assert await asyncio.wait_for(reader, WAIT) is None  # the iteration ended
        assert not [thread for thread in threading.enumerate() if thread.name.startswith("p2p-")]
        with pytest.raises(NotRunningError):
            await node.publish(TOPIC, checkpoint(1))
        with pytest.raises(NotRunningError):
            await node.subscribe(TOPIC)
        await node.stop()  # idempotent

    run(scenario())
