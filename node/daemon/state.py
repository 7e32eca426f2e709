"""The worker daemon's journal: every file it made, every batch it formed, and how far each got, in SQLite,
committed before each next step.

A file moves through these stages, each recorded before the daemon acts on the next:

    written -> uploaded -> submitted -> claimed
                   |            |----> invalidated (its batch was: the validator's reason, and which leaf)
                   |            `----> refused (a validator's refuseLeaf: not paid, not slashed)
                   `-> expired (its assignment expired by the node's clock, or its step fell out of the pool's
                                window, before it was submitted: never submitted, because validators would
                                slash it as stale, or refuse it unpaid; or its batch was void)

Files go on chain in batches: one Merkle root per batch (`ledger.merkle`, `WorkLedger.submitBatch`), a batch of
one being the single-file case. A batch moves so:

    formed -> listed -> submitted -> claimed
       |         |            |----> invalidated (one leaf shown bad: every file of it unpaid, the node slashed)
       |         |            `----> void (the node was ejected by an invalidation: never paid)
       `---------`-> void (never sent: one of its files expired before it could be)

`formed` journals the batch's composition (the batch row, and each file's root and leaf index, in one SQLite
transaction) before anything leaves the machine, so after a crash the same files form the same root; `listed`
once the coordinator stored its leaf list (its signed receipt kept in `files/<root>.batch-receipt`); `submitted`
with the transaction that recorded the root on chain.

On chain a batch lives in one of the node's numbered slots (`WorkLedger.submitBatch(pool, slot, ...)`), which the
node reuses once the batch there is settled: writing over a settled record costs about 10,000 gas where a fresh one
costs 22,100. The slot is chosen with the batch's composition, in the same transaction: the lowest one no batch
still pending on chain holds (formed, listed or submitted, claimable ones included). A slot frees when its batch is
claimed, invalidated or voided unsent. (A batch void because an invalidation ejected its node stays pending on
chain, but an ejected node submits nothing again.)

The file itself lies in `files/<work key>.parquet` (written under a temporary name, fsynced, renamed) before the
`written` row exists, so after a crash at any point a restart finds each file either absent (its generation is
lost, nothing was promised) or recorded with its bytes on disk. Uploads are idempotent (content-addressed), and
before submitting a batch the daemon asks the chain whether this node's slot journaled with it already holds its
root, so a crash between sending a transaction and recording it never submits twice.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import NodeError
from core.statedb import open_bound
from ledger.merkle import BatchTree, Leaf

STAGES = ("written", "uploaded", "submitted", "claimed", "invalidated", "refused", "expired")
BATCH_STAGES = ("formed", "listed", "submitted", "claimed", "invalidated", "void")
SLOT_HOLDING_STAGES = ("formed", "listed", "submitted")  # a batch in these holds its slot: pending, or about to be
# The detail of a file a validator refused on chain (`refuseLeaf`): the chain gives no more.
REFUSED_DETAIL = "refused on chain by a validator (a borderline file): not paid, not slashed"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    work_key TEXT PRIMARY KEY,   -- sha256 of the file, hex without 0x
    step INTEGER NOT NULL,       -- the policy step its rows claim
    counter INTEGER NOT NULL,    -- the assignment counter
    units INTEGER NOT NULL,      -- work units: total output tokens
    stage TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    tx TEXT,                     -- the transaction that submitted it (its batch's)
    detail TEXT,                 -- why it expired, or the invalidation reason
    verdict TEXT,                -- what validators attested, as the coordinator lists it (signatures checked)
    issued_at INTEGER,           -- the assignment's signed issue time (unix seconds); NULL before rollout format 3
    root TEXT,                   -- the batch it is a leaf of, hex without 0x; NULL until one is formed
    leaf_index INTEGER           -- its position in that batch
);
CREATE INDEX IF NOT EXISTS files_stage ON files (stage);
CREATE TABLE IF NOT EXISTS batches (
    root TEXT PRIMARY KEY,       -- the Merkle root of its leaves (ledger.merkle), hex without 0x
    count INTEGER NOT NULL,      -- leaves: its files
    total_units INTEGER NOT NULL,
    stage TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    tx TEXT,                     -- the submitBatch transaction
    detail TEXT,                 -- why it was submitted again, voided, or invalidated
    slot INTEGER                 -- the node's batch slot on chain; NULL only in one submitted before slots
);
CREATE INDEX IF NOT EXISTS batches_stage ON batches (stage);
"""
# Columns a journal from before batches lacks, added on open (as issued_at was before them).
_ADDED_COLUMNS = (("issued_at", "INTEGER"), ("root", "TEXT"), ("leaf_index", "INTEGER"))
_FILE_COLUMNS = (
    "work_key, step, counter, units, stage, created, updated, tx, detail, verdict, issued_at, root, leaf_index"
)
_BATCH_COLUMNS = "root, count, total_units, stage, created, updated, tx, detail, slot"


class WorkerStateError(NodeError):
    """The state directory belongs to another pool, node or chain, or is not a worker state at all."""


@dataclass(frozen=True)
class FileRecord:
    work_key: bytes
    step: int
    counter: int
    units: int
    stage: str
    created: float
    updated: float
    tx: str | None
    detail: str | None
    verdict: str | None
    issued_at: int | None = None  # the assignment's signed issue time; None in files made before format 3
    root: bytes | None = None  # the batch it is a leaf of; None until one is formed
    leaf_index: int | None = None

    @property
    def leaf(self) -> Leaf:
        return Leaf(self.work_key, self.units)


@dataclass(frozen=True)
class BatchEntry:
    """One batch in the journal: a Merkle root over its files' leaves, in leaf order."""

    root: bytes
    count: int
    total_units: int
    stage: str
    created: float
    updated: float
    tx: str | None
    detail: str | None
    slot: int | None = None  # its slot on chain; None only in a batch submitted to a ledger from before slots


class WorkerState:
    """The journal in `<root>/state.db` and the files in `<root>/files/`."""

    def __init__(self, root: Path, *, chain_id: int, pool_id: int, node: str) -> None:
        self.root = root
        self.files_dir = root / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        identity = {"chain_id": str(chain_id), "pool_id": str(pool_id), "node": node.lower()}

        def mismatch(key: str, stored: str, wanted: str) -> WorkerStateError:
            return WorkerStateError(
                f"{root} holds the state of {key} {stored}, not {wanted}; use another --state folder"
            )

        self.db = open_bound(root / "state.db", SCHEMA, identity, mismatch=mismatch)
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(files)")}
        for name, kind in _ADDED_COLUMNS:  # a journal from before: its files were submitted key by key
            if name not in columns:
                self.db.execute(f"ALTER TABLE files ADD COLUMN {name} {kind}")
        self.db.execute("CREATE INDEX IF NOT EXISTS files_root ON files (root)")
        if "slot" not in {row[1] for row in self.db.execute("PRAGMA table_info(batches)")}:
            self._add_slots()

    def _add_slots(self) -> None:
        """Gives a journal from before slots its `slot` column: each batch not yet sent (formed, listed) gets a slot,
        oldest first, as if formed now. One submitted before keeps none: it is on a ledger from before slots."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("ALTER TABLE batches ADD COLUMN slot INTEGER")
            unsent = self.db.execute(
                "SELECT root FROM batches WHERE stage IN ('formed', 'listed') ORDER BY created, rowid"
            ).fetchall()
            for slot, (root,) in enumerate(unsent):
                self.db.execute("UPDATE batches SET slot = ? WHERE root = ?", (slot, root))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    def path_of(self, work_key: bytes) -> Path:
        return self.files_dir / f"{work_key.hex()}.parquet"

    def batch_receipt_path(self, root: bytes) -> Path:
        """Where the trainer's signed receipt of a batch's leaf list is kept."""
        return self.files_dir / f"{root.hex()}.batch-receipt"

    # --- files ------------------------------------------------------------------------------------

    def add(self, work_key: bytes, *, step: int, counter: int, units: int, issued_at: int | None = None) -> None:
        """Records a file whose bytes are already at `path_of(work_key)`, made for an assignment issued at
        `issued_at` (None: unknown)."""
        if not self.path_of(work_key).is_file():
            raise WorkerStateError(f"recording 0x{work_key.hex()} before its file exists")
        now = time.time()
        self.db.execute(
            "INSERT OR IGNORE INTO files (work_key, step, counter, units, stage, created, updated, issued_at) "
            "VALUES (?, ?, ?, ?, 'written', ?, ?, ?)",
            (work_key.hex(), step, counter, units, now, now, issued_at),
        )

    def move(self, work_keys: Iterable[bytes], stage: str, *, tx: str | None = None, detail: str | None = None) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        now = time.time()
        self.db.executemany(
            "UPDATE files SET stage = ?, updated = ?, tx = COALESCE(?, tx), detail = COALESCE(?, detail) "
            "WHERE work_key = ?",
            [(stage, now, tx, detail, key.hex()) for key in work_keys],
        )

    def note_verdict(self, work_key: bytes, verdict: str) -> None:
        self.db.execute(
            "UPDATE files SET verdict = ?, updated = ? WHERE work_key = ?", (verdict, time.time(), work_key.hex())
        )

    def in_stage(self, *stages: str) -> list[FileRecord]:
        marks = ",".join("?" * len(stages))
        return self._records(f"WHERE stage IN ({marks}) ORDER BY created, rowid", stages)

    def unbatched(self) -> list[FileRecord]:
        """Uploaded files in no batch yet: what the next batch is formed from, oldest first."""
        return self._records("WHERE stage = 'uploaded' AND root IS NULL ORDER BY created, rowid", ())

    def all(self) -> list[FileRecord]:
        return self._records("ORDER BY created, rowid", ())

    def get(self, work_key: bytes) -> FileRecord | None:
        found = self._records("WHERE work_key = ?", (work_key.hex(),))
        return found[0] if found else None

    def counts(self) -> dict[str, int]:
        rows = self.db.execute("SELECT stage, COUNT(*) FROM files GROUP BY stage").fetchall()
        return {stage: 0 for stage in STAGES} | dict(rows)

    def _records(self, where: str, args: Sequence[object]) -> list[FileRecord]:
        rows = self.db.execute(f"SELECT {_FILE_COLUMNS} FROM files {where}", args).fetchall()
        return [_file_record(row) for row in rows]

    # --- batches ----------------------------------------------------------------------------------

    def form_batch(self, records: Sequence[FileRecord], *, avoid: Collection[int] = ()) -> BatchEntry:
        """Journals a batch of `records` (uploaded files in no batch), in this order, as `formed`: the batch row with
        its slot (`free_slot`, never one of `avoid`) and each file's root and leaf index in one transaction, before
        anything about it leaves this machine."""
        for record in records:
            if record.stage != "uploaded" or record.root is not None:
                raise WorkerStateError(
                    f"0x{record.work_key.hex()} cannot join a batch: it is {record.stage}"
                    + (f", a leaf of 0x{record.root.hex()}" if record.root is not None else "")
                )
        tree = BatchTree([r.leaf for r in records])
        now, root = time.time(), tree.root.hex()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute(
                "INSERT INTO batches (root, count, total_units, stage, created, updated, slot) "
                "VALUES (?, ?, ?, 'formed', ?, ?, ?)",
                (root, tree.count, tree.total_units, now, now, self.free_slot(avoid)),
            )
            self.db.executemany(
                "UPDATE files SET root = ?, leaf_index = ?, updated = ? WHERE work_key = ?",
                [(root, index, now, r.work_key.hex()) for index, r in enumerate(records)],
            )
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        formed = self.batch(tree.root)
        assert formed is not None  # just written
        return formed

    def move_batch(
        self,
        root: bytes,
        stage: str,
        *,
        tx: str | None = None,
        detail: str | None = None,
        files: str | None = None,
        file_detail: str | None = None,
        leaf_details: Mapping[int, str] | None = None,
    ) -> None:
        """Moves the batch to `stage`, and, with `files`, each of its files to that stage too (with `file_detail`,
        else `detail`; `leaf_details` by leaf index, over both), in one transaction. A file already refused stays
        refused unless the batch was invalidated: a refused leaf is never paid, and a batch shown bad voids every
        leaf."""
        if stage not in BATCH_STAGES:
            raise ValueError(f"unknown batch stage {stage!r}")
        if files is not None and files not in STAGES:
            raise ValueError(f"unknown stage {files!r}")
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute(
                "UPDATE batches SET stage = ?, updated = ?, tx = COALESCE(?, tx), detail = COALESCE(?, detail) "
                "WHERE root = ?",
                (stage, now, tx, detail, root.hex()),
            )
            if files is not None:
                keep = "" if files == "invalidated" else " AND stage != 'refused'"
                self.db.execute(
                    "UPDATE files SET stage = ?, updated = ?, tx = COALESCE(?, tx), "
                    f"detail = COALESCE(?, detail) WHERE root = ?{keep}",
                    (files, now, tx, file_detail if file_detail is not None else detail, root.hex()),
                )
                self.db.executemany(
                    f"UPDATE files SET detail = ? WHERE root = ? AND leaf_index = ?{keep}",
                    [(text, root.hex(), index) for index, text in (leaf_details or {}).items()],
                )
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def free_slot(self, avoid: Collection[int] = ()) -> int:
        """The lowest slot no batch of the journal holds (`SLOT_HOLDING_STAGES`), and not one of `avoid`."""
        marks = ",".join("?" * len(SLOT_HOLDING_STAGES))
        rows = self.db.execute(
            f"SELECT slot FROM batches WHERE stage IN ({marks}) AND slot IS NOT NULL", SLOT_HOLDING_STAGES
        ).fetchall()
        taken = {slot for (slot,) in rows} | set(avoid)
        return next(slot for slot in range(len(taken) + 1) if slot not in taken)

    def move_slot(self, root: bytes, avoid: Collection[int]) -> int:
        """Gives batch `root`, not sent yet, another slot: the lowest free one not in `avoid`, nor its own. Journaled
        before the batch is sent into it."""
        batch = self.batch(root)
        if batch is None or batch.stage not in ("formed", "listed"):
            raise WorkerStateError(f"batch 0x{root.hex()} cannot move to another slot: it is not waiting to be sent")
        self.db.execute("BEGIN IMMEDIATE")
        try:
            slot = self.free_slot({*avoid, *([] if batch.slot is None else [batch.slot])})
            self.db.execute("UPDATE batches SET slot = ?, updated = ? WHERE root = ?", (slot, time.time(), root.hex()))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return slot

    def release(self, root: bytes, work_keys: Iterable[bytes]) -> None:
        """Takes files out of batch `root` (one that never reached the chain): they are batched again."""
        self.db.executemany(
            "UPDATE files SET root = NULL, leaf_index = NULL, updated = ? WHERE work_key = ? AND root = ?",
            [(time.time(), key.hex(), root.hex()) for key in work_keys],
        )

    def batch(self, root: bytes) -> BatchEntry | None:
        found = self._batches("WHERE root = ?", (root.hex(),))
        return found[0] if found else None

    def batches_in_stage(self, *stages: str) -> list[BatchEntry]:
        marks = ",".join("?" * len(stages))
        return self._batches(f"WHERE stage IN ({marks}) ORDER BY created, rowid", stages)

    def all_batches(self) -> list[BatchEntry]:
        return self._batches("ORDER BY created, rowid", ())

    def members(self, root: bytes) -> list[FileRecord]:
        """The files of batch `root`, in leaf order."""
        return self._records("WHERE root = ? ORDER BY leaf_index", (root.hex(),))

    def batch_counts(self) -> dict[str, int]:
        rows = self.db.execute("SELECT stage, COUNT(*) FROM batches GROUP BY stage").fetchall()
        return {stage: 0 for stage in BATCH_STAGES} | dict(rows)

    def _batches(self, where: str, args: Sequence[object]) -> list[BatchEntry]:
        return _select_batches(self.db, where, args)


def _select_batches(
    db: sqlite3.Connection, where: str, args: Sequence[object], *, columns: str = _BATCH_COLUMNS
) -> list[BatchEntry]:
    rows = db.execute(f"SELECT {columns} FROM batches {where}", args).fetchall()
    return [BatchEntry(bytes.fromhex(r[0]), *r[1:]) for r in rows]


def _file_record(row: Sequence[Any]) -> FileRecord:
    key, step, counter, units, stage, created, updated, tx, detail, verdict, issued_at, root, leaf_index = row
    return FileRecord(
        bytes.fromhex(key), step, counter, units, stage, created, updated, tx, detail, verdict, issued_at,
        root=bytes.fromhex(root) if root is not None else None,
        leaf_index=leaf_index,
    )  # fmt: skip


@dataclass(frozen=True)
class JournalView:
    """A worker's journal read from outside the daemon (`prime-node status --state`): its files and its batches,
    oldest first."""

    files: list[FileRecord]
    batches: list[BatchEntry]

    def file_counts(self) -> dict[str, int]:
        return {stage: sum(f.stage == stage for f in self.files) for stage in STAGES}

    def batch_counts(self) -> dict[str, int]:
        return {stage: sum(b.stage == stage for b in self.batches) for stage in BATCH_STAGES}


def read_journal(root: Path) -> JournalView:
    """The journal in a worker's state folder, read-only. One from before batches reads with none; one from before
    slots, with batches in no slot."""
    path = root / "state.db"
    if not path.is_file():
        raise WorkerStateError(f"{root} holds no worker state (no state.db)")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(files)")}
        if not columns:
            raise sqlite3.DatabaseError("no files table")
        select = _present(_FILE_COLUMNS, columns)
        files = [_file_record(r) for r in db.execute(f"SELECT {select} FROM files ORDER BY created, rowid")]
        batches: list[BatchEntry] = []
        batch_columns = {row[1] for row in db.execute("PRAGMA table_info(batches)")}
        if batch_columns:
            present = _present(_BATCH_COLUMNS, batch_columns)
            batches = _select_batches(db, "ORDER BY created, rowid", (), columns=present)
    except sqlite3.DatabaseError as exc:
        raise WorkerStateError(f"{path} is not a worker journal: {exc}") from None
    finally:
        db.close()
    return JournalView(files, batches)


def _present(wanted: str, columns: set[str]) -> str:
    """`wanted` (a comma-separated column list) with each column a table lacks read as NULL."""
    return ", ".join(c if c in columns else f"NULL AS {c}" for c in wanted.replace(" ", "").split(","))
