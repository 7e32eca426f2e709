"""Sharing a pool between validators: the rendezvous split, liveness, and the store's bookkeeping of shares."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ledger.accounts import dev_account
from validator.sharing import Peers, rank, replicas
from validator.store import COVERED, EXPIRED, SEEN, Submission, ValidatorStore

A, B, C = (dev_account(i).address for i in (2, 8, 9))
KEYS = [hashlib.sha256(str(i).encode()).digest() for i in range(2_000)]


def test_every_key_has_one_primary_and_the_split_is_even() -> None:
    primaries = [replicas(key, [A, B], [A, B], 1) for key in KEYS]
    assert all(len(p) == 1 for p in primaries)
    share_of_a = sum(p == [A] for p in primaries) / len(KEYS)
    assert 0.45 < share_of_a < 0.55  # sha256 ranks: a fair coin per key
    # the same ranking whatever order or spelling the set comes in
    assert all(rank(key, [B.lower(), A]) == rank(key, [A, B]) for key in KEYS[:50])


def test_a_gone_validator_moves_only_its_own_keys() -> None:
    before = {key: replicas(key, [A, B, C], [A, B, C], 1)[0] for key in KEYS}
    after = {key: replicas(key, [A, B, C], [A, C], 1)[0] for key in KEYS}
    moved = [key for key in KEYS if before[key] != after[key]]
    assert moved and all(before[key] == B for key in moved)
    assert all(after[key] in (A, C) for key in KEYS)


def test_replication_picks_distinct_live_validators_primary_first() -> None:
    for key in KEYS[:100]:
        two = replicas(key, [A, B, C], [A, B, C], 2)
        assert len(set(two)) == 2 and two == rank(key, [A, B, C])[:2]
        assert replicas(key, [A, B, C], [A], 2) == [A]  # fewer live than r: all of them


def test_peers_presume_an_unheard_validator_alive_until_takeover_then_take_its_keys() -> None:
    peers = Peers(A, takeover_seconds=10, started=100.0, validators=frozenset({A, B}))
    key_of_b = next(key for key in KEYS if rank(key, [A, B])[0] == B)
    assert not peers.mine(key_of_b, 1, now=105.0)  # B not heard from yet, but we only just started
    assert peers.mine(key_of_b, 1, now=111.0)  # silent for the whole takeover period: gone
    assert peers.hear(B, 109.0) and not peers.mine(key_of_b, 1, now=111.0)  # heard: alive again
    assert not peers.hear(C, 112.0)  # not appointed on chain: ignored
    assert C not in peers.live(112.0)


def test_only_the_primary_slashes_at_once_a_second_replica_waits_its_rank() -> None:
    peers = Peers(A, takeover_seconds=30, started=0.0, validators=frozenset({A, B}))
    for key in KEYS[:20]:
        primary = rank(key, [A, B])[0]
        assert peers.slash_delay(key, 2, now=1.0) == (0.0 if primary == A else 30.0)
        assert peers.slash_delay(key, 1, now=1.0) == (0.0 if primary == A else None)
        assert peers.slash_delay(key, 2, now=100.0) == 0.0  # B silent: A is the only live replica


def submission(i: int, submitted_at: int = 1_000) -> Submission:
    return Submission(1, KEYS[i], dev_account(3).address, 10, 10 + i, 0, submitted_at)


@pytest.fixture
def store(tmp_path: Path) -> ValidatorStore:
    return ValidatorStore.open(tmp_path, chain_id=1, work_ledger="0x" + "11" * 20, pool_id=1, validator=A)


def test_the_store_hands_out_only_its_share_and_takes_over_on_reassign(store: ValidatorStore) -> None:
    mine = {KEYS[0], KEYS[2]}
    store.record([submission(i) for i in range(4)], 20, mine=lambda key: key in mine)
    assert store.open_count() == 2 and store.theirs_count() == 2
    first = store.due(now=1e12)
    assert first is not None and first.work_key == KEYS[0] and first.mine
    assert store.reassign(lambda key: key == KEYS[1]) == 1  # one of the silent validator's keys is now ours
    assert store.open_count() == 3 and store.theirs_count() == 1
    assert store.reassign(lambda key: False) == 0  # what was taken stays taken


def test_heard_acceptances_cover_other_shares_and_a_rejection_covers_nothing(store: ValidatorStore) -> None:
    store.record([submission(i) for i in range(3)], 20, mine=lambda key: False)
    assert store.hear(KEYS[0], B, True, replication=1) == 1
    assert store.hear(KEYS[1], B, False, replication=1) == 0  # its rejecter slashes; a taker-over must judge it
    assert store.hear(KEYS[2], B, True, replication=2) == 0  # one of the two replicas so far
    assert store.hear(KEYS[2], C, True, replication=2) == 1
    row = store.get(KEYS[0], dev_account(3).address)
    assert row is not None and row.stage == COVERED and "accepted by 1" in (row.note or "")
    assert store.get(KEYS[1], dev_account(3).address).stage == SEEN  # type: ignore[union-attr]
    # heard before the submission was read from the chain: covered when it is recorded
    store.hear(KEYS[3], B, True, replication=1)
    store.record([submission(3)], 21, mine=lambda key: False)
    assert store.cover([KEYS[3]], 1) == 1


def test_other_shares_expire_when_their_window_closed_unheard_but_own_rows_never(store: ValidatorStore) -> None:
    store.record([submission(0, 100), submission(1, 100), submission(2, 5_000)], 20, mine=lambda key: key == KEYS[0])
    assert store.expire_theirs(closed_before=1_000) == 1
    assert store.get(KEYS[1], dev_account(3).address).stage == EXPIRED  # type: ignore[union-attr]
    assert store.get(KEYS[0], dev_account(3).address).stage == SEEN  # type: ignore[union-attr]
    assert store.theirs_count() == 1


def test_other_shares_unjudged_half_way_through_their_window_become_mine(store: ValidatorStore) -> None:
    store.record([submission(0, 100), submission(1, 900)], 20, mine=lambda key: False)
    assert store.take_unheard(submitted_before=500) == 1  # only the older one
    assert store.open_count() == 1 and store.due(now=1e12).work_key == KEYS[0]  # type: ignore[union-attr]


def test_a_state_from_before_sharing_keeps_every_row_its_own(tmp_path: Path) -> None:
    import sqlite3

    store = ValidatorStore.open(tmp_path, chain_id=1, work_ledger="0x" + "11" * 20, pool_id=1, validator=A)
    store.record([submission(0)], 20)
    store.close()
    db = sqlite3.connect(tmp_path / "validator.db")
    db.execute("ALTER TABLE work DROP COLUMN mine")
    db.execute("ALTER TABLE work DROP COLUMN slash_after")
    db.commit()
    db.close()
    again = ValidatorStore.open(tmp_path, chain_id=1, work_ledger="0x" + "11" * 20, pool_id=1, validator=A)
    assert again.open_count() == 1 and again.due(now=1e12) is not None
