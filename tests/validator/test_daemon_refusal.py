"""The validator daemon's last stage on a real chain: a borderline rejection goes on chain as `refuseWork` (never
paid, never slashed), a clear one as `invalidateWork`, also over a refusal made before, and nothing else is ever sent.

The daemon is built for real against anvil, with a closed port for its coordinator; each row is recorded in its
store as attested, the way `_attest` leaves it, and the stage that acts on chain is run on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger.accounts import dev_account
from ledger.chain import LocalChain, free_port
from ledger.client import Ledger
from ledger.types import Ejection, Reason, WorkStatus
from protocol.tasks.spec import load_task_spec
from tests.conftest import TOKEN
from tests.ledger.helpers import make_pool, onboard, work_key
from tests.network_trainer import TASK
from validator.cli import app
from validator.config import ValidatorConfig
from validator.daemon import PoolSetup, ValidatorDaemon
from validator.store import ATTESTED, INVALIDATED, REFUSED, Submission, WorkRow
from validator.verdict import Outcome, Verdict, accept, borderline, reject

OWNER, PROVIDER, NODE, VALIDATOR = 0, 1, 6, 9
LedgerFor = Callable[[int], Ledger]


@pytest.fixture
def pool(ledger_for: LedgerFor) -> tuple[int, Ledger]:
    """A funded pool with anvil account 9 as its validator and one onboarded node; (pool id, the node's client)."""
    owner = ledger_for(OWNER)
    pool_id = make_pool(owner)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    owner.mint(owner.address, 100 * TOKEN)
    owner.fund_rewards(pool_id, 100 * TOKEN)
    node = onboard(owner, ledger_for(PROVIDER), dev_account(NODE), pool_id)
    return pool_id, node


def daemon(ledger_for: LedgerFor, pool_id: int, state: Path) -> ValidatorDaemon:
    closed = f"http://127.0.0.1:{free_port()}"
    setup = PoolSetup(pool_id, dev_account(OWNER).address, closed, (closed,), load_task_spec(TASK))
    return ValidatorDaemon(ledger_for(VALIDATOR), setup, ValidatorConfig(poll_seconds=0.05), state)  # type: ignore[arg-type]


def attested(validator: ValidatorDaemon, node: Ledger, pool_id: int, label: str, verdict: Verdict) -> WorkRow:
    """Submits `label` from `node`, records it in the daemon's store with `verdict`, attested; returns the row."""
    key = work_key(label)
    receipt = node.submit_work(pool_id, key, 1000)
    work = node.get_work(pool_id, node.address, key)
    submission = Submission(pool_id, key, node.address, 1000, receipt["blockNumber"], 0, work.submitted_at)
    validator.store.record([submission], next_block=receipt["blockNumber"] + 1)
    validator.store.record_verdict(submission, verdict)
    validator.store.move(submission, ATTESTED)  # what `_attest` does once the coordinator took the attestation
    row = validator.store.get(key, node.address)
    assert row is not None and row.stage == ATTESTED
    return row


def act(validator: ValidatorDaemon, row: WorkRow) -> WorkRow:
    """Runs the daemon's chain stage on `row` (with the chain's validator set read, as `run` does first)."""

    async def scenario() -> None:
        await validator._read_validator_set()
        await validator._invalidate(row)

    asyncio.run(scenario())
    after = validator.store.get(row.work_key, row.node)
    assert after is not None
    return after


def test_a_borderline_rejection_is_refused_on_chain_never_invalidated(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    near = attested(validator, node, pool_id, "near", borderline(Reason.PROOF_INVALID, "model", "row 3 at 2.1x"))

    after = act(validator, near)

    assert (after.stage, after.outcome) == (REFUSED, Outcome.BORDERLINE) and after.tx_hash is not None
    assert owner.get_work(pool_id, node.address, near.work_key).status == WorkStatus.REFUSED
    assert owner.burned() == 0 and owner.is_member(pool_id, node.address)
    assert owner.ejection_of(pool_id, node.address) == Ejection.NONE
    assert validator.store.refusals_sent() == 1 and validator.store.invalidations_sent() == 0
    assert "validator_refusals_sent_total 1\n" in validator.metrics.render()
    assert validator.store.due(now=2e9) is None  # nothing left to do for it

    again = act(validator, near)  # a restart after the transaction, before the store knew: not sent twice
    assert again.stage == REFUSED and validator.store.refusals_sent() == 1
    table = CliRunner().invoke(app, ["rejections", "--state", str(tmp_path / "state")], env={"COLUMNS": "300"})
    assert table.exit_code == 0, table.output
    assert "refused (no slash), tx " + after.tx_hash[:14] in table.output


def test_a_clear_rejection_of_refused_work_is_still_invalidated(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    clear = attested(validator, node, pool_id, "clear", reject(Reason.PROOF_INVALID, "model", "row 3 at 9x"))
    ledger_for(VALIDATOR).refuse_work(pool_id, node.address, clear.work_key, Reason.PROOF_INVALID)  # refused first

    after = act(validator, clear)

    assert after.stage == INVALIDATED and after.tx_hash is not None
    assert owner.get_work(pool_id, node.address, clear.work_key).status == WorkStatus.INVALIDATED
    assert owner.burned() == 50 * TOKEN
    assert owner.ejection_of(pool_id, node.address) == Ejection.BY_INVALIDATION


def test_no_outcome_but_a_slashable_one_is_ever_sent_as_invalidate_work(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    """Every outcome, each row forced to the stage that acts on chain (an accepted or unjudged row never gets there):
    the daemon's own decision sends invalidateWork for the slashable row alone. The slashable one goes last, since
    its invalidation ejects the node."""
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    rows = {
        Outcome.ACCEPTED: attested(validator, node, pool_id, "fine", accept("every check passed")),
        Outcome.BORDERLINE: attested(validator, node, pool_id, "near", borderline(Reason.PROOF_INVALID, "model", "2x")),
    }
    lost = attested(validator, node, pool_id, "lost", accept("about to be overwritten"))
    validator.store.record_unjudged(lost, "could not judge it in 10 tries, the last one: memory")
    validator.store.move(lost, ATTESTED)  # a state the store never reaches: the decision must hold even so
    rows[Outcome.UNJUDGED] = validator.store.get(lost.work_key, lost.node)  # type: ignore[assignment]
    rows[Outcome.SLASHABLE] = attested(validator, node, pool_id, "clear", reject(Reason.PROOF_INVALID, "model", "9x"))

    on_chain = {}
    for outcome, row in rows.items():
        assert row.outcome is outcome
        act(validator, row)
        on_chain[outcome] = owner.get_work(pool_id, node.address, row.work_key).status
    assert on_chain == {
        Outcome.ACCEPTED: WorkStatus.PENDING,
        Outcome.BORDERLINE: WorkStatus.REFUSED,
        Outcome.UNJUDGED: WorkStatus.PENDING,
        Outcome.SLASHABLE: WorkStatus.INVALIDATED,
    }
    assert validator.store.invalidations_sent() == 1 and validator.store.refusals_sent() == 1
    assert owner.burned() == 50 * TOKEN  # one slash, the slashable file's
