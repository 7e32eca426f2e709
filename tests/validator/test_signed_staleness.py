"""Issue 32, attack 2: the pool owner's coordinator decided what was stale.

Validators read step timing from the coordinator's unsigned `GET /v1/steps`. A coordinator that served "step 0 at
T - 2 h, step 5 at T - 1 h" made an honest step-0 file, with a trainer-signed assignment and an upload receipt, fail
as reason 4 (`the file is from step 0, outside [3, 5]`), not borderline, and it was slashed. Now the assignment
carries the time the trainer issued it, under its signature, and a file is stale (reason 4, slashable) only when
the chain's block time of its submission is past that time plus the pool's assignment lifetime and clock slack
(protocol.terms.AssignmentTiming). What the coordinator says about its steps can at most refuse a file unpaid: a
borderline rejection, which is never invalidated on chain.

First the validator's real checks on files of the tiny model, at the edges of the deadline; then the real
validator daemon on anvil against a real coordinator on loopback that lies about its steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from eth_account import Account

from engine.generate import Generated, generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel
from ledger.accounts import dev_account
from ledger.chain import LocalChain, free_port
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.merkle import BatchTree
from ledger.types import BatchStatus, Reason
from node.daemon.worker import check_assignment
from protocol.coordinator.client import CoordinatorClient
from protocol.coordinator.pool import PublishedStep
from protocol.rollouts import encode_rollouts
from protocol.signing import Assignment, SigningDomain, UntimedAssignment, sign
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec, spec_hash
from protocol.terms import AssignmentTiming
from tests.ledger.helpers import make_pool, onboard
from tests.loopback_coordinator import coordinator_service, serving
from tests.validator.batching import make_available, submit
from trainer.coordinator import ApiConfig, CoordinatorService
from validator.config import ValidatorConfig
from validator.daemon import PoolSetup, ValidatorDaemon
from validator.store import SEEN, VERIFIED, WorkRow
from validator.verdict import Outcome, Verdict

TRAINER = Account.from_key(b"\x71" * 32)
DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"  # the node the conftest's files are for
TIMING = AssignmentTiming(lifetime=600, clock_slack=60)
ISSUED_AT = 1_700_000_000
COUNTER = 5


def grant(spec: TaskSpec, issued_at: int | None = ISSUED_AT) -> Assignment | UntimedAssignment:
    fields = (0, NODE, 0, COUNTER, 2, 2, spec_hash(spec))
    return UntimedAssignment(*fields) if issued_at is None else Assignment(*fields, issued_at)


@pytest.fixture(scope="module")
def job(generate: Callable[..., Generated], task_spec: TaskSpec) -> Generated:
    """A 2 x 2 file of step 0 whose assignment the trainer signed at ISSUED_AT."""
    made = generate(counter=COUNTER, prompts=2, group=2, step=0)
    signature = sign(grant(task_spec), TRAINER, DOMAIN)
    return Generated(dataclasses.replace(made.meta, assignment_signature=signature, assignment_issued_at=ISSUED_AT),
                     made.rows)  # fmt: skip


def judged(verify: Callable[..., Verdict], data: bytes, **expected: object) -> Verdict:
    """The daemon's view of a submission: the trainer, the domain and the pool's assignment timing."""
    return verify(data, node=NODE, pool_id=0, trainer=TRAINER.address, domain=DOMAIN, timing=TIMING, **expected)


def test_an_honest_file_is_never_stale_by_the_coordinators_word_only_refused(
    job: Generated, verify: Callable[..., Verdict]
) -> None:
    """Submitted 30 s after its assignment was issued: whatever steps the coordinator claims were current then, the
    file is at most refused without a slash; with a truthful history it is accepted."""
    data = encode_rollouts(job.meta, job.rows)
    for current, earliest in ((5, 5), (5, 3), (2**40, 2**40)):
        verdict = judged(verify, data, submitted_at=ISSUED_AT + 30, current_step=current, earliest_step=earliest)
        assert (verdict.reason, verdict.check, verdict.borderline) == (Reason.STALE_STEP, "step", True), verdict
        assert "not signed: refused, not slashed" in verdict.detail
    honest = judged(verify, data, submitted_at=ISSUED_AT + 30, current_step=0)
    assert honest.accepted, honest.to_json()


def test_a_file_submitted_past_its_signed_deadline_is_stale_and_slashable(
    job: Generated, verify: Callable[..., Verdict]
) -> None:
    """The deadline is the signed issue time plus the lifetime plus the clock slack, by the block's time: one second
    past it the file is stale (reason 4, not borderline), whatever the coordinator says; at it, it is not."""
    data = encode_rollouts(job.meta, job.rows)
    deadline = TIMING.stale_after(ISSUED_AT)
    assert deadline == ISSUED_AT + 600 + 60
    late = judged(verify, data, submitted_at=deadline + 1, current_step=0)  # the coordinator calls it fresh
    assert (late.reason, late.check, late.borderline) == (Reason.STALE_STEP, "step", False), late.to_json()
    assert (late.evidence["issued_at"], late.evidence["submitted_at"], late.evidence["deadline"]) == (
        ISSUED_AT,
        deadline + 1,
        deadline,
    )
    assert judged(verify, data, submitted_at=deadline, current_step=0).accepted
    early = judged(verify, data, submitted_at=ISSUED_AT - TIMING.clock_slack - 10, current_step=0)
    assert early.accepted, early.to_json()  # the trainer's clock ahead of the chain's: never the worker's fault


def test_a_file_from_before_issue_times_is_never_slashed_as_stale(
    job: Generated, verify: Callable[..., Verdict], task_spec: TaskSpec
) -> None:
    """A format-2 file carries no signed time: ten days after its submission nothing signed says it is late, so it
    is accepted, and outside the coordinator's window it is refused unpaid, never slashed."""
    signature = sign(grant(task_spec, issued_at=None), TRAINER, DOMAIN)
    meta = dataclasses.replace(job.meta, format_version=2, assignment_signature=signature, assignment_issued_at=None)
    data = encode_rollouts(meta, job.rows)
    assert judged(verify, data, submitted_at=ISSUED_AT + 10 * 86400, current_step=0).accepted
    refused = judged(verify, data, submitted_at=ISSUED_AT + 10 * 86400, current_step=5)
    assert (refused.reason, refused.borderline) == (Reason.STALE_STEP, True), refused.to_json()


def test_a_forged_issue_time_is_a_wrong_assignment_not_a_fresh_file(
    job: Generated, verify: Callable[..., Verdict]
) -> None:
    """A late worker that writes a later issue time into its file no longer holds the trainer's signature."""
    meta = dataclasses.replace(job.meta, assignment_issued_at=ISSUED_AT + 3600)
    verdict = judged(verify, encode_rollouts(meta, job.rows), submitted_at=ISSUED_AT + 3600, current_step=0)
    assert (verdict.reason, verdict.check) == (Reason.WRONG_ASSIGNMENT, "assignment"), verdict.to_json()


# --- the real daemon, a lying coordinator -------------------------------------------------------------------------

OWNER, PROVIDER, WORKER, VALIDATOR = 0, 1, 6, 9


def onboarded_pool(ledger_for: Callable[[int], Ledger]) -> tuple[int, Ledger]:
    """A pool whose trainer is anvil account 0 and validator account 9, and the onboarded worker's ledger."""
    owner = ledger_for(OWNER)
    pool_id = make_pool(owner)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    return pool_id, onboard(owner, ledger_for(PROVIDER), dev_account(WORKER), pool_id)


def pool_coordinator(tmp_path: Path, pool_id: int, domain: SigningDomain, spec: TaskSpec) -> CoordinatorService:
    """The real coordinator of the pool, its assignments 2 x 2 and signed by the pool's trainer."""
    return coordinator_service(
        tmp_path, domain, trainer=dev_account(OWNER), worker=dev_account(WORKER).address,
        validator=dev_account(VALIDATOR).address, pool_id=pool_id, task_spec_hash=spec_hash(spec),
        config=ApiConfig(prompts_per_task=2, group_size=2),
    )  # fmt: skip


async def honest_work(
    url: str, pool_id: int, domain: SigningDomain, spec: TaskSpec, source: TaskSource, loaded: LoadedModel
) -> tuple[bytes, BatchTree]:
    """What an honest worker does: asks for an assignment, checks it (signature and clock), generates its file and
    uploads it, keeping the receipt, then the leaf list of a batch of that one file. Returns the file and the batch,
    for the caller to submit."""
    async with CoordinatorClient.connect(url, dev_account(WORKER), domain, pool_id=pool_id) as client:
        job = await client.request_task()
        check_assignment(job, spec, dev_account(OWNER).address, domain, TIMING, now=time.time())
        made = await asyncio.to_thread(generate_rollouts, job, spec, source, loaded, TorchBackend.from_loaded(loaded))
        data = encode_rollouts(made.meta, made.rows)
        upload = await client.upload(hashlib.sha256(data).digest(), data)
        assert upload.receipt is not None
        tree = await make_available(client, [data], upload=False)
    return data, tree


async def judged_by_the_daemon(daemon: ValidatorDaemon, work_key: bytes, node: str) -> WorkRow:
    """Runs the validator daemon until it has attested `work_key` and a second more (an invalidation would have
    been sent by then), then stops it; returns its row."""
    running = asyncio.create_task(daemon.run())
    try:
        deadline = time.monotonic() + 60
        while (row := daemon.store.get(work_key, node)) is None or row.stage in (SEEN, VERIFIED):
            assert not running.done(), "the validator daemon stopped"
            assert time.monotonic() < deadline, f"not judged within 60 s: {row}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        row = daemon.store.get(work_key, node)
        assert row is not None
        return row
    finally:
        daemon.stopping.set()
        await running


def validator_daemon(
    ledger_for: Callable[[int], Ledger], pool_id: int, url: str, spec: TaskSpec, state: Path
) -> ValidatorDaemon:
    closed = f"http://127.0.0.1:{free_port()}"  # no checkpoint is needed: both verdicts come before the model check
    setup = PoolSetup(pool_id, dev_account(OWNER).address, url, (closed,), spec, timing=TIMING)
    return ValidatorDaemon(ledger_for(VALIDATOR), setup, ValidatorConfig(poll_seconds=0.05), state)


def chain_now(chain: LocalChain) -> int:
    """Brings the chain's clock to the wall clock (earlier tests' reverts may leave it behind) and returns it."""
    latest = int(chain.w3.eth.get_block("latest")["timestamp"])
    chain.set_next_timestamp(max(latest + 1, int(time.time())))
    chain.mine()
    return int(chain.w3.eth.get_block("latest")["timestamp"])


@pytest.mark.slow
def test_a_coordinator_lying_about_its_steps_gets_an_honest_file_refused_but_never_slashed(
    tmp_path: Path,
    chain: LocalChain,
    ledger_for: Callable[[int], Ledger],
    deployment: Deployment,
    checkpoint: LoadedModel,
    task_spec: TaskSpec,
    task_source: TaskSource,
) -> None:
    """The attack as filed: an honest step-0 file, its assignment signed by the trainer and its upload acknowledged,
    submitted on chain; then the coordinator serves `[step 0 at T - 2 h, step 5 at T - 1 h]`. The real validator
    daemon reads that history and refuses the file as borderline, on chain with refuseLeaf (not paid): its batch never
    invalidated, the node a member, its provider's stake whole."""
    pool_id, node = onboarded_pool(ledger_for)
    domain = SigningDomain(deployment.chain_id, deployment.address("ComputePool"))
    address = dev_account(WORKER).address
    chain_now(chain)
    service = pool_coordinator(tmp_path, pool_id, domain, task_spec)

    async def scenario() -> tuple[WorkRow, BatchTree]:
        async with serving(service) as (_, url):
            data, tree = await honest_work(url, pool_id, domain, task_spec, task_source, checkpoint)
            await asyncio.to_thread(submit, node, pool_id, tree)
            now = time.time()  # the lie: the file's step left the window an hour before it was submitted
            service.state.remember([PublishedStep(0, now - 7200), PublishedStep(5, now - 3600)])
            service.state.step = 5
            async with CoordinatorClient.connect(url, dev_account(VALIDATOR), domain, pool_id=pool_id) as reader:
                assert [entry.step for entry in await reader.steps()] == [0, 5]  # served as the attacker filed it
            daemon = validator_daemon(ledger_for, pool_id, url, task_spec, tmp_path / "validator")
            return await judged_by_the_daemon(daemon, hashlib.sha256(data).digest(), address), tree

    stake_before = node.stake_of(dev_account(PROVIDER).address)
    row, tree = asyncio.run(scenario())
    assert (row.outcome, row.reason, row.check) == (Outcome.BORDERLINE, int(Reason.STALE_STEP), "step"), row
    assert row.tx_hash is not None  # refuseLeaf: the lie can cost the file its reward, never the stake
    assert (row.root, row.leaf_index) == (tree.root, 0)
    assert node.is_leaf_refused(pool_id, address, tree.root, 0)
    assert node.get_batch(pool_id, address, tree.root).status == BatchStatus.PENDING  # not invalidated
    assert node.is_member(pool_id, address) and not node.is_ejected(pool_id, address)
    assert node.stake_of(dev_account(PROVIDER).address) == stake_before


@pytest.mark.slow
def test_a_file_submitted_past_its_signed_deadline_by_chain_time_is_slashed_as_stale(
    tmp_path: Path,
    chain: LocalChain,
    ledger_for: Callable[[int], Ledger],
    deployment: Deployment,
    checkpoint: LoadedModel,
    task_spec: TaskSpec,
    task_source: TaskSource,
) -> None:
    """The same pool with a truthful coordinator: a worker that sits on its assignment and submits one second past
    the signed deadline by the block's time is invalidated for reason 4 by the real daemon, and slashed."""
    pool_id, node = onboarded_pool(ledger_for)
    domain = SigningDomain(deployment.chain_id, deployment.address("ComputePool"))
    address = dev_account(WORKER).address
    chain_now(chain)
    service = pool_coordinator(tmp_path, pool_id, domain, task_spec)
    service.state.remember([PublishedStep(0, time.time() - 10)])  # step 0 is current, and stays so

    async def scenario() -> tuple[WorkRow, BatchTree]:
        async with serving(service) as (_, url):
            data, tree = await honest_work(url, pool_id, domain, task_spec, task_source, checkpoint)
            issued_at = read_issued_at(data)
            chain.set_next_timestamp(TIMING.stale_after(issued_at) + 1)  # the submission's block: one second late
            await asyncio.to_thread(submit, node, pool_id, tree)
            submitted = node.get_batch(pool_id, address, tree.root).submitted_at
            assert submitted == TIMING.stale_after(issued_at) + 1
            daemon = validator_daemon(ledger_for, pool_id, url, task_spec, tmp_path / "validator")
            return await judged_by_the_daemon(daemon, hashlib.sha256(data).digest(), address), tree

    row, tree = asyncio.run(scenario())
    assert (row.outcome, row.reason, row.check) == (Outcome.SLASHABLE, int(Reason.STALE_STEP), "step"), row
    assert "after the trainer signed its assignment" in (row.detail or "")
    assert node.get_batch(pool_id, address, tree.root).status == BatchStatus.INVALIDATED
    assert row.tx_hash is not None and not node.is_member(pool_id, address)


def read_issued_at(data: bytes) -> int:
    from protocol.rollouts import read_rollouts

    issued_at = read_rollouts(data, max_bytes=len(data)).meta.assignment_issued_at
    assert issued_at is not None and abs(issued_at - time.time()) < 60
    return issued_at
