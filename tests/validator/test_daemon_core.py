"""The validator daemon's parts that need no chain: its SQLite progress, the step rule, retries, stopping.

Every file row is a leaf of a batch, recorded with the cursor as the daemon's `_follow` records a BatchSubmitted event
and listed as its `_list` lists a sound leaf list (tests/validator/test_batch_lists.py checks the lists themselves).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ledger.merkle import BatchTree, Leaf
from ledger.types import Reason
from protocol.batches import encode_leaves
from protocol.coordinator.client import PublishedStep
from tests.ledger.helpers import work_key
from validator.errors import ValidatorStateError
from validator.store import (
    ATTESTED,
    COVERED,
    EXPIRED,
    GONE,
    INVALIDATED,
    LISTED,
    REFUSED,
    SEEN,
    UNAVAILABLE,
    UNVERIFIABLE,
    VERIFIED,
    BatchSubmission,
    Submission,
    ValidatorStore,
)
from validator.timing import Stopped, interruptible, retry_delay, step_at, steps_around
from validator.verdict import Outcome, accept, borderline, reject

NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"
VALIDATOR = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
LEDGER = "0xCf7Ed3AccA5a467e9e704C703E8D87F634fB0Fc9"


def leaves_of(labels: Sequence[str], block: int = 0, log_index: int = 0) -> list[Submission]:
    """NODE's batch of the files `labels` (100 units each) submitted at `block`: its files, in leaf order, each with
    the batch's root and place."""
    tree = BatchTree([Leaf(work_key(label), 100) for label in labels])
    return [
        Submission(
            1, work_key(label), NODE, 100, block, log_index, 1_700_000_000 + block, root=tree.root, leaf_index=i, slot=0
        )
        for i, label in enumerate(labels)
    ]


def submission(label: str, block: int = 0, log_index: int = 0) -> Submission:
    """NODE's file `label`, the one leaf of a batch of its own; rows are identified by (pool, node, work key): `block`
    matters only when recorded."""
    return leaves_of([label], block, log_index)[0]


def batch_of(files: Sequence[Submission]) -> BatchSubmission:
    """The batch record whose leaves are `files`."""
    first = files[0]
    assert first.root is not None and first.slot is not None
    units = sum(f.units for f in files)
    return BatchSubmission(
        1, first.root, NODE, len(files), units, first.block, first.log_index, first.submitted_at, slot=first.slot
    )


def listed(
    store: ValidatorStore, next_block: int, *files: Submission, hashes: Mapping[int, bytes] | None = None
) -> int:
    """Records the batches of `files` (files sharing a root are one batch) with the cursor, then lists each: every
    file a `seen` row. Returns how many batches were new."""
    batches: dict[bytes | None, list[Submission]] = {}
    for f in files:
        batches.setdefault(f.root, []).append(f)
    added = store.record([], next_block, hashes, batches=[batch_of(leaves) for leaves in batches.values()])
    for leaves in batches.values():
        encoded = encode_leaves([Leaf(f.work_key, f.units) for f in leaves])
        store.list_batch(batch_of(leaves), encoded, leaves, mine=lambda work_key: True)
    return added


def open_store(state: Path, pool_id: int = 1, validator: str = VALIDATOR) -> ValidatorStore:
    return ValidatorStore.open(state, chain_id=31337, work_ledger=LEDGER, pool_id=pool_id, validator=validator)


def test_batches_and_the_cursor_are_recorded_together_and_survive_a_reopen(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert store.cursor(default=7) == 7
    b, a = submission("b", 12), submission("a", 10, 3)
    assert store.record([], next_block=13, batches=[batch_of([b]), batch_of([a])]) == 2
    assert store.record([], next_block=14, batches=[batch_of([a])]) == 0  # seen before: not a second row
    store.close()
    store = open_store(tmp_path)
    assert store.cursor(default=7) == 14
    first_batch = store.due_batch(now=2e9)  # chain order
    assert first_batch is not None and (first_batch.root, first_batch.stage, first_batch.block) == (a.root, SEEN, 10)
    assert store.due(now=2e9) is None and store.counts()[SEEN] == 0  # no file row before its batch is listed
    assert listed(store, 14, b, a) == 0
    first = store.due(now=2e9)
    assert first is not None and (first.work_key, first.stage, first.block) == (work_key("a"), SEEN, 10)
    assert store.counts()[SEEN] == 2


def test_a_failed_attempt_waits_and_a_row_moves_through_its_stages(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    listed(store, 12, submission("a", 10), submission("b", 11))
    store.retry_later(submission("a"), 60.0, "the coordinator does not have the file yet")
    row = store.due(now=time.time())  # "a" waits a minute: "b" comes first although it is younger
    assert row is not None and row.work_key == work_key("b")
    waiting = store.get(work_key("a"), NODE)
    assert waiting is not None and waiting.attempts == 1 and waiting.last_error is not None
    assert store.next_due_at() is not None

    store.record_verdict(
        submission("b"), reject(Reason.REWARD_MISMATCH, "rewards", "row 0: reward 1.0, recomputed 0.0")
    )
    verified = store.get(work_key("b"), NODE)
    assert verified is not None and (verified.stage, verified.accepted, verified.reason) == (VERIFIED, False, 6)
    store.move(submission("b"), ATTESTED)
    assert store.open_count() == 2  # an attested rejection still has its invalidation to go
    store.move(submission("b"), INVALIDATED, tx_hash="0x" + "ab" * 32)
    assert [r.work_key for r in store.rejections()] == [work_key("b")]
    assert store.rejections()[0].tx_hash == "0x" + "ab" * 32

    store.record_verdict(submission("a"), accept("fine"))
    store.move(submission("a"), ATTESTED)
    assert store.open_count() == 0 and store.due(now=2e9) is None


def test_an_attested_rejection_with_a_note_needs_nothing_more(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    listed(store, 12, submission("late", 10), submission("gone", 11))
    store.record_verdict(submission("late"), reject(Reason.FILE_UNAVAILABLE, "download", "missing"), stage=UNAVAILABLE)
    store.move(submission("late"), ATTESTED, note="the challenge window closed")
    store.move(submission("gone"), UNVERIFIABLE, note="the checkpoint of step 3 is gone")
    assert store.open_count() == 0
    assert store.counts() == {
        SEEN: 0, VERIFIED: 0, ATTESTED: 1, INVALIDATED: 0, REFUSED: 0, UNVERIFIABLE: 1, UNAVAILABLE: 0, COVERED: 0,
        EXPIRED: 0,
    }  # fmt: skip


def test_each_outcome_is_remembered_in_its_own_column_and_only_rejections_have_a_transaction_left(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    labels = ("fine", "clear", "near", "lost")
    listed(store, 20, *(submission(label, 10 + i) for i, label in enumerate(labels)))
    store.record_verdict(submission("fine"), accept("fine"))
    store.record_verdict(submission("clear"), reject(Reason.PROOF_INVALID, "model", "row 0"))
    store.record_verdict(submission("near"), borderline(Reason.PROOF_INVALID, "model", "borderline: row 3"))
    store.record_unjudged(submission("lost"), "could not judge it in 10 tries, the last one: memory")
    for label in ("fine", "clear", "near"):
        store.move(submission(label), ATTESTED)
    store.close()

    store = open_store(tmp_path)
    rows = {label: store.get(work_key(label), NODE) for label in labels}
    assert {label: (r.stage, r.outcome, r.accepted) for label, r in rows.items() if r is not None} == {
        "fine": (ATTESTED, Outcome.ACCEPTED, True),
        "clear": (ATTESTED, Outcome.SLASHABLE, False),
        "near": (ATTESTED, Outcome.BORDERLINE, False),
        "lost": (UNVERIFIABLE, Outcome.UNJUDGED, None),  # no verdict: nothing to attest
    }
    assert [r.work_key for r in store.rejections()] == [work_key("clear"), work_key("near")]
    due = []
    while (row := store.due(now=2e9)) is not None:  # the chain stage's rows, each settled as the daemon would
        due.append(row.outcome)
        store.move(row, INVALIDATED if row.outcome is Outcome.SLASHABLE else REFUSED, tx_hash="0x" + "ab" * 32)
    assert due == [Outcome.SLASHABLE, Outcome.BORDERLINE]


def legacy_state(state: Path, rows: dict[str, tuple[str, int | None, int, str | None]], *, borderline: bool) -> None:
    """A state folder as a validator from before the `outcome` column left it: the verdict as `accepted`, and (from
    issue 17 on, `borderline`) a borderline mark; `rows` maps a label to (stage, accepted, borderline, note)."""
    store = open_store(state)
    listed(store, 30, *(submission(label, 10 + i) for i, label in enumerate(rows)))
    db = store.db
    db.execute("ALTER TABLE work ADD COLUMN accepted INTEGER")
    if borderline:
        db.execute("ALTER TABLE work ADD COLUMN borderline INTEGER NOT NULL DEFAULT 0")
    for label, (stage, accepted, marked, note) in rows.items():
        db.execute(
            "UPDATE work SET stage = ?, accepted = ?, note = ?, check_name = 'model', reason = ? WHERE work_key = ?",
            (stage, accepted, note, None if accepted in (None, 1) else 7, work_key(label).hex()),
        )
        if borderline:
            db.execute("UPDATE work SET borderline = ? WHERE work_key = ?", (marked, work_key(label).hex()))
    db.execute("ALTER TABLE work DROP COLUMN outcome")
    store.close()


def test_a_state_from_before_the_outcome_column_gets_it_from_its_flags_and_keeps_no_second_copy(
    tmp_path: Path,
) -> None:
    legacy_state(
        tmp_path,
        {
            "new": (SEEN, None, 0, None),
            "fine": (ATTESTED, 1, 0, None),
            "clear": (ATTESTED, 0, 0, None),
            "near": (ATTESTED, 0, 1, None),  # a borderline rejection whose refuseLeaf is still to go
            "late": (ATTESTED, 0, 1, "the challenge window closed at 1700086400"),
            "stuck": (UNVERIFIABLE, None, 0, "could not judge it in 10 tries, the last one: memory"),
            "gone": (UNVERIFIABLE, None, 0, GONE),  # never judged: the submission left the chain
        },
        borderline=True,
    )
    store = open_store(tmp_path)
    outcomes = {label: row.outcome for label in ("new", "fine", "clear", "near", "late", "stuck", "gone")
                if (row := store.get(work_key(label), NODE)) is not None}  # fmt: skip
    assert outcomes == {
        "new": None,
        "fine": Outcome.ACCEPTED,
        "clear": Outcome.SLASHABLE,
        "near": Outcome.BORDERLINE,
        "late": Outcome.BORDERLINE,
        "stuck": Outcome.UNJUDGED,
        "gone": None,
    }
    columns = {row[1] for row in store.db.execute("PRAGMA table_info(work)")}
    assert "outcome" in columns and not columns & {"accepted", "borderline"}
    assert store.open_count() == 3  # new, clear and near; late is settled, stuck and gone are final
    store.close()
    assert open_store(tmp_path).get(work_key("near"), NODE).outcome is Outcome.BORDERLINE  # type: ignore[union-attr]


def test_a_state_from_before_issue_17_has_no_borderline_rejections_and_is_read_by_the_rejections_command(
    tmp_path: Path,
) -> None:
    legacy_state(tmp_path, {"clear": (ATTESTED, 0, 0, None), "fine": (VERIFIED, 1, 0, None)}, borderline=False)
    store = ValidatorStore.open_existing(tmp_path)  # what `prime-validate rejections` opens
    assert [(r.work_key, r.outcome) for r in store.rejections()] == [(work_key("clear"), Outcome.SLASHABLE)]
    assert sorted(store.verdict_counts(), key=str) == sorted([(False, 7, 1), (True, None, 1)], key=str)


def test_the_newest_files_verdict_groups_and_sent_invalidations_are_read_from_the_store(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    listed(store, 13, submission("a", 10), submission("b", 11, 1), submission("c", 11, 2), submission("d", 12))
    assert [r.work_key for r in store.newest(3)] == [work_key("d"), work_key("c"), work_key("b")]
    store.record_verdict(submission("a"), accept("fine"))
    store.record_verdict(submission("b"), reject(Reason.REWARD_MISMATCH, "rewards", "row 0"))
    store.record_verdict(submission("c"), reject(Reason.REWARD_MISMATCH, "rewards", "row 1"))
    store.move(submission("b"), INVALIDATED, tx_hash="0x" + "ab" * 32)
    store.move(submission("c"), INVALIDATED)  # moved without a transaction: not counted as sent
    assert sorted(store.verdict_counts(), key=str) == sorted([(True, None, 1), (False, 6, 2)], key=str)
    assert store.invalidations_sent() == 1


def test_a_state_folder_of_another_pool_or_validator_is_refused(tmp_path: Path) -> None:
    open_store(tmp_path).close()
    with pytest.raises(ValidatorStateError, match="pool_id 1, not 2"):
        open_store(tmp_path, pool_id=2)
    with pytest.raises(ValidatorStateError, match="validator"):
        open_store(tmp_path, validator=NODE)
    with pytest.raises(ValidatorStateError, match="holds no validator state"):
        ValidatorStore.open_existing(tmp_path / "elsewhere")
    assert ValidatorStore.open_existing(tmp_path).pool_id == 1


def test_the_step_at_submission_is_the_newest_published_by_then() -> None:
    history = [PublishedStep(0, 1000.0), PublishedStep(1, 1100.0), PublishedStep(2, 1200.0)]
    assert step_at(history, 1150) == 1  # a backlog judged by then, not by now (step 2)
    assert step_at(history, 1100) == 1
    assert step_at(history, 1099) == 0
    assert step_at(history, 999) is None  # older than the history: unknown
    assert step_at([], 5000) is None


def test_clock_slack_widens_the_window_both_ways() -> None:
    """Steps every 10 s and 60 s of slack: a file submitted at 1150 is judged against every step current from
    1090 to 1210. A window that only looked 60 s ahead judged it against step 13 alone, and slashed an honest
    step-0 file as stale on a devnet whose steps came faster than the slack."""
    history = [PublishedStep(s, 1000.0 + 10 * s) for s in range(30)]
    assert steps_around(history, 1150, slack=60) == (9, 21)
    assert steps_around(history, 1030, slack=60) == (None, 9)  # before the history: the early side is unknown
    assert steps_around(history, 1150, slack=0) == (15, 15)


def test_retries_back_off_up_to_half_a_minute() -> None:
    assert [retry_delay(n) for n in (0, 1, 2, 5, 100)] == [1.0, 2.0, 4.0, 30.0, 30.0]


def test_interruptible_work_returns_raises_or_is_dropped_when_stopping() -> None:
    async def scenario() -> float:
        stopping = asyncio.Event()
        assert await interruptible(lambda: 41 + 1, stopping) == 42
        with pytest.raises(ZeroDivisionError):
            await interruptible(lambda: 1 / 0, stopping)
        asyncio.get_running_loop().call_later(0.1, stopping.set)
        started = time.monotonic()
        with pytest.raises(Stopped):
            await interruptible(lambda: time.sleep(5), stopping)  # a long verification: not waited for
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 2


def test_a_batch_a_reorganisation_moved_takes_its_files_along_and_an_unsent_rejection_is_judged_again(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    hashes = {11: b"\x01" * 32, 12: b"\x02" * 32}
    accepted, rejected, sent = leaves_of(["accepted", "rejected", "sent"], 11)
    listed(store, 13, accepted, rejected, sent, hashes=hashes)
    store.record_verdict(accepted, accept("fine"))
    store.record_verdict(rejected, reject(Reason.STALE_STEP, "step", "step 3 is older than 5"))
    store.record_verdict(sent, reject(Reason.STALE_STEP, "step", "step 3 is older than 5"))
    store.move(sent, INVALIDATED, tx_hash="0x" + "cd" * 32)
    assert store.block_hashes() == hashes

    # the same batch, read again two blocks later
    moved = batch_of(leaves_of(["accepted", "rejected", "sent"], 13, 1))
    assert store.record([], 15, {14: b"\x03" * 32}, batches=[moved]) == 0

    after = {}
    for file in (accepted, rejected, sent):
        row = store.get(file.work_key, NODE)
        assert row is not None and (row.block, row.log_index, row.submitted_at) == (13, 1, 1_700_000_013)  # moved
        after[file.work_key] = row.stage, row.accepted, row.reason
    assert after == {
        accepted.work_key: (VERIFIED, True, None),
        rejected.work_key: (SEEN, None, None),  # judged again, by its new time
        sent.work_key: (INVALIDATED, False, int(Reason.STALE_STEP)),  # on chain already: left as it is
    }
    batch = store.get_batch(moved.root, NODE, moved.slot)
    assert batch is not None and (batch.stage, batch.block) == (LISTED, 13)  # its list kept: nothing to fetch again
    assert store.block_hashes() == {14: b"\x03" * 32}
    assert store.cursor(0) == 15


def test_a_file_parked_as_gone_is_judged_again_when_its_batch_is_read_again_elsewhere(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    a = submission("a", 10)
    listed(store, 11, a)
    store.move(a, UNVERIFIABLE, note=GONE)  # what the daemon does when the chain no longer holds the file's batch
    assert store.open_count() == 0
    store.record([], 12, batches=[batch_of([submission("a", 11)])])  # submitted again, one block later
    row = store.get(work_key("a"), NODE)
    assert row is not None and (row.stage, row.note, row.block) == (SEEN, None, 11)
    assert store.open_count() == 1


def test_a_file_parked_as_gone_is_judged_again_when_its_batch_is_read_again_in_the_same_place(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    a = submission("a", 10)
    listed(store, 11, a)
    store.move(a, UNVERIFIABLE, note=GONE)  # the chain did not hold the batch when the file was about to be judged
    store.record([], 12, batches=[batch_of([a])])  # submitted again, in a block of the same height
    row = store.get(work_key("a"), NODE)
    assert row is not None and (row.stage, row.note) == (SEEN, None)
    assert store.open_count() == 1


def test_failures_on_the_validators_side_are_counted_per_file_and_a_state_from_before_gets_the_count(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    listed(store, 12, submission("a", 10), submission("b", 11))
    assert [store.count_unjudged(submission("a")) for _ in range(3)] == [1, 2, 3]
    row, other = store.get(work_key("a"), NODE), store.get(work_key("b"), NODE)
    assert row is not None and other is not None and (row.unjudged, other.unjudged) == (3, 0)
    assert row.stage == SEEN and row.attempts == 0  # counting moves nothing: the daemon decides what follows
    store.db.execute("ALTER TABLE work DROP COLUMN unjudged")  # the schema before issue 32
    store.close()
    reopened = open_store(tmp_path)
    assert reopened.count_unjudged(submission("a")) == 1
