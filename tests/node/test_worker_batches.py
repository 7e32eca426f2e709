"""The worker daemon's batches on anvil, with a real coordinator on loopback: files formed into batches (one Merkle
root each), their leaf lists listed with the coordinator, their roots submitted once each, through a crash at each
step; then claims, refused leaves, an invalidation, a reorganisation and a lost leaf list.

The daemon runs in-process with `max_files = 0` over files written into its journal by hand (well-formed rollout
files of this node, as tests/trainer's): it makes none, and does only what the journal holds (upload, batch, submit,
follow the chain). A crash is an exception injected at one point (after the batch is journaled, after its list is
uploaded, after its transaction is sent); the daemon stops with it as it would with SIGKILL, and a second run over the
same state folder must finish the job without a second root for any file and without submitting a root twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.events import BatchesClaimed, BatchSubmitted, EventFollower
from ledger.merkle import BatchTree, Leaf
from ledger.types import BatchStatus, Reason
from node.config import WorkerSettings
from node.daemon.chain import LedgerWorkChain
from node.daemon.state import REFUSED_DETAIL, BatchEntry, FileRecord, WorkerState
from node.daemon.worker import WorkerDaemon, WorkerError
from protocol.coordinator.client import CoordinatorClient
from protocol.signing import BatchReceipt, SigningDomain, recover
from tests.ledger.helpers import make_pool, onboard
from tests.loopback_coordinator import coordinator_service, serving
from tests.network_trainer import TASK
from tests.trainer.test_api import rollout_bytes
from trainer.coordinator import CoordinatorService

TOKEN = 10**18
TRAINER, PROVIDER, NODE, VALIDATOR = 0, 1, 3, 6
WINDOW = 3600  # make_pool's default challenge window
REWARD_PER_UNIT = 10**15


class SimulatedCrash(Exception):
    """Stands for the process dying at the point it is raised."""


@dataclass
class Setup:
    pool_id: int
    root: Path
    node: LocalAccount
    node_ledger: Ledger
    owner: Ledger
    validator: Ledger
    domain: SigningDomain
    chain: LocalChain

    def coordinator(self) -> CoordinatorService:
        """The pool's coordinator over its folder: a new process of it, as after a restart (what it stored is on
        disk; its quotas and its thread pool are its own)."""
        return coordinator_service(
            self.root / "coordinator", self.domain, trainer=dev_account(TRAINER), worker=self.node.address,
            validator=dev_account(VALIDATOR).address, pool_id=self.pool_id,
        )  # fmt: skip

    @property
    def state_dir(self) -> Path:
        return self.root / "worker"

    def write_files(self, n: int) -> list[bytes]:
        """`n` files of this node in the journal as `written`, oldest first; their work keys."""
        state = WorkerState(self.state_dir, chain_id=self.domain.chain_id, pool_id=self.pool_id, node=self.node.address)
        keys, made = [], len(state.all())
        for i in range(n):
            data = rollout_bytes(node=self.node.address, pool=self.pool_id, proof_bytes=300 + made + i)
            key = hashlib.sha256(data).digest()
            state.path_of(key).write_bytes(data)
            state.add(key, step=0, counter=i, units=100 + i)
            keys.append(key)
        state.close()
        return keys

    def journal(self) -> WorkerState:
        return WorkerState(self.state_dir, chain_id=self.domain.chain_id, pool_id=self.pool_id, node=self.node.address)

    def batch_events(self) -> list[BatchSubmitted]:
        follower = EventFollower(self.owner, pool_id=self.pool_id, events=("BatchSubmitted",))
        return [e for e in follower.poll() if isinstance(e, BatchSubmitted)]


@pytest.fixture
def setup(
    tmp_path: Path, chain: LocalChain, ledger_for: Callable[[int], Ledger], deployment: Deployment
) -> Iterator[Setup]:
    """A pool whose trainer is anvil key 0 (it signs the coordinator's receipts), node 3 a member, validator 6, and
    1000 tokens of rewards in escrow."""
    owner, provider = ledger_for(TRAINER), ledger_for(PROVIDER)
    pool_id = make_pool(owner)
    node = dev_account(NODE)
    node_ledger = onboard(owner, provider, node, pool_id)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    owner.mint(owner.address, 1000 * TOKEN)
    owner.fund_rewards(pool_id, 1000 * TOKEN)
    domain = SigningDomain(deployment.chain_id, deployment.address("ComputePool"))
    yield Setup(pool_id, tmp_path, node, node_ledger, owner, ledger_for(VALIDATOR), domain, chain)


def run_daemon(setup: Setup, chain: LedgerWorkChain | None = None, **settings: object) -> WorkerDaemon:
    """One run of the daemon (a process's life) over the setup's state folder, against the coordinator serving for
    its length; makes no file (`max_files = 0`): it uploads, batches, submits and follows what the journal holds,
    then stops. Raises what the run raises (WorkerError for a node that may not work in the pool)."""
    # a client of its own, as a new process has: a nonce read from the chain, not remembered from before a reorg
    work_chain = chain or LedgerWorkChain(setup.node_ledger.as_account(setup.node))

    async def main() -> WorkerDaemon:
        async with serving(setup.coordinator()) as (_, url):
            config = WorkerSettings(
                state=setup.state_dir, coordinator=url, checkpoints=(url,), task=TASK, backend="torch",
                device="cpu", max_files=0, **settings,  # type: ignore[arg-type]
            )  # fmt: skip
            pool = config.resolve(work_chain.pool(setup.pool_id))
            daemon = WorkerDaemon(config, pool, work_chain, setup.node)
            try:
                assert await daemon.run() == 0
            finally:
                daemon.state.close()
            return daemon

    return asyncio.run(main())


def served_list(setup: Setup, root: bytes) -> tuple[bytes, ...] | None:
    """The work keys of the leaf list the coordinator serves for `root` (None: it has none)."""

    async def main() -> tuple[bytes, ...] | None:
        async with (
            serving(setup.coordinator()) as (_, url),
            CoordinatorClient.connect(url, dev_account(VALIDATOR), setup.domain, pool_id=setup.pool_id) as client,
        ):
            leaves = await client.download_batch(root)
            return None if leaves is None else tuple(leaf.work_key for leaf in leaves)

    return asyncio.run(main())


def file(journal: WorkerState, key: bytes) -> FileRecord:
    found = journal.get(key)
    assert found is not None, f"0x{key.hex()} is not in the journal"
    return found


def entry(journal: WorkerState, root: bytes) -> BatchEntry:
    found = journal.batch(root)
    assert found is not None, f"batch 0x{root.hex()} is not in the journal"
    return found


def batches_of(journal: WorkerState) -> dict[bytes, list[bytes]]:
    """root -> its files' work keys in leaf order, as journaled."""
    return {b.root: [r.work_key for r in journal.members(b.root)] for b in journal.all_batches()}


def test_a_worker_forms_lists_and_submits_its_files_in_batches_of_submit_batch(setup: Setup) -> None:
    keys = setup.write_files(3)
    run_daemon(setup, submit_batch=2)

    journal = setup.journal()
    batches = batches_of(journal)
    assert list(batches.values()) == [keys[:2], keys[2:]]  # oldest first, at most submit_batch files a batch
    assert {b.stage for b in journal.all_batches()} == {"submitted"}
    assert {r.stage for r in journal.all()} == {"submitted"}
    events = setup.batch_events()
    assert [e.root for e in events] == list(batches)  # one transaction per batch, each root once
    assert [e.slot for e in events] == [b.slot for b in journal.all_batches()] == [0, 1]  # each in its own slot
    for root, members in batches.items():
        tree = BatchTree([file(journal, k).leaf for k in members])
        assert tree.root == root  # the journal's root is the tree of its files' (work key, units) in leaf order
        record = setup.owner.get_batch(setup.pool_id, setup.node.address, root, slot=entry(journal, root).slot)
        assert (record.status, record.count, record.total_units) == (BatchStatus.PENDING, tree.count, tree.total_units)
        assert served_list(setup, root) == tuple(members)  # validators can get every leaf
        receipt = bytes.fromhex(journal.batch_receipt_path(root).read_text())
        signed = BatchReceipt(setup.pool_id, root, setup.node.address, len(members))
        assert recover(signed, receipt, setup.domain) == dev_account(TRAINER).address  # the pool's trainer
        tx = entry(journal, root).tx
        assert tx is not None and all(file(journal, k).tx == tx for k in members)
    journal.close()


class CrashingChain(LedgerWorkChain):
    """The pool's contracts, with the process dying around the first `submitBatch`: before it is sent, or after."""

    def __init__(self, ledger: Ledger, *, after_sending: bool) -> None:
        super().__init__(ledger)
        self.after_sending, self.crashed = after_sending, False

    def submit_batch(self, pool_id: int, root: bytes, count: int, total_units: int, *, slot: int) -> str:
        if not self.crashed:
            self.crashed = True
            if self.after_sending:
                super().submit_batch(pool_id, root, count, total_units, slot=slot)
            raise SimulatedCrash(f"died {'after' if self.after_sending else 'before'} sending the transaction")
        return super().submit_batch(pool_id, root, count, total_units, slot=slot)


@pytest.mark.parametrize(
    ("point", "stage_after_crash", "on_chain_after_crash"),
    [("journaled", "formed", False), ("listed", "listed", False), ("sent", "listed", True)],
)
def test_a_crash_at_each_step_of_a_batch_never_submits_a_root_twice_nor_loses_a_file(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, point: str,
    stage_after_crash: str, on_chain_after_crash: bool,
) -> None:  # fmt: skip
    keys = setup.write_files(2)
    chain = CrashingChain(setup.node_ledger.as_account(setup.node), after_sending=point == "sent")
    if point == "journaled":  # the batch is in the journal; nothing about it has left the machine

        async def crash(*_: object) -> None:
            raise SimulatedCrash("died before uploading the leaf list")

        monkeypatch.setattr(WorkerDaemon, "_list", crash)
    run_daemon(setup, chain, submit_batch=2)
    monkeypatch.undo()

    journal = setup.journal()
    [batch] = journal.all_batches()
    assert batch.stage == stage_after_crash and batches_of(journal)[batch.root] == keys
    assert {r.stage for r in journal.all()} == {"uploaded"}
    assert (served_list(setup, batch.root) is not None) == (point != "journaled")
    assert [e.root for e in setup.batch_events()] == ([batch.root] if on_chain_after_crash else [])
    journal.close()

    with caplog.at_level(logging.INFO, logger="node.worker"):
        run_daemon(setup, submit_batch=2)  # a restart: the same files, the same root

    journal = setup.journal()
    assert batches_of(journal) == {batch.root: keys}  # no file in a second batch
    assert {b.stage for b in journal.all_batches()} == {"submitted"}
    assert {r.stage for r in journal.all()} == {"submitted"}
    # submitted once, into the slot journaled with the batch before anything left the machine
    assert [(e.root, e.slot) for e in setup.batch_events()] == [(batch.root, batch.slot)]
    assert entry(journal, batch.root).slot == batch.slot == 0
    assert served_list(setup, batch.root) == tuple(keys)
    found = f"batch 0x{batch.root.hex()[:12]}: found on chain after a restart"
    assert (found in caplog.text) == on_chain_after_crash, caplog.text
    journal.close()


def test_claims_pay_each_batch_less_its_refused_leaf_after_the_window_in_one_transaction(setup: Setup) -> None:
    first, second = setup.write_files(2), setup.write_files(2)
    run_daemon(setup, submit_batch=2)
    journal = setup.journal()
    refused_root, paid_root = (b.root for b in journal.all_batches())
    assert batches_of(journal) == {refused_root: first, paid_root: second}
    tree = BatchTree([file(journal, k).leaf for k in first])
    journal.close()
    setup.validator.refuse_leaf(setup.pool_id, setup.node.address, refused_root, tree.proof(1), Reason.PROOF_INVALID)

    run_daemon(setup, claim=True)  # inside the window: the refusal is journaled, nothing is claimed
    journal = setup.journal()
    assert file(journal, first[1]).stage == "refused"
    assert file(journal, first[1]).detail == REFUSED_DETAIL
    assert {file(journal, k).stage for k in (first[0], *second)} == {"submitted"}
    journal.close()

    setup.chain.increase_time(WINDOW + 1)
    provider = dev_account(PROVIDER).address
    before = setup.owner.balance_of(provider)
    run_daemon(setup, claim=True)

    journal = setup.journal()
    assert {b.stage for b in journal.all_batches()} == {"claimed"}
    stages = {k: file(journal, k).stage for k in first + second}
    assert stages == {first[0]: "claimed", first[1]: "refused", second[0]: "claimed", second[1]: "claimed"}
    tx = entry(journal, paid_root).tx
    assert file(journal, second[0]).detail == f"claimed in {tx}"
    units = sum(file(journal, k).units for k in (first[0], *second))
    assert setup.owner.balance_of(provider) == before + units * REWARD_PER_UNIT  # the refused leaf unpaid
    follower = EventFollower(setup.owner, pool_id=setup.pool_id, events=("BatchesClaimed",))
    claims = [e for e in follower.poll() if isinstance(e, BatchesClaimed)]
    assert [set(c.roots) for c in claims] == [{refused_root, paid_root}]  # both batches in one transaction
    for root in (refused_root, paid_root):
        assert setup.owner.get_batch(setup.pool_id, setup.node.address, root).status == BatchStatus.CLAIMED
    journal.close()


def test_an_invalidated_batch_marks_every_file_and_the_nodes_other_batches_go_void(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    bad, other = setup.write_files(3), setup.write_files(1)
    run_daemon(setup, submit_batch=3)
    journal = setup.journal()
    bad_root, other_root = (b.root for b in journal.all_batches())
    tree = BatchTree([file(journal, k).leaf for k in bad])
    journal.close()
    setup.validator.invalidate_batch(setup.pool_id, setup.node.address, bad_root, tree.proof(1), Reason.PROOF_INVALID)
    setup.chain.increase_time(WINDOW + 1)

    with caplog.at_level(logging.ERROR, logger="node.worker"), pytest.raises(WorkerError, match="was ejected"):
        run_daemon(setup, claim=True)  # it may not work any more, but it journals why first

    journal = setup.journal()
    short = f"0x{bad_root.hex()[:12]}"
    slash = "proof_invalid (7), 50 tokens slashed"
    leaf = f"leaf 1 (0x{bad[1].hex()[:12]})"
    assert entry(journal, bad_root).stage == "invalidated"
    assert entry(journal, bad_root).detail == f"{leaf}: {slash}"
    assert [(file(journal, k).stage, file(journal, k).detail) for k in bad] == [
        ("invalidated", f"its batch {short} was voided by {leaf}: {slash}"),
        ("invalidated", slash),
        ("invalidated", f"its batch {short} was voided by {leaf}: {slash}"),
    ]
    # the invalidation ejected the node: its other batch, past its window, is never paid
    assert entry(journal, other_root).stage == "void"
    assert file(journal, other[0]).stage == "expired"
    assert file(journal, other[0]).detail == f"void: node ejected from pool {setup.pool_id} by an invalidation"
    assert setup.owner.get_batch(setup.pool_id, setup.node.address, other_root).status == BatchStatus.PENDING
    assert f"ejected from pool {setup.pool_id}: batch {short} of 3 files: {leaf}: {slash}" in caplog.text
    journal.close()


def test_a_batch_a_reorganisation_removed_is_submitted_again_with_the_same_root(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    keys = setup.write_files(2)
    run_daemon(setup, submit_batch=2)
    [event] = setup.batch_events()
    w3 = setup.chain.w3
    depth = w3.eth.block_number - event.at.block_number + 1
    assert "error" not in w3.provider.make_request("anvil_reorg", [depth, []])  # type: ignore[arg-type]
    w3.provider.make_request("anvil_dropAllTransactions", [])  # type: ignore[arg-type]
    assert setup.owner.get_batch(setup.pool_id, setup.node.address, event.root).status == BatchStatus.NONE

    with caplog.at_level(logging.WARNING, logger="node.worker"):
        run_daemon(setup)

    assert f"batch 0x{event.root.hex()[:12]}: a reorganisation removed its submission" in caplog.text
    record = setup.owner.get_batch(setup.pool_id, setup.node.address, event.root, slot=event.slot)
    assert record.status == BatchStatus.PENDING
    [again] = setup.batch_events()
    assert (again.root, again.slot) == (event.root, event.slot)  # the same root into the same slot
    journal = setup.journal()
    assert batches_of(journal) == {event.root: keys}  # the same batch, not a new one
    assert {r.stage for r in journal.all()} == {"submitted"} and entry(journal, event.root).stage == "submitted"
    journal.close()


def test_a_leaf_list_the_coordinator_lost_is_listed_again_while_the_window_is_open(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    keys = setup.write_files(2)
    run_daemon(setup, submit_batch=2)
    [event] = setup.batch_events()
    setup.coordinator().batches.path(event.root).unlink()  # acknowledged, then lost (the uploader's record stays)
    with pytest.raises(Exception, match="lost"):
        served_list(setup, event.root)

    with caplog.at_level(logging.WARNING, logger="node.worker"):
        run_daemon(setup)

    assert served_list(setup, event.root) == tuple(keys)
    assert f"batch 0x{event.root.hex()[:12]}: its leaf list was gone from the coordinator; listed it again" in (
        caplog.text
    )
    assert [e.root for e in setup.batch_events()] == [event.root]  # listed again, not submitted again


def submit_gas(setup: Setup, tx: str | None) -> int:
    assert tx is not None
    return int(setup.chain.w3.eth.get_transaction_receipt(tx)["gasUsed"])  # type: ignore[arg-type]


def test_a_worker_writes_its_next_batch_over_a_claimed_one_in_the_same_slot(setup: Setup) -> None:
    first, second = setup.write_files(2), setup.write_files(2)
    run_daemon(setup, submit_batch=2)  # two batches pending: one slot each
    setup.chain.increase_time(WINDOW + 1)
    run_daemon(setup, claim=True)  # both claimed: both slots free
    third = setup.write_files(2)
    run_daemon(setup, submit_batch=2)

    journal = setup.journal()
    claimed_0, claimed_1, reused = journal.all_batches()
    assert batches_of(journal) == {claimed_0.root: first, claimed_1.root: second, reused.root: third}
    assert [(b.stage, b.slot) for b in (claimed_0, claimed_1, reused)] == [
        ("claimed", 0),
        ("claimed", 1),
        ("submitted", 0),  # the lowest free slot: the first claimed batch's
    ]
    events = setup.batch_events()
    assert [(e.root, e.slot) for e in events] == [(claimed_0.root, 0), (claimed_1.root, 1), (reused.root, 0)]
    node, pool = setup.node.address, setup.pool_id
    held = setup.owner.get_slot(pool, node, 0)
    assert (held.root, held.status) == (reused.root, BatchStatus.PENDING)
    assert setup.owner.get_batch(pool, node, claimed_0.root, slot=0).status == BatchStatus.NONE  # written over
    # writing over a settled record costs far less than a fresh one (issue 37): about 17,000 gas less for the root
    assert submit_gas(setup, reused.tx) + 15_000 < submit_gas(setup, claimed_1.tx)
    journal.close()


def foreign_batch(setup: Setup, label: str, slot: int) -> bytes:
    """A pending batch of this node in `slot` the journal does not know (as a journal restored from an older copy
    misses one): its root."""
    tree = BatchTree([Leaf(hashlib.sha256(label.encode()).digest(), 100)])
    setup.node_ledger.submit_batch(setup.pool_id, tree.root, tree.count, tree.total_units, slot=slot)
    return tree.root


def test_a_slot_the_chain_holds_a_batch_the_journal_does_not_know_in_is_left_for_the_next_free_one(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = [foreign_batch(setup, "restored", 0), foreign_batch(setup, "restored too", 1)]
    keys = setup.write_files(2)
    with caplog.at_level(logging.WARNING, logger="node.worker"):
        run_daemon(setup, submit_batch=2)

    journal = setup.journal()
    [batch] = journal.all_batches()
    assert batches_of(journal) == {batch.root: keys}
    assert (batch.stage, batch.slot) == ("submitted", 2)  # refused in 0, then in 1
    events = setup.batch_events()
    assert [(e.root, e.slot) for e in events] == [(unknown[0], 0), (unknown[1], 1), (batch.root, 2)]  # sent once
    for slot, root in enumerate(unknown):  # left as they were
        assert setup.owner.get_slot(setup.pool_id, setup.node.address, slot).root == root
    short = f"batch 0x{batch.root.hex()[:12]}"
    for slot, root in enumerate(unknown):
        assert (
            f"{short}: slot {slot} holds batch 0x{root.hex()[:12]} of this node, pending on chain, which the journal "
            f"does not know (restored from an older copy?); submitting into slot {slot + 1} instead"
        ) in caplog.text
    journal.close()


def test_a_batch_refused_slot_after_slot_waits_for_the_next_run_instead_of_trying_forever(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("node.daemon.worker.SLOT_TRIES", 2)
    for slot in range(3):
        foreign_batch(setup, f"restored {slot}", slot)
    setup.write_files(1)
    with caplog.at_level(logging.WARNING, logger="node.worker"):
        run_daemon(setup, submit_batch=1)  # refused in slots 0 and 1: it stops trying

    journal = setup.journal()
    [batch] = journal.all_batches()
    assert (batch.stage, batch.slot) == ("listed", 2)  # not sent; the next run starts from the slot journaled
    assert f"batch 0x{batch.root.hex()[:12]}: the chain refused it in 2 slots in a row" in caplog.text
    assert len(setup.batch_events()) == 3  # only the unknown ones
    journal.close()
