"""The worker daemon's journal: every file it made and how far it got, in SQLite, committed before each next step.

A file moves through these stages, each recorded before the daemon acts on the next:

    written -> uploaded -> submitted -> claimed
                   |            |----> invalidated (with the validator's reason)
                   |            `----> refused (a validator's refuseWork: not paid, not slashed)
                   `-> expired (its assignment expired by the node's clock, or its step fell out of the pool's
                                window, before it was submitted: never submitted, because validators would
                                slash it as stale, or refuse it unpaid)

The file itself lies in `files/<work key>.parquet` (written under a temporary name, fsynced, renamed) before the
`written` row exists, so after a crash at any point a restart finds each file either absent (its generation is
lost, nothing was promised) or recorded with its bytes on disk. Uploads are idempotent (content-addressed), and
before submitting the daemon asks the chain whether the work key is already there, so a crash between sending a
transaction and recording it never submits twice.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import NodeError
from core.statedb import open_bound

STAGES = ("written", "uploaded", "submitted", "claimed", "invalidated", "refused", "expired")
# The detail of a file a validator refused on chain (`refuseWork`): the chain gives no more.
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
    tx TEXT,                     -- the submitWork transaction
    detail TEXT,                 -- why it expired, or the invalidation reason
    verdict TEXT,                -- what validators attested, as the coordinator lists it (signatures checked)
    issued_at INTEGER            -- the assignment's signed issue time (unix seconds); NULL before rollout format 3
);
CREATE INDEX IF NOT EXISTS files_stage ON files (stage);
"""


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
        if "issued_at" not in {row[1] for row in self.db.execute("PRAGMA table_info(files)")}:  # a journal from before
            self.db.execute("ALTER TABLE files ADD COLUMN issued_at INTEGER")

    def close(self) -> None:
        self.db.close()

    def path_of(self, work_key: bytes) -> Path:
        return self.files_dir / f"{work_key.hex()}.parquet"

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
        return self._records(f"WHERE stage IN ({marks}) ORDER BY created", stages)

    def all(self) -> list[FileRecord]:
        return self._records("ORDER BY created", ())

    def get(self, work_key: bytes) -> FileRecord | None:
        found = self._records("WHERE work_key = ?", (work_key.hex(),))
        return found[0] if found else None

    def counts(self) -> dict[str, int]:
        rows = self.db.execute("SELECT stage, COUNT(*) FROM files GROUP BY stage").fetchall()
        return {stage: 0 for stage in STAGES} | dict(rows)

    def _records(self, where: str, args: Sequence[object]) -> list[FileRecord]:
        rows = self.db.execute(
            "SELECT work_key, step, counter, units, stage, created, updated, tx, detail, verdict, issued_at "
            f"FROM files {where}",
            args,
        ).fetchall()
        return [FileRecord(bytes.fromhex(r[0]), *r[1:]) for r in rows]


def read_verdicts(root: Path) -> dict[bytes, str]:
    """Work key -> what validators attested, from a worker's state folder, read-only (for `prime-node status`)."""
    path = root / "state.db"
    if not path.is_file():
        raise WorkerStateError(f"{root} holds no worker state (no state.db)")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT work_key, verdict FROM files WHERE verdict IS NOT NULL").fetchall()
    except sqlite3.DatabaseError as exc:
        raise WorkerStateError(f"{path} is not a worker journal: {exc}") from None
    finally:
        db.close()
    return {bytes.fromhex(key): verdict for key, verdict in rows}
