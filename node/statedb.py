"""The SQLite settings every daemon's state uses: autocommit, write-ahead log, and a sync on every commit."""

from __future__ import annotations

import sqlite3
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
