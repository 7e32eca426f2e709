"""The worker's journal (`node.daemon.state`): a batch's composition is journaled in one transaction before anything
about it leaves the machine, a file joins one batch at most, and a journal from before batches opens with its files
intact and gains the new columns."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from ledger.merkle import BatchTree, Leaf
from node.daemon.state import REFUSED_DETAIL, BatchEntry, WorkerState, WorkerStateError, read_journal

NODE = "0x90F79bf6EB2c4f870365E785982E1f101E93b906"


def journal(root: Path) -> WorkerState:
    return WorkerState(root, chain_id=31337, pool_id=1, node=NODE)


def uploaded(state: WorkerState, n: int, *, units: int = 10) -> list[bytes]:
    keys = []
    for i in range(n):
        data = f"file {len(state.all())} {i}".encode()
        key = hashlib.sha256(data).digest()
        state.path_of(key).write_bytes(data)
        state.add(key, step=0, counter=i, units=units + i)
        keys.append(key)
    state.move(keys, "uploaded")
    return keys


def test_a_batch_is_formed_from_uploaded_files_in_their_order_and_each_file_joins_one(tmp_path: Path) -> None:
    state = journal(tmp_path)
    keys = uploaded(state, 3)
    batch = state.form_batch(state.unbatched()[:2])
    assert batch.root == BatchTree([Leaf(keys[0], 10), Leaf(keys[1], 11)]).root
    assert (batch.stage, batch.count, batch.total_units, batch.tx) == ("formed", 2, 21, None)
    assert [(r.work_key, r.leaf_index, r.stage) for r in state.members(batch.root)] == [
        (keys[0], 0, "uploaded"),
        (keys[1], 1, "uploaded"),
    ]
    assert [r.work_key for r in state.unbatched()] == [keys[2]]  # the next batch's
    with pytest.raises(WorkerStateError, match="cannot join a batch: it is uploaded, a leaf of 0x"):
        state.form_batch([state.get(keys[0])])  # type: ignore[list-item]
    assert len(state.all_batches()) == 1  # nothing of the refused batch was written
    state.close()


def test_a_batch_moves_with_its_files_and_a_refused_leaf_stays_refused_unless_the_batch_is_invalidated(
    tmp_path: Path,
) -> None:
    state = journal(tmp_path)
    keys = uploaded(state, 3)
    batch = state.form_batch(state.unbatched())
    state.move_batch(batch.root, "submitted", tx="0xabc", files="submitted")
    assert {r.tx for r in state.all()} == {"0xabc"} and state.batch(batch.root).tx == "0xabc"  # type: ignore[union-attr]
    state.move([keys[1]], "refused", detail=REFUSED_DETAIL)
    state.move_batch(batch.root, "claimed", detail="claimed in 0xdef", files="claimed")
    assert [r.stage for r in state.members(batch.root)] == ["claimed", "refused", "claimed"]
    state.move_batch(
        batch.root, "invalidated", detail="leaf 2", files="invalidated", file_detail="voided", leaf_details={2: "bad"}
    )
    assert [(r.stage, r.detail) for r in state.members(batch.root)] == [
        ("invalidated", "voided"),
        ("invalidated", "voided"),
        ("invalidated", "bad"),
    ]
    assert state.batch_counts()["invalidated"] == 1 and state.counts()["invalidated"] == 3
    state.close()


def test_a_batch_never_sent_releases_its_files_to_be_batched_again(tmp_path: Path) -> None:
    state = journal(tmp_path)
    keys = uploaded(state, 2)
    batch = state.form_batch(state.unbatched())
    state.move([keys[0]], "expired", detail="late")
    state.move_batch(batch.root, "void", detail="never submitted")
    state.release(batch.root, [keys[1]])
    assert [r.work_key for r in state.unbatched()] == [keys[1]]
    assert state.get(keys[0]).root == batch.root  # type: ignore[union-attr]  # the expired one keeps its history
    state.close()


def test_a_journal_from_before_batches_opens_with_its_files_and_gains_the_batch_columns(tmp_path: Path) -> None:
    old = sqlite3.connect(tmp_path / "state.db")
    old.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE files (work_key TEXT PRIMARY KEY, step INTEGER NOT NULL, counter INTEGER NOT NULL,
            units INTEGER NOT NULL, stage TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, tx TEXT,
            detail TEXT, verdict TEXT);
        """
    )
    old.executemany("INSERT INTO meta VALUES (?, ?)", [("chain_id", "31337"), ("pool_id", "1"), ("node", NODE.lower())])
    old.execute("INSERT INTO files VALUES (?, 0, 0, 5, 'uploaded', 1.0, 1.0, NULL, NULL, NULL)", ("ab" * 32,))
    old.commit()
    old.close()
    assert read_journal(tmp_path).files[0].root is None  # read before the daemon opens it: no batch column yet

    state = journal(tmp_path)
    [record] = state.unbatched()
    assert (record.work_key, record.units, record.issued_at, record.root) == (bytes.fromhex("ab" * 32), 5, None, None)
    batch = state.form_batch([record])
    assert batch.root == BatchTree([Leaf(record.work_key, 5)]).root  # a batch of one
    state.close()
    view = read_journal(tmp_path)
    assert view.file_counts()["uploaded"] == 1 and view.batch_counts()["formed"] == 1
    assert view.files[0].leaf_index == 0


def test_each_batch_takes_the_lowest_slot_no_batch_still_pending_on_chain_holds(tmp_path: Path) -> None:
    state = journal(tmp_path)
    uploaded(state, 6)

    def form(*, avoid: tuple[int, ...] = ()) -> BatchEntry:
        return state.form_batch(state.unbatched()[:1], avoid=avoid)

    first, second, third = form(), form(), form()
    assert [first.slot, second.slot, third.slot] == [0, 1, 2]  # formed (about to be sent) holds its slot
    state.move_batch(first.root, "submitted", tx="0x01", files="submitted")
    state.move_batch(second.root, "listed")
    assert state.free_slot() == 3  # submitted and listed hold theirs too
    state.move_batch(first.root, "claimed", files="claimed")  # settled on chain: a new batch may be written over it
    state.move_batch(third.root, "void", detail="never submitted")  # never sent: nothing on chain holds it
    assert [form().slot, form().slot] == [0, 2]
    assert state.free_slot() == 3 and state.free_slot(avoid={3, 5}) == 4
    assert form(avoid=(3,)).slot == 4  # a slot the chain showed another pending batch in is left
    state.close()


def test_a_batch_not_sent_yet_moves_to_the_lowest_free_slot_but_its_own_and_those_avoided(tmp_path: Path) -> None:
    state = journal(tmp_path)
    uploaded(state, 3)
    first = state.form_batch(state.unbatched()[:1])
    second = state.form_batch(state.unbatched()[:1])
    state.move_batch(first.root, "claimed", files="claimed")  # slot 0 free again
    assert state.move_slot(second.root, avoid={0}) == 2  # not 0 (avoided), not 1 (its own)
    assert state.batch(second.root).slot == 2  # type: ignore[union-attr]  # journaled before it is sent there
    assert state.free_slot() == 0
    state.move_batch(second.root, "submitted", tx="0x02", files="submitted")
    with pytest.raises(WorkerStateError, match="cannot move to another slot: it is not waiting to be sent"):
        state.move_slot(second.root, avoid=())
    state.close()


def test_a_journal_from_before_slots_gains_the_column_and_its_unsent_batches_a_slot_each(tmp_path: Path) -> None:
    old = sqlite3.connect(tmp_path / "state.db")  # as a worker from before slots left it
    old.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE files (work_key TEXT PRIMARY KEY, step INTEGER NOT NULL, counter INTEGER NOT NULL,
            units INTEGER NOT NULL, stage TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, tx TEXT,
            detail TEXT, verdict TEXT, issued_at INTEGER, root TEXT, leaf_index INTEGER);
        CREATE TABLE batches (root TEXT PRIMARY KEY, count INTEGER NOT NULL, total_units INTEGER NOT NULL,
            stage TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, tx TEXT, detail TEXT);
        """
    )
    old.executemany("INSERT INTO meta VALUES (?, ?)", [("chain_id", "31337"), ("pool_id", "1"), ("node", NODE.lower())])
    stages = ["claimed", "submitted", "listed", "void", "formed"]
    for created, stage in enumerate(stages):
        old.execute("INSERT INTO batches VALUES (?, 1, 5, ?, ?, ?, NULL, NULL)", (f"{created:064x}", stage, created, 9))
    old.commit()
    old.close()
    assert {b.slot for b in read_journal(tmp_path).batches} == {None}  # read before the daemon opens it

    state = journal(tmp_path)
    slots = {b.stage: b.slot for b in state.all_batches()}
    # the unsent ones get a slot each, oldest first; one submitted before slots is on a ledger that had none
    assert slots == {"claimed": None, "submitted": None, "listed": 0, "void": None, "formed": 1}
    uploaded(state, 1)
    assert state.form_batch(state.unbatched()).slot == 2
    state.close()
    assert [b.slot for b in read_journal(tmp_path).batches] == [None, None, 0, None, 1, 2]
    again = journal(tmp_path)  # migrated once: opening it again changes nothing
    assert [b.slot for b in again.all_batches()] == [None, None, 0, None, 1, 2]
    again.close()
