"""Issue 32, attack 2, the worker's side: the issue time a trainer signs into each assignment is checked against the
worker's own clock when the assignment arrives, and bounds when the worker still submits its file.

Validators judge staleness by that signed time and the chain's block time (protocol.terms.AssignmentTiming), so a
coordinator whose clock is off could make every file look old. The worker refuses such an assignment before
generating anything (the coordinator's fault: logged, asked again, nothing lost), and never submits a file after
its assignment's deadline by its own clock: the slash that would follow is then the cheater's alone.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path

import pytest
from eth_account import Account

from ledger.accounts import dev_account
from node.config import WorkerSettings
from node.daemon.faults import Fault, FaultyWorker
from node.daemon.local import LocalWorkChain, local_pool
from node.daemon.worker import UntimelyAssignment, WorkerDaemon, check_assignment
from protocol.plan import Job
from protocol.signing import Assignment, SigningDomain, sign
from protocol.tasks.spec import load_task_spec, spec_hash
from protocol.terms import AssignmentTiming, step_window
from tests.loopback_coordinator import coordinator_service, serving
from tests.network_trainer import TASK

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
TRAINER, WORKER, VALIDATOR = Account.from_key(b"\x61" * 32), dev_account(3), dev_account(2)
POOL = 4
TIMING = AssignmentTiming(lifetime=3600, clock_slack=300)


@pytest.mark.parametrize("skew", [-301, 301, -7200])
def test_an_assignment_issued_off_the_workers_clock_is_refused(skew: int) -> None:
    """Past the pool's clock slack either way the signed time is refused; at the slack it is taken."""
    spec = load_task_spec(TASK)
    now = 1_700_000_000
    grant = Assignment(POOL, WORKER.address, 2, 9, 8, 4, spec_hash(spec), now + skew)
    job = Job(POOL, WORKER.address, 2, 9, 8, 4, signature=sign(grant, TRAINER, DOMAIN), issued_at=now + skew)
    with pytest.raises(UntimelyAssignment, match=re.escape(f"{skew:+d} s from this node's")):
        check_assignment(job, spec, TRAINER.address, DOMAIN, TIMING, now=now)
    for edge in (-300, 0, 300):  # within the slack, whichever clock is ahead
        check_assignment(job, spec, TRAINER.address, DOMAIN, TIMING, now=now + skew + edge)


def refusals(daemon: WorkerDaemon) -> int:
    found = re.search(r"^worker_assignments_refused_total (\d+)$", daemon.metrics.render(), re.MULTILINE)
    assert found is not None
    return int(found.group(1))


def test_the_daemon_generates_nothing_for_a_coordinator_whose_clock_is_two_hours_behind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real coordinator on loopback, its clock two hours behind: every assignment it signs is refused with one
    clear log line each, nothing is generated, no weights are fetched, and the daemon neither counts a failure nor
    gives up: stopped, it exits 0 with an empty journal."""
    spec = load_task_spec(TASK)
    service = coordinator_service(
        tmp_path, DOMAIN, trainer=TRAINER, worker=WORKER.address, validator=VALIDATOR.address, pool_id=POOL,
        task_spec_hash=spec_hash(spec), clock=lambda: time.time() - 7200,
    )  # fmt: skip

    async def main() -> tuple[WorkerDaemon, int]:
        async with serving(service) as (_, url):
            settings = WorkerSettings(
                state=tmp_path / "worker", coordinator=url, checkpoints=(url,), task=TASK,
                retry_seconds=0.05, max_failures=1, backend="torch", device="cpu",
            )  # fmt: skip
            chain = LocalWorkChain(DOMAIN, POOL, TRAINER.address, WORKER.address)
            daemon = WorkerDaemon(settings, local_pool(settings, chain, POOL), chain, WORKER)
            running = asyncio.create_task(daemon.run())
            deadline = time.monotonic() + 30
            while refusals(daemon) < 3:
                assert not running.done(), "the daemon stopped by itself"
                assert time.monotonic() < deadline, daemon.metrics.render()
                await asyncio.sleep(0.05)
            daemon.stopping.set()
            return daemon, await running

    with caplog.at_level(logging.WARNING, logger="node.worker"):
        daemon, code = asyncio.run(main())
    assert code == 0  # max_failures 1: a refusal is not a failure
    assert daemon.state.all() == [] and not list((tmp_path / "worker" / "files").iterdir())
    refused = [r.getMessage() for r in caplog.records if "refused an assignment" in r.getMessage()]
    assert len(refused) >= 3, refused
    assert re.search(r"issued at \d+ by the trainer's clock, -720[01] s from this node's", refused[0]), refused
    assert "Check this machine's clock" in refused[0]
    assert not (tmp_path / "worker" / "weights").exists() or not any((tmp_path / "worker" / "weights").iterdir())


def daemons(tmp_path: Path) -> tuple[WorkerDaemon, FaultyWorker]:
    """An honest daemon and a cheating one over local mode's chain (the hooks need no chain)."""
    made: list[WorkerDaemon] = []
    for name in ("honest", "cheat"):
        settings = WorkerSettings(
            state=tmp_path / name, coordinator="http://127.0.0.1:9", checkpoints=("http://127.0.0.1:9",), task=TASK,
            backend="torch", device="cpu",
        )  # fmt: skip
        chain = LocalWorkChain(DOMAIN, POOL, TRAINER.address, WORKER.address)
        pool = local_pool(settings, chain, POOL, assignment_lifetime=TIMING.lifetime, clock_slack=TIMING.clock_slack)
        made.append(FaultyWorker(settings, pool, chain, WORKER, Fault.STALE_STEP) if name == "cheat" else
                    WorkerDaemon(settings, pool, chain, WORKER))  # fmt: skip
    honest, cheat = made
    assert isinstance(cheat, FaultyWorker)
    return honest, cheat


def test_a_file_whose_assignment_expired_by_the_workers_clock_is_never_submitted(tmp_path: Path) -> None:
    """The honest daemon expires a file once its own clock passes `submit_by` (the deadline less the slack), and
    keeps one still in time and one made before issue times existed; a cheater submits them all."""
    now = int(time.time())
    issued = {
        b"\x01" * 32: now - TIMING.lifetime + TIMING.clock_slack - 5,  # its submit_by passed 5 s ago
        b"\x02" * 32: now - TIMING.lifetime + TIMING.clock_slack + 60,  # a minute left
        b"\x03" * 32: None,  # a journal entry from before issue 32: judged by the step window alone
    }
    window = step_window(5, 2)
    for daemon in daemons(tmp_path):
        for counter, (key, at) in enumerate(issued.items()):
            daemon.state.path_of(key).write_bytes(b"file")
            daemon.state.add(key, step=5, counter=counter, units=1, issued_at=at)
        ready = daemon.state.all()
        kept = {r.work_key for r in daemon.submittable(ready, window)}
        if isinstance(daemon, FaultyWorker):
            assert kept == set(issued)
            continue
        assert kept == {b"\x02" * 32, b"\x03" * 32}
        expired = daemon.state.get(b"\x01" * 32)
        assert expired is not None and expired.stage == "expired" and "expired at" in (expired.detail or "")
        # the daemon passes the later of its clock and the chain's head: a chain two minutes ahead expires the next
        ahead = daemon.submittable([r for r in ready if r.work_key != b"\x01" * 32], window, now=now + 120)
        assert {r.work_key for r in ahead} == {b"\x03" * 32}


def test_the_journal_keeps_issue_times_and_reads_a_journal_from_before_them(tmp_path: Path) -> None:
    """A state folder written before issue 32 has no issue-time column: it is added, and old rows read as None."""
    import sqlite3

    from node.daemon.state import WorkerState

    root = tmp_path / "state"
    state = WorkerState(root, chain_id=31337, pool_id=POOL, node=WORKER.address)
    state.path_of(b"\x01" * 32).write_bytes(b"file")
    state.add(b"\x01" * 32, step=0, counter=0, units=1, issued_at=1_700_000_000)
    state.close()
    db = sqlite3.connect(root / "state.db", isolation_level=None)
    db.executescript(  # the table as an older node wrote it
        "CREATE TABLE old AS SELECT work_key, step, counter, units, stage, created, updated, tx, detail, verdict "
        "FROM files; DROP TABLE files; ALTER TABLE old RENAME TO files;"
    )
    assert "issued_at" not in {row[1] for row in db.execute("PRAGMA table_info(files)")}
    db.close()
    reopened = WorkerState(root, chain_id=31337, pool_id=POOL, node=WORKER.address)
    (old,) = reopened.all()
    assert old.issued_at is None
    reopened.path_of(b"\x02" * 32).write_bytes(b"file")
    reopened.add(b"\x02" * 32, step=0, counter=1, units=1, issued_at=1_700_000_123)
    assert [r.issued_at for r in reopened.all()] == [None, 1_700_000_123]
