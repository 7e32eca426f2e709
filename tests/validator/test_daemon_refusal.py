"""The validator daemon's last stage on a real chain: a borderline rejection of a file of a batch goes on chain as
`refuseLeaf` (that leaf never paid, nobody slashed), a clear one as `invalidateBatch` (the batch void, the node slashed
and ejected), also over a refusal made before, and nothing else is ever sent.

The daemon is built for real against anvil, with a closed port for its coordinator; each batch is submitted by a
member node and listed in the daemon's store, each file recorded as attested, the way `_attest` leaves it, and the
stage that acts on chain is run on it (tests/validator/test_batch_daemon.py's helpers).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.types import BatchStatus, Ejection, Reason
from tests.conftest import TOKEN
from tests.validator.test_batch_daemon import act, attested, daemon, listed, submitted
from validator.cli import app
from validator.store import ATTESTED, INVALIDATED, REFUSED
from validator.verdict import Outcome, accept, borderline, reject

OWNER, PROVIDER, NODE, VALIDATOR = 0, 1, 6, 9
LedgerFor = Callable[[int], Ledger]


def test_a_borderline_rejection_is_refused_on_chain_never_invalidated(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "near", "fine")
    files = listed(validator, batch, tree)
    near = attested(validator, files[0], borderline(Reason.PROOF_INVALID, "model", "row 3 at 2.1x"))

    after = act(validator, near)

    assert (after.stage, after.outcome) == (REFUSED, Outcome.BORDERLINE) and after.tx_hash is not None
    assert owner.is_leaf_refused(pool_id, node.address, tree.root, 0)
    record = owner.get_batch(pool_id, node.address, tree.root)
    assert (record.status, record.payable_units) == (BatchStatus.PENDING, 100)  # the other leaf is still paid
    assert owner.burned() == 0 and owner.is_member(pool_id, node.address)
    assert owner.ejection_of(pool_id, node.address) == Ejection.NONE
    assert validator.store.refusals_sent() == 1 and validator.store.invalidations_sent() == 0
    assert "validator_refusals_sent_total 1\n" in validator.metrics.render()
    due = validator.store.due(now=2e9)  # nothing left to do for the refused leaf: only "fine" waits to be judged
    assert due is not None and due.work_key == files[1].work_key

    again = act(validator, near)  # a restart after the transaction, before the store knew: not sent twice
    assert again.stage == REFUSED and validator.store.refusals_sent() == 1
    table = CliRunner().invoke(app, ["rejections", "--state", str(tmp_path / "state")], env={"COLUMNS": "300"})
    assert table.exit_code == 0, table.output
    assert "refused (no slash), tx " + after.tx_hash[:14] in table.output


def test_a_clear_rejection_of_a_refused_leaf_is_still_invalidated(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "clear")
    files = listed(validator, batch, tree)
    clear = attested(validator, files[0], reject(Reason.PROOF_INVALID, "model", "row 3 at 9x"))
    ledger_for(VALIDATOR).refuse_leaf(pool_id, node.address, tree.root, tree.proof(0), Reason.PROOF_INVALID)  # first

    after = act(validator, clear)

    assert after.stage == INVALIDATED and after.tx_hash is not None
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED
    assert owner.burned() == 50 * TOKEN
    assert owner.ejection_of(pool_id, node.address) == Ejection.BY_INVALIDATION


def test_no_outcome_but_a_slashable_one_ever_invalidates_a_batch(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    """Every outcome, each leaf of one batch forced to the stage that acts on chain (an accepted or unjudged row never
    gets there): the daemon's own decision sends invalidateBatch for the slashable leaf alone, and refuseLeaf for the
    borderline one. The slashable one goes last, since its invalidation voids the batch and ejects the node."""
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "fine", "near", "lost", "clear")
    fine, near, lost, clear = listed(validator, batch, tree)
    rows = {
        Outcome.ACCEPTED: attested(validator, fine, accept("every check passed")),
        Outcome.BORDERLINE: attested(validator, near, borderline(Reason.PROOF_INVALID, "model", "2x")),
    }
    validator.store.record_unjudged(lost, "could not judge it in 10 tries, the last one: memory")
    validator.store.move(lost, ATTESTED)  # a state the store never reaches: the decision must hold even so
    rows[Outcome.UNJUDGED] = validator.store.get(lost.work_key, lost.node)  # type: ignore[assignment]
    rows[Outcome.SLASHABLE] = attested(validator, clear, reject(Reason.PROOF_INVALID, "model", "9x"))

    on_chain = {}
    for outcome, row in rows.items():
        assert row.outcome is outcome and row.leaf_index is not None
        act(validator, row)
        status = owner.get_batch(pool_id, node.address, tree.root).status
        on_chain[outcome] = status, owner.is_leaf_refused(pool_id, node.address, tree.root, row.leaf_index)
    assert on_chain == {
        Outcome.ACCEPTED: (BatchStatus.PENDING, False),
        Outcome.BORDERLINE: (BatchStatus.PENDING, True),
        Outcome.UNJUDGED: (BatchStatus.PENDING, False),
        Outcome.SLASHABLE: (BatchStatus.INVALIDATED, False),
    }
    assert validator.store.invalidations_sent() == 1 and validator.store.refusals_sent() == 1
    assert owner.burned() == 50 * TOKEN  # one slash, the slashable file's
