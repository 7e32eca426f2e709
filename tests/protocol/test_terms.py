"""The pool's terms and the rules every role reads them with (protocol.terms): the step window, the batch states."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.types import BatchRecord, BatchStatus, PoolConfig, PoolInfo
from protocol.pool_spec import load_pool_spec, pool_terms
from protocol.tasks.spec import load_task_spec, spec_hash
from protocol.terms import (
    DEFAULT_ASYNC_LEVEL,
    DEFAULT_CLOCK_SLACK,
    DEFAULT_MAX_FILE_BYTES,
    AssignmentTiming,
    PoolTerms,
    TermsMismatch,
    batch_state,
    step_window,
)

WINDOW = 3600
TRAINER, NODE = "0x" + "11" * 20, "0x" + "22" * 20
TASK = Path(__file__).resolve().parents[2] / "configs" / "tasks" / "default.toml"


@pytest.mark.parametrize(
    ("status", "now", "state"),
    [
        (BatchStatus.PENDING, 1000 + WINDOW - 1, "pending"),  # invalidateBatch needs now < submittedAt + window
        (BatchStatus.PENDING, 1000 + WINDOW, "claimable"),  # claimBatches needs now >= submittedAt + window
        (BatchStatus.INVALIDATED, 1000 + WINDOW, "invalidated"),
        (BatchStatus.CLAIMED, 1000 + WINDOW, "claimed"),
        (BatchStatus.NONE, 1000 + WINDOW, "none"),
    ],
)
def test_a_batch_is_pending_until_its_window_closes_then_claimable(status: BatchStatus, now: int, state: str) -> None:
    batch = BatchRecord(1, b"\1" * 32, NODE, TRAINER, 3, 30, 0, 1000, status)
    assert batch_state(batch, WINDOW, now) == state
    # a node an invalidation ejected: its pending batches are void (an owner's ejection voids nothing: not `voided`)
    assert batch_state(batch, WINDOW, now, voided=True) == ("void" if status == BatchStatus.PENDING else state)


def test_the_step_window_holds_the_current_step_and_async_level_steps_before_it() -> None:
    window = step_window(10, 2)
    assert [s for s in range(6, 13) if s in window] == [8, 9, 10] and str(window) == "[8, 10]"
    assert "9" not in window and 9.0 not in window  # only integer steps
    wide = step_window(10, 2, earliest=7)  # a submission whose current step clocks leave uncertain: 7 .. 10
    assert (wide.oldest, wide.current) == (5, 10)
    assert step_window(3, 0).oldest == 3
    with pytest.raises(ValueError, match="at least 0"):
        step_window(3, -1)


def pool(spec_uri: str = "") -> PoolInfo:
    return PoolInfo(4, TRAINER, PoolConfig("p", b"\0" * 32, spec_uri, TRAINER, 1, WINDOW, 1, 1, max_units_per_key=77))


def test_terms_come_from_the_chain_record_and_the_spec(tmp_path: Path) -> None:
    bare = pool_terms(pool(), None)
    assert (bare.async_level, bare.max_file_bytes) == (DEFAULT_ASYNC_LEVEL, DEFAULT_MAX_FILE_BYTES)
    assert bare.task_hash is None and bare.source == "pool 4 (no spec)"
    assert (bare.trainer, bare.challenge_window, bare.max_units_per_key) == (TRAINER, WINDOW, 77)
    (tmp_path / "pool.toml").write_text(
        f'coordinator = "http://c:1"\ncheckpoints = ["http://o:2"]\ntask = "{TASK}"\nasync_level = 3\n'
        "max_file_bytes = 8192\nprompts_per_task = 4\ngroup_size = 16\n"
    )
    spec = load_pool_spec(str(tmp_path / "pool.toml"))
    terms = pool_terms(pool(spec.uri), spec)
    assert (terms.async_level, terms.max_file_bytes, terms.prompts_per_task, terms.group_size) == (3, 8192, 4, 16)
    assert terms.task_hash == spec_hash(load_task_spec(TASK)) and terms.window(5) == step_window(5, 3)
    batch = BatchRecord(1, b"\1" * 32, NODE, TRAINER, 3, 30, 0, 1000, BatchStatus.PENDING)
    assert terms.state_of(batch, 1000 + WINDOW - 1) == "pending" and terms.state_of(batch, 1000 + WINDOW) == "claimable"
    assert terms.timing == AssignmentTiming(lifetime=4 * 3600, clock_slack=DEFAULT_CLOCK_SLACK)  # k + 1 = 4 steps
    (tmp_path / "pool.toml").write_text(
        f'coordinator = "http://c:1"\ncheckpoints = ["http://o:2"]\ntask = "{TASK}"\nassignment_lifetime = 900\n'
        "clock_slack = 30\n"
    )
    timed = pool_terms(pool(spec.uri), load_pool_spec(str(tmp_path / "pool.toml")))
    assert timed.timing == AssignmentTiming(lifetime=900, clock_slack=30)


def test_an_assignment_lives_async_level_plus_one_steps_and_the_deadlines_leave_twice_the_slack() -> None:
    """The defaults follow the async level: the trainer may use a file for up to k + 1 steps after its assignment
    was issued, and a step is given an hour. The worker's own deadline comes 2 x slack before the validator's."""
    bare = PoolTerms(pool_id=4, trainer=TRAINER, challenge_window=WINDOW, max_units_per_key=1)
    assert bare.timing == AssignmentTiming(lifetime=3 * 3600, clock_slack=300)  # k = 2: three hours
    assert PoolTerms(pool_id=4, trainer=TRAINER, challenge_window=1, max_units_per_key=1, async_level=0).timing == (
        AssignmentTiming(lifetime=3600, clock_slack=300)
    )
    timing, issued = bare.timing, 1_700_000_000
    assert timing.submit_by(issued) == issued + 3 * 3600 - 300
    assert timing.stale_after(issued) == issued + 3 * 3600 + 300
    assert timing.stale_after(issued) - timing.submit_by(issued) == 2 * timing.clock_slack
    assert not timing.off_clock(issued, issued + 300) and not timing.off_clock(issued, issued - 300)
    assert timing.off_clock(issued, issued + 301) and timing.off_clock(issued, issued - 301)
    with pytest.raises(ValueError, match="more than twice the clock slack"):
        AssignmentTiming(lifetime=600, clock_slack=300)
    with pytest.raises(ValueError, match="clock_slack must be in"):
        PoolTerms(pool_id=4, trainer=TRAINER, challenge_window=1, max_units_per_key=1, clock_slack=-1)


def test_a_setting_that_contradicts_the_terms_names_itself_and_both_values() -> None:
    terms = PoolTerms(pool_id=4, trainer=TRAINER, challenge_window=WINDOW, max_units_per_key=1, spec_uri="file:///p")
    terms.require("--async-level", 2, "async_level")  # agrees: nothing happens
    with pytest.raises(TermsMismatch, match=r"--async-level is 1, but pool 4's spec file:///p says 2") as caught:
        terms.require("--async-level", 1, "async_level")
    assert (caught.value.key, caught.value.own, caught.value.pool) == ("--async-level", 1, 2)
    with pytest.raises(ValueError, match="async_level must be in"):
        PoolTerms(pool_id=4, trainer=TRAINER, challenge_window=1, max_units_per_key=1, async_level=-1)
