"""The SQLite settings every daemon's state uses: autocommit, write-ahead log, and a sync on every commit."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path


def connect(path: Path, schema: str) -> sqlite3.Connection:
    """Opens (or creates) the database at `path` and applies `schema` (CREATE ... IF NOT EXISTS statements).

    Autocommit (each statement commits, or an explicit BEGIN groups several), WAL, and synchronous=FULL: a row
    written before a side effect (a transaction, an upload) survives a power cut, which is what makes the
    daemons restart-safe.
    """
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(schema)
    return db


def open_bound(
    path: Path, schema: str, identity: Mapping[str, str], *, mismatch: Callable[[str, str, str], Exception]
) -> sqlite3.Connection:
    """The state database at `path`, bound to `identity` (its `meta` table: chain, pool, account...).

    A new database is built under a temporary name, bound, and renamed into place, so a reader never finds one
    without its identity. An existing one whose identity differs raises `mismatch(key, stored, wanted)`; a key it
    lacks is added.
    """
    if not path.exists():
        staging = path.with_name(path.name + ".new")
        for leftover in (staging, staging.with_name(staging.name + "-wal"), staging.with_name(staging.name + "-shm")):
            leftover.unlink(missing_ok=True)
        fresh = connect(staging, schema)
        fresh.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", identity.items())
        fresh.close()  # the last connection's close checkpoints the write-ahead log into the file
        os.replace(staging, path)
    db = connect(path, schema)
    stored = dict(db.execute("SELECT key, value FROM meta").fetchall())
    for key, value in identity.items():
        if key in stored and stored[key] != value:
            db.close()
            raise mismatch(key, stored[key], value)
    db.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", identity.items())
    return db
