"""The guard's checks, in order, and what each drop costs: pure, with fake clocks and no hosts."""

from __future__ import annotations

import pytest
from eth_account import Account

from core.metrics import Registry
from p2p import P2PConfig, RelayAdvert, SignedMessage, peer_id_of, sign_message
from p2p.guard import PENALTY, DropReason, MessageGuard, PeerScores, TokenBucket
from protocol.signing import Attestation, Checkpoint, SigningDomain

DOMAIN = SigningDomain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SENDER, FORWARDER, OTHER = (Account.create() for _ in range(3))
SENDER_ID, FORWARDER_ID = peer_id_of(SENDER), peer_id_of(FORWARDER)
TOPIC = "/prime/7/checkpoints"
NOW = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def guard(**config: object) -> tuple[MessageGuard, Clock, Registry]:
    clock, registry = Clock(), Registry()
    return MessageGuard(P2PConfig(**config), DOMAIN, registry, clock=clock, wall_clock=lambda: NOW), clock, registry  # type: ignore[arg-type]


def signed(payload: object, account: object = SENDER) -> bytes:
    return sign_message(payload, account, DOMAIN).encode()  # type: ignore[arg-type]


CHECKPOINT = signed(Checkpoint(7, 1, b"\x01" * 32))


def test_a_well_formed_message_signed_by_its_peer_is_accepted() -> None:
    check, _, registry = guard()
    verdict = check.inspect(TOPIC, CHECKPOINT, SENDER_ID, FORWARDER_ID)
    assert verdict.reason is None and verdict.message is not None
    assert verdict.message.signer(DOMAIN) == SENDER.address
    assert registry._metrics["p2p_messages_accepted_total"].value() == 1


DROPS = [
    (TOPIC, CHECKPOINT + b" " * 70_000, DropReason.OVERSIZED),
    (TOPIC, b"{}", DropReason.MALFORMED),
    (TOPIC, b"[" * 60_000, DropReason.MALFORMED),
    ("/prime/8/checkpoints", CHECKPOINT, DropReason.WRONG_TOPIC),
    (TOPIC, signed(Attestation(7, b"\x02" * 32, True, 0)), DropReason.WRONG_TOPIC),
    ("/prime/7/relays", signed(RelayAdvert(7, "http://relay:1", 5, int(NOW) - 301)), DropReason.STALE),
    (TOPIC, SignedMessage(Checkpoint(7, 1, b"\x01" * 32), b"\x00" * 65).encode(), DropReason.BAD_SIGNATURE),
    (TOPIC, signed(Checkpoint(7, 1, b"\x01" * 32), OTHER), DropReason.SIGNER_MISMATCH),
]


@pytest.mark.parametrize(("topic", "data", "reason"), DROPS)
def test_each_check_drops_counts_and_penalises(topic: str, data: bytes, reason: DropReason) -> None:
    check, clock, registry = guard()
    verdict = check.inspect(topic, data, SENDER_ID, SENDER_ID)
    assert verdict.message is None and verdict.reason is reason
    assert registry._metrics["p2p_messages_dropped_total"].value(reason=reason.value) == 1
    assert check.scores.score(SENDER_ID, clock.now) == -PENALTY[reason]


@pytest.mark.parametrize(("topic", "data", "reason"), DROPS)
def test_a_relay_pays_nothing_for_a_bad_message_its_author_signed(topic: str, data: bytes, reason: DropReason) -> None:
    # inspect sees only messages whose libp2p signature verified with SENDER's key: SENDER wrote them
    check, clock, _ = guard()
    assert check.inspect(topic, data, SENDER_ID, FORWARDER_ID).reason is reason
    assert check.scores.score(SENDER_ID, clock.now) == -PENALTY[reason]
    assert check.scores.score(FORWARDER_ID, clock.now) == 0


def test_a_forged_origin_costs_the_peer_that_sent_it_and_not_the_author_it_names() -> None:
    check, clock, registry = guard()
    first = check.reject_forged(TOPIC, SENDER_ID, FORWARDER_ID)  # FORWARDER relays junk "from" SENDER
    assert first.message is None and first.reason is DropReason.FORGED_ORIGIN and first.banned == ()
    assert check.scores.score(FORWARDER_ID, clock.now) == -PENALTY[DropReason.FORGED_ORIGIN]
    assert check.reject_forged(TOPIC, SENDER_ID, FORWARDER_ID).banned == (FORWARDER_ID,)
    assert registry._metrics["p2p_messages_dropped_total"].value(reason="forged_origin") == 2

    assert check.scores.score(SENDER_ID, clock.now) == 0 and not check.is_banned(SENDER_ID)
    assert check.inspect(TOPIC, CHECKPOINT, SENDER_ID, SENDER_ID).message is not None  # its next message gets in


def test_rate_limits_cost_the_author_only() -> None:
    check, clock, _ = guard(burst=1, rate_per_s=0.001)
    assert check.inspect(TOPIC, CHECKPOINT, SENDER_ID, FORWARDER_ID).message is not None
    assert check.inspect(TOPIC, CHECKPOINT, SENDER_ID, FORWARDER_ID).reason is DropReason.RATE_LIMITED
    assert check.scores.score(SENDER_ID, clock.now) == -PENALTY[DropReason.RATE_LIMITED]
    assert check.scores.score(FORWARDER_ID, clock.now) == 0


def test_a_ban_is_reported_once_and_later_messages_are_dropped_without_cost() -> None:
    check, clock, registry = guard(ban_score=-60.0)
    forged = signed(Checkpoint(7, 1, b"\x01" * 32), OTHER)
    assert check.inspect(TOPIC, forged, SENDER_ID, SENDER_ID).banned == ()
    assert check.inspect(TOPIC, forged, SENDER_ID, SENDER_ID).banned == (SENDER_ID,)
    verdict = check.inspect(TOPIC, CHECKPOINT, SENDER_ID, SENDER_ID)
    assert verdict.reason is DropReason.BANNED and verdict.banned == ()
    assert registry._metrics["p2p_peers_banned_total"].value() == 1
    assert check.scores.score(SENDER_ID, clock.now) == -100


def test_token_bucket_allows_a_burst_then_the_refill_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5) and not bucket.take(0.5)
    assert bucket.full(10.0)


def test_scores_recover_towards_zero_and_never_above() -> None:
    scores = PeerScores(ban_score=-100.0, recovery_per_s=1.0)
    assert not scores.penalize("p", 50.0, now=0.0)
    assert scores.score("p", now=20.0) == -30.0
    assert scores.score("p", now=1000.0) == 0.0
    assert scores.penalize("p", 120.0, now=1000.0) and "p" in scores.banned
