"""The worker's gossip rules (node/daemon/gossip.py): which announcements are prefetched, which relays are used."""

from __future__ import annotations

from eth_account import Account
from eth_account.signers.local import LocalAccount

from node.daemon.gossip import worth_prefetching
from p2p import Received, checkpoints_topic, peer_id_of, sign_message
from protocol.signing import Attestation, Checkpoint, SigningDomain
from shardcast.sources import SourcePool

DOMAIN = SigningDomain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
TRAINER, OTHER = Account.create(), Account.create()
POOL = 7


def announcement(step: int, *, by: LocalAccount = TRAINER, pool: int = POOL) -> Received:
    message = sign_message(Checkpoint(pool, step, b"\xab" * 32), by, DOMAIN)
    return Received(checkpoints_topic(pool), message, peer_id_of(by), by.address)


def test_an_announcement_by_the_trainer_of_a_newer_step_is_prefetched() -> None:
    found = worth_prefetching(announcement(3), pool_id=POOL, trainer=TRAINER.address, held=2)
    assert found == Checkpoint(POOL, 3, b"\xab" * 32)
    assert worth_prefetching(announcement(0), pool_id=POOL, trainer=TRAINER.address, held=None) is not None


def test_an_announcement_of_the_step_held_or_an_older_one_is_ignored() -> None:
    for step in (1, 2):
        assert worth_prefetching(announcement(step), pool_id=POOL, trainer=TRAINER.address, held=2) is None


def test_an_announcement_signed_by_anyone_but_the_trainer_is_ignored() -> None:
    assert worth_prefetching(announcement(9, by=OTHER), pool_id=POOL, trainer=TRAINER.address, held=2) is None


def test_an_announcement_for_another_pool_or_another_message_type_is_ignored() -> None:
    assert worth_prefetching(announcement(9, pool=8), pool_id=POOL, trainer=TRAINER.address, held=2) is None
    attestation = sign_message(Attestation(POOL, b"\x01" * 32, True, 0), TRAINER, DOMAIN)
    received = Received(checkpoints_topic(POOL), attestation, peer_id_of(TRAINER), TRAINER.address)
    assert worth_prefetching(received, pool_id=POOL, trainer=TRAINER.address, held=None) is None


def test_advertised_relays_join_the_sources_once_each_http_only_and_not_its_own() -> None:
    own = "http://127.0.0.1:9000"
    pool = SourcePool([own, "http://origin:8700"])  # the worker's own relay is a configured source
    assert pool.advertise("http://relay-a:8000/", "0xA")  # stored without the trailing slash
    assert pool.advertise("http://relay-a:8000", "0xA")  # known: its expiry is refreshed, nothing is added
    assert not pool.advertise("http://origin:8700", "0xB") and not pool.advertise(own, "0xB")
    assert not pool.advertise("ftp://relay-b:21", "0xB") and not pool.advertise("http://", "0xB")
    assert pool.advertise("https://relay-c", "0xB")
    assert pool.urls() == [own, "http://origin:8700", "http://relay-a:8000", "https://relay-c"]


def test_one_advertiser_adds_at_most_two_sources_and_learned_ones_expire() -> None:
    """A gossip peer advertising relays for good was one way a hostile peer kept a worker failing (issue 19)."""
    now = [0.0]
    pool = SourcePool(["http://origin:8700"], ttl=180.0, clock=lambda: now[0])
    added = [pool.advertise(f"http://relay-{i}:8000", "0xA") for i in range(5)]
    assert added == [True, True, False, False, False]
    now[0] = 181.0
    assert pool.urls() == ["http://origin:8700"]  # not advertised again: gone
