"""benchmarks/scale.py's machinery, run briefly so that it cannot rot: a pool of 3 members on anvil, a network-mode
trainer, 3 workers through the real client. Only that requests were made and none failed is asserted, never a time."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale import ATTEST, TASKS, UPLOAD, FileMaker, run_phase, start_coordinator
from benchmarks.scale_pool import setup_pool

pytestmark = pytest.mark.slow


def test_three_workers_get_tasks_upload_and_are_attested_without_errors(tmp_path: Path) -> None:
    maker = FileMaker.generate(tmp_path)
    pool = setup_pool(tmp_path, 3, validators=1)
    try:
        assert pool.chain.w3.eth.get_block_number() > 0
        coordinator = start_coordinator(tmp_path, pool, rollouts_per_step=16)
        try:
            phase = asyncio.run(run_phase(pool, coordinator, maker, 3, file_every=0.5, seconds=3.0))
        finally:
            coordinator.stop()
    finally:
        pool.stop()
    assert phase.errors == {}, phase.errors
    assert {TASKS, UPLOAD, ATTEST} <= set(phase.latency_ms)
    assert phase.uploads >= 3 and phase.requests >= 9
    assert phase.coordinator_cpu > 0 and phase.coordinator_rss > 0
