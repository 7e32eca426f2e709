"""Issue 19, attack 1: one generation re-sliced into many paid files, and work under a counter nobody handed out.

A file must carry the pool trainer's EIP-712 `Assignment` signature over exactly its pool, node, step, counter, shape
and task. Before issue 19 the validator took the shape and the counter from the file itself, and every slice of an
8 x 4 job (a prefix of its groups, or a prefix of each group's samples) was accepted as a file of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from eth_account import Account

from engine.generate import Generated
from ledger.types import Reason
from protocol.rollouts import RolloutRow, encode_rollouts
from protocol.signing import Assignment, SigningDomain, UntimedAssignment, sign
from protocol.tasks.spec import TaskSpec, spec_hash
from validator.store import Submission, ValidatorStore
from validator.verdict import Verdict

TRAINER = Account.from_key(b"\x51" * 32)
STRANGER = Account.from_key(b"\x52" * 32)
DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"
PROMPTS, GROUP, COUNTER = 8, 4, 3
ISSUED_AT = 1_700_000_000


def signature(spec: TaskSpec, prompts: int, group: int, *, counter: int = COUNTER, by: object = TRAINER) -> bytes:
    grant = Assignment(0, NODE, 0, counter, prompts, group, spec_hash(spec), ISSUED_AT)
    return sign(grant, by, DOMAIN)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def job(generate: Callable[..., Generated], task_spec: TaskSpec) -> Generated:
    """The 8 x 4 job the coordinator handed out, with its signature and issue time in the metadata."""
    generated = generate(counter=COUNTER, prompts=PROMPTS, group=GROUP, node=NODE)
    signed = signature(task_spec, PROMPTS, GROUP)
    meta = dataclasses.replace(generated.meta, assignment_signature=signed, assignment_issued_at=ISSUED_AT)
    return Generated(meta, generated.rows)


def file_of(job: Generated, rows: list[RolloutRow] | None = None, **meta: object) -> bytes:
    return encode_rollouts(dataclasses.replace(job.meta, **meta), job.rows if rows is None else rows)


def judged(verify: Callable[..., Verdict], data: bytes) -> Verdict:
    return verify(data, node=NODE, pool_id=0, trainer=TRAINER.address, domain=DOMAIN)


def test_the_file_of_a_signed_assignment_is_accepted(job: Generated, verify: Callable[..., Verdict]) -> None:
    verdict = judged(verify, file_of(job))
    assert verdict.accepted, verdict.to_json()


@pytest.mark.parametrize(
    ("groups", "samples"),
    [(1, GROUP), (4, GROUP), (PROMPTS, 2), (2, 1)],
    ids=["first-group", "first-half-of-the-groups", "half-of-each-group", "one-sample-of-two-groups"],
)
def test_a_slice_of_a_signed_generation_is_refused(
    job: Generated, verify: Callable[..., Verdict], groups: int, samples: int
) -> None:
    rows = [r for r in job.rows if r.group < groups and job.rows.index(r) % GROUP < samples]
    assert len(rows) == groups * samples
    unsigned = verify(file_of(job, rows), node=NODE, pool_id=0)  # what the validator judged before issue 19
    assert unsigned.accepted, unsigned.to_json()
    verdict = judged(verify, file_of(job, rows))
    assert not verdict.accepted and verdict.reason == Reason.WRONG_ASSIGNMENT, verdict.to_json()
    assert "no such assignment was handed out" in verdict.detail
    assert (verdict.evidence["groups"], verdict.evidence["group_size"]) == (groups, samples)


def test_work_under_a_counter_nobody_handed_out_is_refused(
    job: Generated, verify: Callable[..., Verdict], task_spec: TaskSpec
) -> None:
    unsigned = judged(verify, file_of(job, assignment_signature=None, assignment_issued_at=None))
    assert unsigned.reason == Reason.WRONG_ASSIGNMENT and "carries no assignment signature" in unsigned.detail
    forged = judged(verify, file_of(job, assignment_signature=signature(task_spec, PROMPTS, GROUP, by=STRANGER)))
    assert forged.reason == Reason.WRONG_ASSIGNMENT and STRANGER.address in forged.detail
    other = judged(verify, file_of(job, assignment_signature=signature(task_spec, PROMPTS, GROUP, counter=4)))
    assert other.reason == Reason.WRONG_ASSIGNMENT  # the trainer signed counter 4, the file claims counter 3


def test_a_file_claiming_a_later_issue_time_than_signed_is_refused(
    job: Generated, verify: Callable[..., Verdict]
) -> None:
    """Issue 32: the issue time is under the trainer's signature, so a worker cannot move its own deadline."""
    verdict = judged(verify, file_of(job, assignment_issued_at=ISSUED_AT + 3600))
    assert verdict.reason == Reason.WRONG_ASSIGNMENT and f"issued at {ISSUED_AT + 3600}" in verdict.detail


def test_a_format_2_file_is_judged_by_the_untimed_assignment_its_trainer_signed(
    job: Generated, verify: Callable[..., Verdict], task_spec: TaskSpec
) -> None:
    """Files made before issue 32 carry a signature over the assignment without its issue time: still verified, and
    a timed signature does not pass for an untimed one (the type hashes differ)."""
    untimed = UntimedAssignment(0, NODE, 0, COUNTER, PROMPTS, GROUP, spec_hash(task_spec))
    old = file_of(job, format_version=2, assignment_issued_at=None, assignment_signature=sign(untimed, TRAINER, DOMAIN))
    verdict = judged(verify, old)
    assert verdict.accepted, verdict.to_json()
    relabelled = judged(verify, file_of(job, format_version=2, assignment_issued_at=None))
    assert relabelled.reason == Reason.WRONG_ASSIGNMENT, relabelled.to_json()


def test_offline_checks_without_a_trainer_do_not_ask_for_a_signature(
    job: Generated, verify: Callable[..., Verdict]
) -> None:
    verdict = verify(file_of(job, assignment_signature=None, assignment_issued_at=None), node=NODE, pool_id=0)
    assert verdict.accepted, verdict.to_json()


def test_an_assignment_counter_pays_once_per_node(tmp_path: Path) -> None:
    """A second accepted file under a counter (the same job re-encoded, say with another `created_by`) is refused:
    the store remembers the first file that used each (node, counter)."""
    store = ValidatorStore.open(
        tmp_path, chain_id=31337, work_ledger="0x" + "11" * 20, pool_id=1, validator=TRAINER.address
    )
    first, copy = (Submission(1, bytes([n]) * 32, NODE, 10, 5 + n, 0, 1_700_000_000) for n in (1, 2))
    other_node = Submission(1, b"\x03" * 32, STRANGER.address, 10, 9, 0, 1_700_000_000)
    store.record([first, copy, other_node], next_block=10)
    assert store.use_counter(first, 7) == first.work_key
    assert store.use_counter(copy, 7) == first.work_key  # taken: the daemon rejects the copy (reason 3)
    assert store.use_counter(first, 7) == first.work_key  # asking again (a restart) finds its own
    assert store.use_counter(other_node, 7) == other_node.work_key  # counters are per node
    assert store.use_counter(copy, 8) == copy.work_key
    store.close()
    reopened = ValidatorStore.open(
        tmp_path, chain_id=31337, work_ledger="0x" + "11" * 20, pool_id=1, validator=TRAINER.address
    )
    assert reopened.use_counter(copy, 7) == first.work_key  # kept across restarts
    reopened.close()
