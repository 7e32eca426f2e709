"""The validator daemon's progress, in SQLite: the event cursor, one row per batch on chain and one row per file.

A batch is (node, slot, root): records belong to their submitter on chain, so two nodes committing the same root are
two batches, and a node's slot holds one batch at a time, reused once it is settled (`validator.slots` reads what a
slot holds now). A file is (node, work key), a leaf of its node's batch, verified against its own node (a copied
file names another node and is rejected). A batch is `seen` until its leaf list is read and checked (`listed`: its
files are rows) or condemned (`rejected`, then `invalidated` on chain).

A file moves through these stages; each transition is committed before the daemon's next side effect:

    seen --verify--> verified --attest--> attested --invalidateBatch--> invalidated (the whole batch void)
       |                                      |  (an accept, or a reject whose window closed, ends at attested)
       |                                      `--refuseLeaf (a borderline reject: no slash, not paid)--> refused
       |--(not downloadable within the grace period)--> unavailable --attest--> attested --> invalidated
       |--(the checkpoint of its step is gone, or this validator could not judge it in judge_attempts tries)-->
       |       unverifiable (final: not the worker's fault, never slashed)
       |--(another validator judged it, or it was invalidated on chain)--> covered (final, validator.sharing)
       `--(another validator's share, its window closed with no verdict heard)--> expired (final, never slashed)

Validators that share a pool record every submission, but a row is `mine` only when this validator is one of its
key's replicas (validator.sharing); the others wait as `seen`, not mine, until an attestation heard from another
validator covers them, the chain invalidates them, their window closes, or their validator goes silent and
`reassign` makes them mine.

Each row holds how judging it ended (`outcome`, a `validator.verdict.Outcome`; NULL until then): accepted, slashable,
borderline, or unjudged (this validator could not judge it). Which rows still have a transaction to send is asked of
`validator.verdict.sanction`, the same function the daemon asks which transaction it is.

`seen` rows are written together with the cursor that moves past their block, in one transaction, so a crash
never skips a submission. A crash during verification leaves the row `seen` and a restart verifies it again; a
verdict once recorded is never recomputed. Before sending invalidateBatch the daemon re-reads the batch on chain,
so a crash between sending the transaction and recording it never invalidates twice.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from core.statedb import connect, open_bound
from validator.errors import ValidatorStateError
from validator.slots import Presence, SlotBatch, presence
from validator.verdict import Outcome, Verdict, sanction

SEEN, VERIFIED, ATTESTED, INVALIDATED = "seen", "verified", "attested", "invalidated"
UNVERIFIABLE, UNAVAILABLE, COVERED, EXPIRED = "unverifiable", "unavailable", "covered", "expired"
REFUSED = "refused"  # a borderline rejection refused on chain (refuseLeaf): never paid, never slashed
STAGES = (SEEN, VERIFIED, ATTESTED, INVALIDATED, UNVERIFIABLE, UNAVAILABLE, COVERED, EXPIRED, REFUSED)
# A batch's stages: `seen` (its leaf list to fetch and check), then `listed` (its leaves are work rows, judged file by
# file), or `rejected` (the list itself is at fault: never made available, or not what the chain recorded) until
# its invalidation is `invalidated`; `unverifiable` (the coordinator lost the list it receipted, or the chain no
# longer holds the batch: note GONE) and `covered` (another validator invalidated it) are final.
LISTED, REJECTED = "listed", "rejected"
BATCH_STAGES = (SEEN, LISTED, REJECTED, INVALIDATED, UNVERIFIABLE, COVERED)
DB_NAME = "validator.db"
# A batch is its node's submission of a root into one of its slots: a slot is reused once its batch is settled, and a
# node may commit one root in two slots (or in one, again, once the first is claimed), each a batch of its own. A root
# submitted again into its slot a window or more later (validator.slots) takes its row over as a new submission.
_BATCHES_TABLE = """
CREATE TABLE IF NOT EXISTS {table} (  -- BatchSubmitted records: their leaf lists become work rows once fetched
    pool_id INTEGER NOT NULL,
    node TEXT NOT NULL,
    slot INTEGER NOT NULL,           -- the node's batch slot that holds it (0 in a state from before slots)
    root TEXT NOT NULL,              -- the Merkle root, hex without 0x
    count INTEGER NOT NULL,          -- leaves, as the chain recorded
    total_units INTEGER NOT NULL,
    block INTEGER NOT NULL,          -- of the BatchSubmitted event
    log_index INTEGER NOT NULL,
    submitted_at INTEGER NOT NULL,   -- that block's timestamp
    stage TEXT NOT NULL,             -- seen, listed, rejected, invalidated, unverifiable, covered
    leaves BLOB,                     -- the leaf list the coordinator served (protocol.batches), once fetched
    reason INTEGER,                  -- a rejection of the batch as a whole (its leaf list, not one file)
    leaf_index INTEGER,              -- the leaf that rejection shows with its proof; NULL: no list to prove from
    detail TEXT,
    tx_hash TEXT,                    -- of the invalidateBatch (or invalidateUnavailableBatch) this validator sent
    note TEXT,                       -- why it ended where it did
    last_error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    first_seen REAL NOT NULL,
    next_try REAL NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (pool_id, node, slot, root)
);
"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS work (
    pool_id INTEGER NOT NULL,
    work_key TEXT NOT NULL,          -- sha256 of the file, hex without 0x
    node TEXT NOT NULL,              -- the on-chain submitter
    units INTEGER NOT NULL,
    block INTEGER NOT NULL,          -- of its batch's BatchSubmitted event
    log_index INTEGER NOT NULL,
    submitted_at INTEGER NOT NULL,   -- that block's timestamp
    stage TEXT NOT NULL,
    outcome TEXT,                    -- validator.verdict.Outcome: NULL until the file is judged (or found unjudgeable)
    reason INTEGER,
    check_name TEXT,
    detail TEXT,
    tx_hash TEXT,                    -- of the invalidateBatch (or refuseLeaf) this validator sent
    note TEXT,                       -- why the row ended where it did (an attested rejection with a note is done)
    last_error TEXT,                 -- the last transient failure (the row is tried again)
    attempts INTEGER NOT NULL DEFAULT 0,
    mine INTEGER NOT NULL DEFAULT 1, -- this validator checks it (validator.sharing); 0: another validator's share
    slash_after REAL,                -- a replica's rejection: unix time from which it may send invalidateBatch
    unjudged INTEGER NOT NULL DEFAULT 0,  -- verifications that failed on this validator's side (CouldNotJudge)
    first_seen REAL NOT NULL,        -- unix time this validator first read the submission
    next_try REAL NOT NULL,          -- unix time before which the row is left alone
    updated REAL NOT NULL,
    root TEXT,                       -- its batch (hex, no 0x); NULL only in a state of a ledger before batches
    leaf_index INTEGER,              -- its position in that batch's leaf list
    slot INTEGER,                    -- the node's batch slot that held that batch; NULL with root
    PRIMARY KEY (pool_id, node, work_key)
);
CREATE INDEX IF NOT EXISTS work_stage ON work (stage, next_try);
CREATE INDEX IF NOT EXISTS work_key ON work (work_key);
CREATE TABLE IF NOT EXISTS heard (  -- other validators' attestations heard on gossip (validator.sharing)
    work_key TEXT NOT NULL,
    validator TEXT NOT NULL,
    accepted INTEGER NOT NULL,
    heard_at REAL NOT NULL,
    PRIMARY KEY (work_key, validator)
);
CREATE TABLE IF NOT EXISTS block_hashes (  -- the last blocks the event cursor passed: how a reorganisation is found
    number INTEGER PRIMARY KEY,
    hash TEXT NOT NULL
);
{_BATCHES_TABLE.format(table="batches")}
CREATE INDEX IF NOT EXISTS batches_stage ON batches (stage, next_try);
CREATE TABLE IF NOT EXISTS counters (  -- assignment counters used by accepted files: each pays once
    pool_id INTEGER NOT NULL,
    node TEXT NOT NULL,
    counter INTEGER NOT NULL,
    work_key TEXT NOT NULL,          -- the first accepted file that used it
    PRIMARY KEY (pool_id, node, counter)
);
"""
_ROW = "WHERE pool_id = ? AND node = ? AND work_key = ?"
# The note of a row whose submission the chain no longer holds (a reorganisation removed it); final unless the
# submission is read again.
GONE = "not on chain: a reorganisation removed the submission"
_REJECTED = ", ".join(f"'{o}'" for o in (Outcome.SLASHABLE, Outcome.BORDERLINE))
_SANCTIONED = ", ".join(f"'{o}'" for o in Outcome if sanction(o) is not None)  # what goes on chain
# Rows with something left to do: a verdict to reach, an attestation to post, or a transaction to send (an attested
# row with a note was settled without one: the chain had it already, or its window had closed).
_OPEN = (
    f"mine = 1 AND (stage IN ('{SEEN}', '{VERIFIED}', '{UNAVAILABLE}') "
    f"OR (stage = '{ATTESTED}' AND outcome IN ({_SANCTIONED}) AND note IS NULL))"
)
_THEIRS = f"mine = 0 AND stage = '{SEEN}'"  # another validator's share, not judged as far as this one knows
_BATCH = "WHERE pool_id = ? AND node = ? AND slot = ? AND root = ?"
_BATCH_OPEN = f"stage IN ('{SEEN}', '{REJECTED}') AND note IS NULL"  # a list to fetch, or an invalidation to send


@dataclass(frozen=True)
class Submission:
    """One submitted file: a leaf of a BatchSubmitted event (`root` and `leaf_index`; block, log index and timestamp
    are the batch's). The daemon writes them when it lists a batch; a row without a root is one a test wrote."""

    pool_id: int
    work_key: bytes
    node: str
    units: int
    block: int
    log_index: int
    submitted_at: int
    root: bytes | None = field(default=None, kw_only=True)
    leaf_index: int | None = field(default=None, kw_only=True)
    slot: int | None = field(default=None, kw_only=True)  # the node's batch slot that held the batch


@dataclass(frozen=True)
class BatchSubmission:
    """One BatchSubmitted event, with its block's timestamp; `slot` is the node's batch slot it went into, which every
    chain call about the batch names."""

    pool_id: int
    root: bytes
    node: str
    count: int
    total_units: int
    block: int
    log_index: int
    submitted_at: int
    slot: int = field(kw_only=True)

    @property
    def in_slot(self) -> SlotBatch:
        return SlotBatch(self.slot, self.root, self.submitted_at)


@dataclass(frozen=True)
class BatchRow(BatchSubmission):
    """A batch and how far the validator got with its leaf list."""

    stage: str
    leaves: bytes | None  # the leaf list as served (protocol.batches), once fetched
    reason: int | None  # a rejection of the batch as a whole
    leaf_index: int | None  # the leaf that rejection shows; None: the list itself was never made available
    detail: str | None
    tx_hash: str | None
    note: str | None
    last_error: str | None
    attempts: int
    first_seen: float
    next_try: float


@dataclass(frozen=True)
class WorkRow(Submission):
    """A submission and how far the validator got with it."""

    stage: str
    outcome: Outcome | None  # None until judged
    reason: int | None
    check: str | None
    detail: str | None
    tx_hash: str | None
    note: str | None
    last_error: str | None
    attempts: int
    first_seen: float
    next_try: float
    mine: bool = True
    slash_after: float | None = None
    unjudged: int = 0  # verifications that failed on this validator's side

    @property
    def accepted(self) -> bool | None:
        """The attestation's answer: None when the file has no verdict (not judged yet, or unjudged)."""
        if self.outcome is None or self.outcome is Outcome.UNJUDGED:
            return None
        return self.outcome is Outcome.ACCEPTED


_FIELDS = tuple(f.name for f in fields(WorkRow))
_COLUMNS = ", ".join("check_name" if name == "check" else name for name in _FIELDS)


class ValidatorStore:
    """`<state>/validator.db`, bound on first use to one chain, WorkLedger, pool and validator address."""

    def __init__(self, path: Path, db: sqlite3.Connection, pool_id: int) -> None:
        self.path, self.db, self.pool_id = path, db, pool_id

    @classmethod
    def open(cls, state_dir: Path, *, chain_id: int, work_ledger: str, pool_id: int, validator: str) -> ValidatorStore:
        """The daemon's store, created on first use; refuses a state folder of another pool, chain or validator."""
        state_dir.mkdir(parents=True, exist_ok=True)
        path = state_dir / DB_NAME
        identity = {
            "chain_id": str(chain_id),
            "work_ledger": work_ledger.lower(),
            "pool_id": str(pool_id),
            "validator": validator.lower(),
        }

        def mismatch(key: str, stored: str, wanted: str) -> ValidatorStateError:
            return ValidatorStateError(
                f"{state_dir} holds the state of {key} {stored}, not {wanted}; use another --state folder"
            )

        db = open_bound(path, SCHEMA, identity, mismatch=mismatch)
        _add_missing_columns(db)
        return cls(path, db, pool_id)

    @classmethod
    def open_existing(cls, state_dir: Path) -> ValidatorStore:
        """An existing state, for reading (`prime-validate rejections`); never creates one."""
        path = state_dir / DB_NAME
        if not path.is_file():
            raise ValidatorStateError(f"{state_dir} holds no validator state ({DB_NAME} is missing); check --state")
        try:
            db = connect(path, SCHEMA)
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise ValidatorStateError(f"{path} is not a validator state: {exc}") from None
        if "pool_id" not in meta:
            raise ValidatorStateError(f"{path} is not a validator state: it names no pool")
        _add_missing_columns(db)
        return cls(path, db, int(meta["pool_id"]))

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # --- the cursor and new submissions --------------------------------------------------------------

    def cursor(self, default: int) -> int:
        """The next block to read; `default` (the deployment block) before the first poll."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'next_block'").fetchone()
        return default if row is None else int(row[0])

    def block_hashes(self) -> dict[int, bytes]:
        """The hashes of the last blocks read, as the event follower remembered them."""
        return {int(n): bytes.fromhex(h) for n, h in self.db.execute("SELECT number, hash FROM block_hashes")}

    def record(
        self,
        submissions: Sequence[Submission],
        next_block: int,
        hashes: Mapping[int, bytes] | None = None,
        *,
        mine: Callable[[bytes], bool] = lambda work_key: True,
        batches: Sequence[BatchSubmission] = (),
        window: int | None = None,
    ) -> int:
        """Adds the submissions and `batches` as `seen` and moves the cursor (with the follower's block hashes),
        atomically; returns how many were new. `mine(work_key)` says whether a new file is this validator's to
        check (every validator fetches every batch's leaf list: its leaves are shared as files are).

        A submission read again at another place in the chain (a reorganisation moved it) takes its new block and
        timestamp. A verdict that may depend on that timestamp and has not gone on chain (a rejection not yet
        invalidated), and a row parked as no longer on chain, are judged again from `seen`. A batch's root submitted
        again into its slot `window` (the pool's challenge window) or more after the recorded one is a new batch: it
        takes the row over, from `seen`, and the recorded one's files stay as they are, submitted before it
        (`validator.slots`). Without a window (a store no chain stands behind), a batch read again is the same one.
        """
        now = time.time()
        with self._transaction():
            before = self.db.total_changes
            self.db.executemany(
                "INSERT OR IGNORE INTO work (pool_id, work_key, node, units, block, log_index, submitted_at, stage, "
                "first_seen, next_try, updated, mine) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        s.pool_id,
                        s.work_key.hex(),
                        s.node,
                        s.units,
                        s.block,
                        s.log_index,
                        s.submitted_at,
                        SEEN,
                        now,
                        now,
                        now,
                        int(mine(s.work_key)),
                    )
                    for s in submissions
                ],
            )
            self.db.executemany(
                "INSERT OR IGNORE INTO batches (pool_id, node, slot, root, count, total_units, block, log_index, "
                "submitted_at, stage, first_seen, next_try, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (b.pool_id, b.node, b.slot, b.root.hex(), b.count, b.total_units, b.block, b.log_index,
                     b.submitted_at, SEEN, now, now, now)
                    for b in batches
                ],
            )  # fmt: skip
            added = self.db.total_changes - before
            for s in submissions:
                self._moved_by_reorganisation(s, now)
            for b in batches:
                added += self._batch_read_again(b, now, window)
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('next_block', ?)", (str(next_block),))
            if hashes is not None:
                self.db.execute("DELETE FROM block_hashes")
                self.db.executemany(
                    "INSERT INTO block_hashes (number, hash) VALUES (?, ?)", [(n, h.hex()) for n, h in hashes.items()]
                )
        return added

    def _moved_by_reorganisation(self, s: Submission, now: float) -> None:
        row = self.get(s.work_key, s.node)
        if row is None:
            return
        unmoved = (row.block, row.log_index, row.submitted_at, row.units) == (
            s.block,
            s.log_index,
            s.submitted_at,
            s.units,
        )
        if unmoved and row.note != GONE:
            return
        judge_again = row.note == GONE or (row.accepted is False and row.stage in (VERIFIED, UNAVAILABLE, ATTESTED))
        self.db.execute(
            f"UPDATE work SET block = ?, log_index = ?, submitted_at = ?, units = ?, updated = ? {_ROW}",
            (s.block, s.log_index, s.submitted_at, s.units, now, *self._identity(s)),
        )
        if judge_again and row.tx_hash is None:
            self.db.execute(
                "UPDATE work SET stage = ?, outcome = NULL, reason = NULL, check_name = NULL, detail = NULL, "
                f"note = NULL, next_try = ? {_ROW}",
                (SEEN, now, *self._identity(s)),
            )

    def _batch_read_again(self, b: BatchSubmission, now: float, window: int | None) -> int:
        """A batch read again: a new submission of its root into its slot (returns 1), or the recorded one, perhaps
        moved by a reorganisation (returns 0)."""
        row = self.get_batch(b.root, b.node, b.slot)
        if row is None:
            return 0
        if window is not None and presence(row.in_slot, b.in_slot, window) is Presence.OVERWRITTEN:
            self._submitted_again(b, now)
            return 1
        self._batch_moved_by_reorganisation(row, b, now)
        return 0

    def _submitted_again(self, b: BatchSubmission, now: float) -> None:
        """`b` is its root submitted again into the slot once the recorded batch was settled: the row is the new
        batch's, from `seen`, its leaf list kept (the root commits to it). The recorded batch's files keep their rows
        and their place: files submitted before `b`, which `validator.batches` holds against it."""
        self.db.execute(
            "UPDATE batches SET count = ?, total_units = ?, block = ?, log_index = ?, submitted_at = ?, stage = ?, "
            "reason = NULL, leaf_index = NULL, detail = NULL, tx_hash = NULL, note = NULL, last_error = NULL, "
            f"attempts = 0, first_seen = ?, next_try = ?, updated = ? {_BATCH}",
            (b.count, b.total_units, b.block, b.log_index, b.submitted_at, SEEN, now, now, now,
             *self._batch_identity(b)),
        )  # fmt: skip

    def _batch_moved_by_reorganisation(self, row: BatchRow, b: BatchSubmission, now: float) -> None:
        """A batch read again at another place takes it, and its leaves with it. One parked as gone, or a rejection
        of its list not yet sent, is fetched and checked again from `seen`; its leaves follow
        `_moved_by_reorganisation`'s rule, each, wherever the batch was read."""
        place = (b.block, b.log_index, b.submitted_at)
        identity = self._batch_identity(b)
        if place != (row.block, row.log_index, row.submitted_at) or row.note == GONE:
            self.db.execute(
                f"UPDATE batches SET block = ?, log_index = ?, submitted_at = ?, updated = ? {_BATCH}",
                (*place, now, *identity),
            )
            if row.tx_hash is None and (row.note == GONE or row.stage == REJECTED):
                self.db.execute(
                    "UPDATE batches SET stage = ?, reason = NULL, leaf_index = NULL, detail = NULL, note = NULL, "
                    f"next_try = ? {_BATCH}",
                    (SEEN, now, *identity),
                )
        # its leaves even when the batch is where it was: a file parked as gone (the chain did not hold the batch
        # when the file was about to be judged) is judged again now that the batch is read again. Only its own: the
        # files of an earlier batch of the root in the slot are another submission's
        for leaf in self._rows(f"{_BATCH} AND submitted_at = ?", (*identity, row.submitted_at)):
            moved = Submission(
                leaf.pool_id, leaf.work_key, leaf.node, leaf.units, *place, root=b.root, leaf_index=leaf.leaf_index,
                slot=b.slot,
            )  # fmt: skip
            self._moved_by_reorganisation(moved, now)

    # --- batches: their leaf lists ----------------------------------------------------------------------

    def due_batch(self, now: float) -> BatchRow | None:
        """The oldest batch with something left to do whose retry time has come."""
        found = self._batches(f"WHERE {_BATCH_OPEN} AND next_try <= ? ORDER BY block, log_index LIMIT 1", (now,))
        return found[0] if found else None

    def get_batch(self, root: bytes, node: str, slot: int) -> BatchRow | None:
        """`node`'s batch `root` in its slot `slot`, if this validator has read it."""
        found = self._batches(_BATCH, (self.pool_id, node, slot, root.hex()))
        return found[0] if found else None

    def batches(self) -> list[BatchRow]:
        """Every batch, in chain order."""
        return self._batches("ORDER BY block, log_index", ())

    def batch_rejections(self) -> list[BatchRow]:
        """Every batch its leaf list condemned, in chain order."""
        return self._batches("WHERE reason IS NOT NULL ORDER BY block, log_index", ())

    def recorded_keys(self, node: str, work_keys: Sequence[bytes]) -> dict[bytes, SlotBatch]:
        """Which of `work_keys` `node` submitted before, on chain as far as this validator knows: key -> the batch it
        is a leaf of (its slot, root and submission time; the slot may hold another batch since). A file submitted
        twice would be paid twice."""
        found: dict[bytes, SlotBatch] = {}
        for start in range(0, len(work_keys), 500):  # SQLite's bound on a statement's variables
            chunk = [k.hex() for k in work_keys[start : start + 500]]
            marks = ",".join("?" * len(chunk))
            for key, slot, root, submitted_at in self.db.execute(
                f"SELECT work_key, slot, root, submitted_at FROM work WHERE pool_id = ? AND node = ? "
                f"AND work_key IN ({marks}) AND root IS NOT NULL AND slot IS NOT NULL AND note IS NOT ?",
                (self.pool_id, node, *chunk, GONE),
            ):
                found[bytes.fromhex(key)] = SlotBatch(int(slot), bytes.fromhex(root), int(submitted_at))
        return found

    def list_batch(
        self, batch: BatchSubmission, leaves: bytes, files: Sequence[Submission], mine: Callable[[bytes], bool]
    ) -> int:
        """Records the batch's leaf list and its leaves as `seen` work rows, atomically; returns how many rows are
        new (a batch listed again after a reorganisation keeps the rows it had)."""
        now = time.time()
        root, slot = batch.root.hex(), batch.slot
        with self._transaction():
            before = self.db.total_changes
            self.db.executemany(
                "INSERT OR IGNORE INTO work (pool_id, work_key, node, units, block, log_index, submitted_at, stage, "
                "first_seen, next_try, updated, mine, root, leaf_index, slot) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (f.pool_id, f.work_key.hex(), f.node, f.units, f.block, f.log_index, f.submitted_at, SEEN, now,
                     now, now, int(mine(f.work_key)), root, f.leaf_index, slot)
                    for f in files
                ],
            )  # fmt: skip
            added = self.db.total_changes - before
            # a file whose earlier batch the chain no longer holds (the daemon checked) is this batch's leaf now,
            # judged again from `seen` unless its transaction went out
            self.db.executemany(
                "UPDATE work SET root = ?, slot = ?, leaf_index = ?, block = ?, log_index = ?, submitted_at = ?, "
                "units = ?, stage = CASE WHEN tx_hash IS NULL THEN ? ELSE stage END, "
                "outcome = CASE WHEN tx_hash IS NULL THEN NULL ELSE outcome END, "
                "note = CASE WHEN tx_hash IS NULL THEN NULL ELSE note END, next_try = ?, updated = ? "
                "WHERE pool_id = ? AND node = ? AND work_key = ? "
                "AND NOT (root IS ? AND slot IS ? AND submitted_at = ?)",
                [
                    (root, slot, f.leaf_index, f.block, f.log_index, f.submitted_at, f.units, SEEN, now, now,
                     self.pool_id, f.node, f.work_key.hex(), root, slot, batch.submitted_at)
                    for f in files
                ],
            )  # fmt: skip
            self.db.execute(
                f"UPDATE batches SET stage = ?, leaves = ?, note = NULL, next_try = ?, updated = ? {_BATCH}",
                (LISTED, leaves, now, now, *self._batch_identity(batch)),
            )
        return added

    def reject_batch(
        self, batch: BatchSubmission, reason: int, detail: str, *, leaf_index: int | None, leaves: bytes | None
    ) -> None:
        """The batch's leaf list is at fault (`reason`); `leaf_index` is the leaf its invalidation proves, None when
        there is no list to prove from (reason 8: never made available)."""
        now = time.time()
        self.db.execute(
            "UPDATE batches SET stage = ?, reason = ?, leaf_index = ?, detail = ?, leaves = COALESCE(?, leaves), "
            f"next_try = ?, updated = ? {_BATCH}",
            (REJECTED, reason, leaf_index, detail, leaves, now, now, *self._batch_identity(batch)),
        )

    def move_batch(
        self, batch: BatchSubmission, stage: str, *, tx_hash: str | None = None, note: str | None = None
    ) -> None:
        """Moves a batch to `stage`; `note` (None clears it) ends a rejected batch that needs nothing more."""
        if stage not in BATCH_STAGES:
            raise ValueError(f"unknown batch stage {stage!r}")
        now = time.time()
        self.db.execute(
            f"UPDATE batches SET stage = ?, tx_hash = COALESCE(?, tx_hash), note = ?, next_try = ?, updated = ? "
            f"{_BATCH}",
            (stage, tx_hash, note, now, now, *self._batch_identity(batch)),
        )

    def retry_batch_later(self, batch: BatchSubmission, delay: float, error: str) -> None:
        """Leaves the batch's stage as it is; counts the attempt and its failure, and waits `delay` seconds."""
        now = time.time()
        self.db.execute(
            f"UPDATE batches SET attempts = attempts + 1, next_try = ?, last_error = ?, updated = ? {_BATCH}",
            (now + delay, error, now, *self._batch_identity(batch)),
        )

    def batch_invalidated_elsewhere(self, root: bytes, node: str, validator: str) -> int:
        """Another validator's invalidation of `node`'s batch `root`: the batch, if not fetched here yet, and its
        leaves not judged yet are `covered` (a void batch is never paid). Returns how many rows moved."""
        now, note = time.time(), f"its batch was invalidated on chain by {validator}"
        # the event names no slot: whichever slot holds the root, the node is ejected and its pending batches void
        identity, where = (self.pool_id, node, root.hex()), "WHERE pool_id = ? AND node = ? AND root = ?"
        moved = self.db.execute(
            f"UPDATE batches SET stage = ?, note = ?, updated = ? {where} AND stage = '{SEEN}'",
            (COVERED, note, now, *identity),
        ).rowcount
        return (
            moved
            + self.db.execute(
                f"UPDATE work SET stage = ?, note = ?, updated = ? {where} AND stage = '{SEEN}'",
                (COVERED, note, now, *identity),
            ).rowcount
        )

    def _batch_identity(self, batch: BatchSubmission) -> tuple[int, str, int, str]:
        return self.pool_id, batch.node, batch.slot, batch.root.hex()

    def _batches(self, where: str, args: Sequence[object]) -> list[BatchRow]:
        rows = self.db.execute(f"SELECT {_BATCH_COLUMNS} FROM batches {where}", args).fetchall()
        return [_batch_row(row) for row in rows]

    # --- what to do next -----------------------------------------------------------------------------

    def due(self, now: float) -> WorkRow | None:
        """The oldest submission with something left to do whose retry time has come."""
        found = self._rows(f"WHERE {_OPEN} AND next_try <= ? ORDER BY block, log_index LIMIT 1", (now,))
        return found[0] if found else None

    def next_due_at(self) -> float | None:
        """When the earliest open row or batch may be tried again; None when nothing is open."""
        row = self.db.execute(
            f"SELECT MIN(t) FROM (SELECT MIN(next_try) AS t FROM work WHERE {_OPEN} "
            f"UNION ALL SELECT MIN(next_try) FROM batches WHERE {_BATCH_OPEN})"
        ).fetchone()
        return None if row[0] is None else float(row[0])

    def open_count(self) -> int:
        """Files and batches with something left to do."""
        files = int(self.db.execute(f"SELECT COUNT(*) FROM work WHERE {_OPEN}").fetchone()[0])
        return files + int(self.db.execute(f"SELECT COUNT(*) FROM batches WHERE {_BATCH_OPEN}").fetchone()[0])

    # --- sharing the pool (validator.sharing) ----------------------------------------------------------

    def theirs_count(self) -> int:
        return int(self.db.execute(f"SELECT COUNT(*) FROM work WHERE {_THEIRS}").fetchone()[0])

    def reassign(self, mine: Callable[[bytes], bool]) -> int:
        """Makes mine every row of another validator's share that `mine(work_key)` now gives to this one (its
        validator went silent); returns how many. Rows already mine stay mine."""
        now = time.time()
        keys = [bytes.fromhex(k) for (k,) in self.db.execute(f"SELECT DISTINCT work_key FROM work WHERE {_THEIRS}")]
        taken = [(now, now, k.hex()) for k in keys if mine(k)]
        with self._transaction():
            before = self.db.total_changes
            self.db.executemany(
                f"UPDATE work SET mine = 1, next_try = ?, updated = ? WHERE work_key = ? AND {_THEIRS}", taken
            )
            return self.db.total_changes - before

    def hear(self, work_key: bytes, validator: str, accepted: bool, replication: int) -> int:
        """Records another validator's attestation, and covers the rows it completes (`cover`); returns how many."""
        self.db.execute(
            "INSERT OR REPLACE INTO heard (work_key, validator, accepted, heard_at) VALUES (?, ?, ?, ?)",
            (work_key.hex(), validator, int(accepted), time.time()),
        )
        return self.cover([work_key], replication)

    def cover(self, work_keys: Sequence[bytes], replication: int) -> int:
        """Rows of another validator's share among `work_keys` that `replication` other validators have accepted, and
        none rejected, become `covered`; returns how many. A rejection covers nothing: its rejecter invalidates the
        work, and if that one stops first, whoever takes the key over judges it itself."""
        if not work_keys:
            return 0
        now, covered = time.time(), 0
        with self._transaction():
            for key in {k.hex() for k in work_keys}:
                accepts, rejects = self.db.execute(
                    "SELECT COALESCE(SUM(accepted), 0), COALESCE(SUM(1 - accepted), 0) FROM heard WHERE work_key = ?",
                    (key,),
                ).fetchone()
                if accepts >= replication and rejects == 0:
                    covered += self.db.execute(
                        f"UPDATE work SET stage = ?, note = ?, updated = ? WHERE work_key = ? AND {_THEIRS}",
                        (COVERED, f"accepted by {accepts} other validator(s)", now, key),
                    ).rowcount
        return covered

    def forget_heard(self, before: float) -> int:
        """Drops the attestations heard before `before` (unix time): their keys' windows have closed."""
        return self.db.execute("DELETE FROM heard WHERE heard_at < ?", (before,)).rowcount

    def take_unheard(self, submitted_before: int) -> int:
        """Makes mine every row of another validator's share submitted before `submitted_before` (chain time) with no
        verdict heard: its validator is alive but has not judged it (lazy, swamped, or its gossip lost), and what
        nobody judges is paid to a cheater when its window closes. Returns how many."""
        now = time.time()
        cursor = self.db.execute(
            f"UPDATE work SET mine = 1, next_try = ?, updated = ? WHERE {_THEIRS} AND submitted_at < ?",
            (now, now, submitted_before),
        )
        return cursor.rowcount

    def expire_theirs(self, closed_before: int) -> int:
        """Rows of another validator's share submitted before `closed_before` (chain time), whose window has closed
        with no verdict heard: nothing can be invalidated any more. Returns how many became `expired`. (This
        validator's own rows are verified however late: the trainer may still train on an attested file.)"""
        cursor = self.db.execute(
            f"UPDATE work SET stage = ?, note = ?, updated = ? WHERE {_THEIRS} AND submitted_at < ?",
            (EXPIRED, "another validator's share; its window closed before a verdict was heard", time.time(),
             closed_before),
        )  # fmt: skip
        return cursor.rowcount

    def slash_at(self, row: Submission, when: float) -> None:
        """Sets when `row`'s invalidation may be sent (a replica's wait), and leaves the row until then."""
        self.db.execute(
            f"UPDATE work SET slash_after = ?, next_try = ?, updated = ? {_ROW}",
            (when, when, time.time(), *self._identity(row)),
        )

    # --- transitions ---------------------------------------------------------------------------------

    def retry_later(self, row: Submission, delay: float, error: str) -> None:
        """Leaves the stage as it is; counts the attempt and its failure, and waits `delay` seconds."""
        now = time.time()
        self.db.execute(
            f"UPDATE work SET attempts = attempts + 1, next_try = ?, last_error = ?, updated = ? {_ROW}",
            (now + delay, error, now, *self._identity(row)),
        )

    def count_unjudged(self, row: Submission) -> int:
        """Counts one verification of `row` that failed on this validator's side; returns how many have."""
        with self._transaction():
            identity = self._identity(row)
            self.db.execute(f"UPDATE work SET unjudged = unjudged + 1, updated = ? {_ROW}", (time.time(), *identity))
            (count,) = self.db.execute(f"SELECT unjudged FROM work {_ROW}", identity).fetchone()
        return int(count)

    def record_verdict(self, row: Submission, verdict: Verdict, *, stage: str = VERIFIED) -> None:
        if stage not in (VERIFIED, UNAVAILABLE):
            raise ValueError(f"a verdict moves a row to verified or unavailable, not {stage!r}")
        now = time.time()
        self.db.execute(
            "UPDATE work SET stage = ?, outcome = ?, reason = ?, check_name = ?, detail = ?, "
            f"next_try = ?, updated = ? {_ROW}",
            (
                stage,
                str(verdict.outcome),
                None if verdict.reason is None else int(verdict.reason),
                verdict.check,
                verdict.detail,
                now,
                now,
                *self._identity(row),
            ),
        )

    def record_unjudged(self, row: Submission, note: str) -> None:
        """This validator could not judge `row`'s file (its step's checkpoint is gone, the coordinator lost the file,
        or `CouldNotJudge` in every try), for the reason `note`: final, never attested, nothing sent."""
        now = time.time()
        self.db.execute(
            f"UPDATE work SET stage = ?, outcome = ?, note = ?, next_try = ?, updated = ? {_ROW}",
            (UNVERIFIABLE, str(Outcome.UNJUDGED), note, now, now, *self._identity(row)),
        )

    def move(self, row: Submission, stage: str, *, tx_hash: str | None = None, note: str | None = None) -> None:
        """Moves a row to `stage`; `note` (None clears it) ends an attested rejection that needs nothing more."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        now = time.time()
        self.db.execute(
            f"UPDATE work SET stage = ?, tx_hash = COALESCE(?, tx_hash), note = ?, next_try = ?, updated = ? {_ROW}",
            (stage, tx_hash, note, now, now, *self._identity(row)),
        )

    def _identity(self, row: Submission) -> tuple[int, str, str]:
        return self.pool_id, row.node, row.work_key.hex()

    def use_counter(self, row: Submission, counter: int) -> bytes:
        """Records that `row`'s file used `counter` of its node, unless a file did before; returns the work key of
        the first file that used it (`row`'s own when it is the first, also when asked again)."""
        with self._transaction():
            self.db.execute(
                "INSERT OR IGNORE INTO counters (pool_id, node, counter, work_key) VALUES (?, ?, ?, ?)",
                (self.pool_id, row.node, counter, row.work_key.hex()),
            )
            (first,) = self.db.execute(
                "SELECT work_key FROM counters WHERE pool_id = ? AND node = ? AND counter = ?",
                (self.pool_id, row.node, counter),
            ).fetchone()
        return bytes.fromhex(first)

    # --- reading -------------------------------------------------------------------------------------

    def get(self, work_key: bytes, node: str) -> WorkRow | None:
        """`node`'s record of `work_key`, if this validator has seen it."""
        found = self._rows(_ROW, (self.pool_id, node, work_key.hex()))
        return found[0] if found else None

    def rejections(self) -> list[WorkRow]:
        """Every file with a rejecting verdict, in chain order."""
        return self._rows(f"WHERE outcome IN ({_REJECTED}) ORDER BY block, log_index", ())

    def counts(self) -> dict[str, int]:
        rows = self.db.execute("SELECT stage, COUNT(*) FROM work GROUP BY stage").fetchall()
        return {stage: 0 for stage in STAGES} | dict(rows)

    def newest(self, limit: int) -> list[WorkRow]:
        """The `limit` most recent submissions, newest first (chain order reversed)."""
        return self._rows("ORDER BY block DESC, log_index DESC LIMIT ?", (limit,))

    def verdict_counts(self) -> list[tuple[bool, int | None, int]]:
        """(accepted, reason, files) for every verdict given so far, grouped."""
        rows = self.db.execute(
            f"SELECT outcome = '{Outcome.ACCEPTED}' AS ok, reason, COUNT(*) FROM work "
            f"WHERE outcome IN ('{Outcome.ACCEPTED}', {_REJECTED}) GROUP BY ok, reason"
        ).fetchall()
        return [(bool(accepted), reason, int(n)) for accepted, reason, n in rows]

    def invalidations_sent(self) -> int:
        """Rejected files whose invalidation transaction was sent."""
        return self._sent(INVALIDATED)

    def refusals_sent(self) -> int:
        """Borderline rejections whose refuseLeaf transaction was sent."""
        return self._sent(REFUSED)

    def _sent(self, stage: str) -> int:
        query = "SELECT COUNT(*) FROM work WHERE stage = ? AND tx_hash IS NOT NULL"
        return int(self.db.execute(query, (stage,)).fetchone()[0])

    def _rows(self, where: str, args: Sequence[object]) -> list[WorkRow]:
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM work {where}", args).fetchall()
        return [_work_row(row) for row in rows]


_BATCH_FIELDS = tuple(f.name for f in fields(BatchRow))
_BATCH_COLUMNS = ", ".join(_BATCH_FIELDS)


def _batch_row(row: Sequence[Any]) -> BatchRow:
    values = dict(zip(_BATCH_FIELDS, row, strict=True))
    values["root"] = bytes.fromhex(values["root"])
    return BatchRow(**values)


def _work_row(row: Sequence[Any]) -> WorkRow:
    """The columns are WorkRow's fields in order; the keys are stored as hex and the outcome as its name."""
    values = dict(zip(_FIELDS, row, strict=True))
    values["work_key"] = bytes.fromhex(values["work_key"])
    values["root"] = None if values["root"] is None else bytes.fromhex(values["root"])
    values["outcome"] = None if values["outcome"] is None else Outcome(values["outcome"])
    values["mine"] = bool(values["mine"])
    return WorkRow(**values)


def _add_missing_columns(db: sqlite3.Connection) -> None:
    """A state written before a column existed gets it with its default (CREATE IF NOT EXISTS adds none)."""
    have = {row[1] for row in db.execute("PRAGMA table_info(work)")}
    if "outcome" not in have:
        _outcome_from_flags(db)
    if "mine" not in have:
        db.execute("ALTER TABLE work ADD COLUMN mine INTEGER NOT NULL DEFAULT 1")
    if "slash_after" not in have:
        db.execute("ALTER TABLE work ADD COLUMN slash_after REAL")
    if "unjudged" not in have:
        db.execute("ALTER TABLE work ADD COLUMN unjudged INTEGER NOT NULL DEFAULT 0")
    if "root" not in have:  # a state from before batches (another ledger's): every row a per-key record
        db.execute("ALTER TABLE work ADD COLUMN root TEXT")
        db.execute("ALTER TABLE work ADD COLUMN leaf_index INTEGER")
    if "slot" not in have:  # a state from before batch slots (another WorkLedger's): NULL, as for no batch
        db.execute("ALTER TABLE work ADD COLUMN slot INTEGER")
    if "slot" not in {row[1] for row in db.execute("PRAGMA table_info(batches)")}:
        _batches_in_slots(db)


def _batches_in_slots(db: sqlite3.Connection) -> None:
    """A state from before batch slots keyed its batches by (node, root); the key takes the slot now, and SQLite
    changes no table's key in place: the table is copied into one of the new shape (slot 0: that ledger had no slots;
    the state belongs to another WorkLedger, which the daemon refuses, so its batches are only read), in one
    transaction."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if "slot" not in {row[1] for row in db.execute("PRAGMA table_info(batches)")}:  # or another process did it
            columns = ", ".join(row[1] for row in db.execute("PRAGMA table_info(batches)"))
            db.execute(_BATCHES_TABLE.format(table="batches_in_slots"))
            db.execute(f"INSERT INTO batches_in_slots ({columns}, slot) SELECT {columns}, 0 FROM batches")
            db.execute("DROP TABLE batches")  # its index with it
            db.execute("ALTER TABLE batches_in_slots RENAME TO batches")
            db.execute("CREATE INDEX IF NOT EXISTS batches_stage ON batches (stage, next_try)")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _outcome_from_flags(db: sqlite3.Connection) -> None:
    """A state from before the `outcome` column held a verdict as `accepted` (NULL, 0 or 1) and `borderline` (0 or 1,
    since issue 17; a state older than that had no borderline verdicts), and a file it could not judge as an
    `unverifiable` row whose note is not GONE's. The outcome is derived from them, in one transaction with dropping
    them: no second copy is left to disagree with it, and a daemon from before this column, given this state, stops
    at its first query rather than read a rejection without its borderline mark and slash it."""
    db.execute("BEGIN IMMEDIATE")
    try:
        have = {row[1] for row in db.execute("PRAGMA table_info(work)")}
        if "outcome" not in have:  # another process may have migrated it while this one waited for the lock
            borderline = "borderline = 1" if "borderline" in have else "0"
            db.execute("ALTER TABLE work ADD COLUMN outcome TEXT")
            db.execute(
                "UPDATE work SET outcome = CASE "
                f"WHEN accepted = 1 THEN '{Outcome.ACCEPTED}' "
                f"WHEN accepted = 0 AND {borderline} THEN '{Outcome.BORDERLINE}' "
                f"WHEN accepted = 0 THEN '{Outcome.SLASHABLE}' "
                f"WHEN stage = '{UNVERIFIABLE}' AND note IS NOT ? THEN '{Outcome.UNJUDGED}' END",
                (GONE,),
            )
            db.execute("ALTER TABLE work DROP COLUMN accepted")
            if "borderline" in have:
                db.execute("ALTER TABLE work DROP COLUMN borderline")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
