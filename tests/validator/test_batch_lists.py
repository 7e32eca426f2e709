"""A batch's leaf list as the validator checks and records it: `validator.batches.check_leaves` and the store's
batch rows (listing, rejection, reorganisation, another validator's invalidation). No chain: the daemon's use of
them runs against anvil in tests/validator/test_batch_daemon.py."""

from __future__ import annotations

import time
from pathlib import Path

from ledger.merkle import BatchTree, Leaf
from ledger.types import Reason
from protocol.batches import encode_leaves
from tests.ledger.helpers import work_key
from validator.batches import check_leaves
from validator.slots import SlotBatch
from validator.store import (
    _BATCHES_TABLE,
    COVERED,
    GONE,
    INVALIDATED,
    LISTED,
    REJECTED,
    SEEN,
    UNVERIFIABLE,
    BatchSubmission,
    Submission,
    ValidatorStore,
)

NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"
VALIDATOR = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
LEDGER = "0xCf7Ed3AccA5a467e9e704C703E8D87F634fB0Fc9"


def leaves(*labels: str, units: int = 100) -> tuple[Leaf, ...]:
    return tuple(Leaf(work_key(label), units) for label in labels)


def check(listed: tuple[Leaf, ...], **overrides: object) -> object:
    terms: dict[str, object] = {
        "count": len(listed),
        "total_units": sum(leaf.units for leaf in listed),
        "max_units": 1_000,
        "earlier": {},
    }
    return check_leaves(listed, **(terms | overrides))  # type: ignore[arg-type]


# --- the list against its record --------------------------------------------------------------------------


def test_a_sound_list_has_no_fault() -> None:
    assert check(leaves("a", "b", "c")) is None


def test_a_list_of_another_count_than_the_record_proves_no_leaf_and_is_unavailable() -> None:
    fault = check(leaves("a", "b", "c"), count=4)
    assert fault is not None
    assert (fault.reason, fault.leaf_index) == (Reason.FILE_UNAVAILABLE, None)  # type: ignore[attr-defined]
    assert "holds 3 leaves; the chain records 4" in fault.detail  # type: ignore[attr-defined]


def test_units_that_do_not_add_up_to_the_record_are_bad_format_at_leaf_0() -> None:
    fault = check(leaves("a", "b"), total_units=201)
    assert fault is not None
    assert (fault.reason, fault.leaf_index) == (Reason.BAD_FORMAT, 0)  # type: ignore[attr-defined]


def test_a_leaf_over_the_pools_cap_is_bad_format_at_that_leaf() -> None:
    listed = (*leaves("a"), Leaf(work_key("b"), 5_000), *leaves("c"))
    fault = check(listed)
    assert fault is not None
    assert (fault.reason, fault.leaf_index) == (Reason.BAD_FORMAT, 1)  # type: ignore[attr-defined]


def test_a_file_twice_in_one_batch_is_a_wrong_assignment_at_its_second_leaf() -> None:
    fault = check(leaves("a", "b", "a"))
    assert fault is not None
    assert (fault.reason, fault.leaf_index) == (Reason.WRONG_ASSIGNMENT, 2)  # type: ignore[attr-defined]


def test_a_file_submitted_before_in_another_batch_is_a_wrong_assignment_naming_that_batch_and_its_slot() -> None:
    other = SlotBatch(3, b"\x07" * 32, 1_700_000_000)
    fault = check(leaves("a", "b"), earlier={work_key("b"): other})
    assert fault is not None
    assert (fault.reason, fault.leaf_index) == (Reason.WRONG_ASSIGNMENT, 1)  # type: ignore[attr-defined]
    assert f"in batch 0x{other.root.hex()} (slot 3)" in fault.detail  # type: ignore[attr-defined]
    fault = check(leaves("a", "b"), earlier={work_key("a"): other, work_key("b"): other})
    assert fault is not None and fault.leaf_index == 0  # type: ignore[attr-defined]  # the first repeated leaf


# --- the store's batch rows --------------------------------------------------------------------------------


def open_store(state: Path) -> ValidatorStore:
    return ValidatorStore.open(state, chain_id=31337, work_ledger=LEDGER, pool_id=1, validator=VALIDATOR)


def batch_of(
    listed: tuple[Leaf, ...], block: int = 10, log_index: int = 0, *, slot: int = 0, at: int | None = None
) -> BatchSubmission:
    """NODE's batch of `listed` in its slot `slot`, submitted at `block` (chain time `at`, 1_700_000_000 + block
    unless given)."""
    tree = BatchTree(listed)
    submitted_at = 1_700_000_000 + block if at is None else at
    return BatchSubmission(1, tree.root, NODE, tree.count, tree.total_units, block, log_index, submitted_at, slot=slot)


def files_of(batch: BatchSubmission, listed: tuple[Leaf, ...]) -> list[Submission]:
    return [
        Submission(
            1, leaf.work_key, NODE, leaf.units, batch.block, batch.log_index, batch.submitted_at,
            root=batch.root, leaf_index=index, slot=batch.slot,
        )
        for index, leaf in enumerate(listed)
    ]  # fmt: skip


def test_a_batch_is_recorded_with_the_cursor_then_listed_into_file_rows_that_remember_their_leaf(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    listed = leaves("a", "b", "c")
    batch = batch_of(listed)
    assert store.record([], 11, batches=[batch]) == 1
    assert store.record([], 12, batches=[batch]) == 0  # read again: not a second row
    due = store.due_batch(time.time())
    assert due is not None and (due.root, due.stage, due.count, due.total_units) == (batch.root, SEEN, 3, 300)
    assert store.due(time.time()) is None and store.open_count() == 1  # the batch waits; no file row yet

    assert store.list_batch(batch, encode_leaves(listed), files_of(batch, listed), mine=lambda key: True) == 3
    listed_row = store.get_batch(batch.root, NODE, 0)
    assert listed_row is not None and listed_row.stage == LISTED and listed_row.leaves == encode_leaves(listed)
    assert store.due_batch(time.time()) is None
    row = store.get(work_key("b"), NODE)
    assert row is not None and (row.root, row.leaf_index, row.stage, row.units) == (batch.root, 1, SEEN, 100)
    assert store.recorded_keys(NODE, [work_key("b"), work_key("z")]) == {work_key("b"): batch.in_slot}
    store.close()
    reopened = open_store(tmp_path)  # the leaf's place survives a restart
    row = reopened.get(work_key("c"), NODE)
    assert row is not None and (row.root, row.leaf_index, row.slot) == (batch.root, 2, 0)


def test_a_rejected_batch_waits_for_its_invalidation_and_a_noted_one_is_done(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    listed = leaves("a", "b")
    batch = batch_of(listed)
    store.record([], 11, batches=[batch])
    store.reject_batch(batch, int(Reason.BAD_FORMAT), "units", leaf_index=0, leaves=encode_leaves(listed))
    rejected = store.due_batch(time.time())
    assert rejected is not None and (rejected.stage, rejected.reason, rejected.leaf_index) == (REJECTED, 2, 0)
    store.retry_batch_later(batch, 60.0, "the chain failed")
    assert store.due_batch(time.time()) is None and store.open_count() == 1
    waiting = store.get_batch(batch.root, NODE, 0)
    assert waiting is not None and waiting.attempts == 1 and waiting.last_error == "the chain failed"
    store.move_batch(batch, REJECTED, note="the challenge window closed")
    assert store.open_count() == 0
    store.move_batch(batch, INVALIDATED, tx_hash="0x" + "ab" * 32)
    done = store.get_batch(batch.root, NODE, 0)
    assert done is not None and done.tx_hash == "0x" + "ab" * 32


def test_another_validators_invalidation_covers_the_batch_and_its_unjudged_files_only(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    listed = leaves("a", "b")
    batch, unlisted = batch_of(listed), batch_of(leaves("x"), block=11)
    store.record([], 12, batches=[batch, unlisted])
    store.list_batch(batch, encode_leaves(listed), files_of(batch, listed), mine=lambda key: True)
    store.move(files_of(batch, listed)[0], INVALIDATED, tx_hash="0x" + "cd" * 32)  # judged and sent here
    assert store.batch_invalidated_elsewhere(batch.root, NODE, VALIDATOR) == 1  # leaf "b" only
    judged, unjudged = store.get(work_key("a"), NODE), store.get(work_key("b"), NODE)
    assert judged is not None and judged.stage == INVALIDATED
    assert unjudged is not None and unjudged.stage == COVERED
    assert store.batch_invalidated_elsewhere(unlisted.root, NODE, VALIDATOR) == 1
    covered = store.get_batch(unlisted.root, NODE, 0)
    assert covered is not None and covered.stage == COVERED and store.open_count() == 0


def test_a_batch_a_reorganisation_moved_takes_its_files_along_and_one_parked_gone_is_listed_again(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    listed = leaves("a", "b")
    batch = batch_of(listed, block=10)
    store.record([], 11, batches=[batch])
    store.list_batch(batch, encode_leaves(listed), files_of(batch, listed), mine=lambda key: True)
    moved = batch_of(listed, block=13, log_index=2)
    store.record([], 14, batches=[moved])
    row = store.get(work_key("b"), NODE)
    assert row is not None and (row.block, row.log_index, row.submitted_at) == (13, 2, 1_700_000_013)
    kept = store.get_batch(batch.root, NODE, 0)
    assert kept is not None and (kept.block, kept.stage) == (13, LISTED)  # its list stays; nothing to fetch

    gone = batch_of(leaves("g"), block=15)
    store.record([], 16, batches=[gone])
    store.move_batch(gone, UNVERIFIABLE, note=GONE)
    assert store.due_batch(time.time()) is None
    store.record([], 18, batches=[batch_of(leaves("g"), block=17)])  # submitted again
    again = store.due_batch(time.time())
    assert again is not None and (again.root, again.stage, again.note, again.block) == (gone.root, SEEN, None, 17)
    # a file of a listed batch is no duplicate of itself, but a key seen before is reported with its batch
    assert store.recorded_keys(NODE, [work_key("a")]) == {work_key("a"): moved.in_slot}


# --- slots: a node's slot is reused once its batch is settled ----------------------------------------------

WINDOW = 3600


def test_one_root_in_two_slots_is_two_batches_and_each_files_rows_stay_with_the_first(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    listed = leaves("a", "b")
    first, second = batch_of(listed, block=10, slot=0), batch_of(listed, block=11, slot=1)
    assert store.record([], 12, batches=[first, second], window=WINDOW) == 2
    store.list_batch(first, encode_leaves(listed), files_of(first, listed), mine=lambda key: True)
    in_first, in_second = store.get_batch(first.root, NODE, 0), store.get_batch(first.root, NODE, 1)
    assert in_first is not None and in_second is not None
    assert (in_first.stage, in_second.stage, in_second.block) == (LISTED, SEEN, 11)
    # the second's leaves were submitted before, in the first: what the daemon holds against it
    assert store.recorded_keys(NODE, [work_key("a")]) == {work_key("a"): first.in_slot}


def test_a_root_submitted_again_into_its_slot_a_window_later_is_a_new_batch_and_the_first_ones_files_stay(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    listed = leaves("a", "b")
    first = batch_of(listed, block=10)
    store.record([], 11, batches=[first], window=WINDOW)
    store.list_batch(first, encode_leaves(listed), files_of(first, listed), mine=lambda key: True)

    moved = batch_of(listed, block=12, at=first.submitted_at + WINDOW - 1)  # a reorganisation moved it
    assert store.record([], 13, batches=[moved], window=WINDOW) == 0
    row = store.get_batch(first.root, NODE, 0)
    assert row is not None and (row.block, row.stage) == (12, LISTED)
    file = store.get(work_key("a"), NODE)
    assert file is not None and file.block == 12  # its files moved with it

    again = batch_of(listed, block=900, at=moved.submitted_at + WINDOW)  # claimed, then the same root again
    assert store.record([], 901, batches=[again], window=WINDOW) == 1
    row = store.get_batch(first.root, NODE, 0)
    assert row is not None
    assert (row.block, row.submitted_at, row.stage, row.reason, row.note) == (900, again.submitted_at, SEEN, None, None)
    assert row.leaves == encode_leaves(listed)  # the root commits to its list
    file = store.get(work_key("a"), NODE)
    assert file is not None and (file.block, file.submitted_at) == (12, moved.submitted_at)  # the first batch's still
    earlier = store.recorded_keys(NODE, [work_key("a")])
    assert earlier == {work_key("a"): moved.in_slot}  # submitted before the new batch


def test_a_state_from_before_slots_gets_them_with_its_batches_and_files_kept(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    listed = leaves("a")
    batch = batch_of(listed)
    store.record([], 11, batches=[batch])
    store.list_batch(batch, encode_leaves(listed), files_of(batch, listed), mine=lambda key: True)
    columns = ", ".join(row[1] for row in store.db.execute("PRAGMA table_info(batches)") if row[1] != "slot")
    before_slots = (  # the schema before slots: batches keyed by (pool, node, root), files with no slot
        _BATCHES_TABLE.format(table="old")
        .replace("    slot INTEGER NOT NULL,", "")
        .replace("(pool_id, node, slot, root)", "(pool_id, node, root)")
    )
    store.db.executescript(
        f"""{before_slots};
        INSERT INTO old ({columns}) SELECT {columns} FROM batches;
        DROP TABLE batches;
        ALTER TABLE old RENAME TO batches;
        CREATE INDEX batches_stage ON batches (stage, next_try);
        ALTER TABLE work DROP COLUMN slot;
        """
    )
    assert "slot" not in {row[1] for row in store.db.execute("PRAGMA table_info(batches)")}
    store.close()

    reopened = open_store(tmp_path)
    kept = reopened.get_batch(batch.root, NODE, 0)
    assert kept is not None and (kept.stage, kept.leaves) == (LISTED, encode_leaves(listed))
    file = reopened.get(work_key("a"), NODE)
    assert file is not None and (file.root, file.slot) == (batch.root, None)
    key_columns = [row[1] for row in reopened.db.execute("PRAGMA table_info(batches)") if row[5]]
    assert key_columns == ["pool_id", "node", "slot", "root"]
    assert reopened.due_batch(2e9) is None and reopened.open_count() == 1  # its file still waits, as before
