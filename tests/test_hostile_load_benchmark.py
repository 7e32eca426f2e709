"""benchmarks/hostile_load.py's machinery, run briefly so that it cannot rot: the coordinator in its own process, four
members uploading through the real client, and two hostile patterns from the attacker's process. Only that the
members' uploads and attestations all succeeded and that the figures were read is asserted, never a time."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.hostile_load import run_all

pytestmark = pytest.mark.slow


def test_members_upload_through_idle_connections_and_unsigned_bodies(tmp_path: Path) -> None:
    rows = asyncio.run(run_all(tmp_path, seconds=5.0, connections=40, patterns=["baseline", "idle", "unsigned_60mib"]))
    assert [row.pattern for row in rows] == ["baseline", "idle", "unsigned_60mib"]
    for row in rows:
        assert row.uploads > 0 and row.failed_uploads == 0 and row.failed_attestations == 0, row
        assert row.peak_rss_mib > 0 and row.peak_fds > 0 and row.tracebacks == 0, row
