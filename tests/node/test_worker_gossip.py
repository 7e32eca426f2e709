"""The worker's gossip rules (node/daemon/gossip.py): which announcements are prefetched, which relays are used."""

from __future__ import annotations

from eth_account import Account
from eth_account.signers.local import LocalAccount

from node.daemon.gossip import MAX_ADVERTISED_RELAYS, AdvertisedRelays, worth_prefetching
from node.p2p import Received, checkpoints_topic, peer_id_of, sign_message
from node.signing import Attestation, Checkpoint, SigningDomain

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
    sources = ["http://origin:8700"]
    relays = AdvertisedRelays(sources, own="http://127.0.0.1:9000")
    assert relays.add("http://relay-a:8000/")  # stored without the trailing slash
    assert not relays.add("http://relay-a:8000")
    assert not relays.add("http://origin:8700")
    assert not relays.add("http://127.0.0.1:9000")
    assert not relays.add("ftp://relay-b:21") and not relays.add("http://")
    assert relays.add("https://relay-c")
    assert sources == ["http://origin:8700", "http://relay-a:8000", "https://relay-c"]


def test_at_most_eight_advertised_relays_are_used() -> None:
    sources = ["http://origin:8700"]
    relays = AdvertisedRelays(sources)
    added = [relays.add(f"http://relay-{i}:8000") for i in range(MAX_ADVERTISED_RELAYS + 3)]
    assert added == [True] * MAX_ADVERTISED_RELAYS + [False] * 3
    assert len(sources) == 1 + MAX_ADVERTISED_RELAYS
