"""The daemons' state databases: created whole with their identity, and refused to another pool or account."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from core.statedb import open_bound
from node.daemon.state import WorkerState, WorkerStateError

SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"


def mismatch(key: str, stored: str, wanted: str) -> Exception:
    return ValueError(f"{key}: {stored} != {wanted}")


def test_a_new_database_appears_only_with_its_identity(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = open_bound(path, SCHEMA, {"pool_id": "1", "node": "0xab"}, mismatch=mismatch)
    db.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]  # no staging copy, no stray log left
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as reader:
        assert dict(reader.execute("SELECT key, value FROM meta")) == {"pool_id": "1", "node": "0xab"}


def test_another_identity_is_refused_and_a_missing_key_is_added(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    open_bound(path, SCHEMA, {"pool_id": "1"}, mismatch=mismatch).close()
    with pytest.raises(ValueError, match="pool_id: 1 != 2"):
        open_bound(path, SCHEMA, {"pool_id": "2"}, mismatch=mismatch)
    db = open_bound(path, SCHEMA, {"pool_id": "1", "chain_id": "31337"}, mismatch=mismatch)
    assert dict(db.execute("SELECT key, value FROM meta")) == {"pool_id": "1", "chain_id": "31337"}


def test_a_worker_state_folder_belongs_to_one_node(tmp_path: Path) -> None:
    WorkerState(tmp_path, chain_id=31337, pool_id=1, node="0xAB").close()
    with pytest.raises(WorkerStateError, match="holds the state of node 0xab, not 0xcd"):
        WorkerState(tmp_path, chain_id=31337, pool_id=1, node="0xCD")
