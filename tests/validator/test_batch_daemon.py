"""The validator daemon on batches, against anvil: a rejected file of a batch goes on chain with its Merkle proof
(`invalidateBatch`, the whole batch void; `refuseLeaf` when borderline), a batch its leaf list condemned is invalidated
with the proof of the faulty leaf, or without one when no list was ever made available, and nothing is sent twice
or after the window.

The daemon is built for real, with a closed port for its coordinator; batches are submitted by a member node and
recorded in the daemon's store as its listing stage would leave them, and the stage that acts on chain is run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from typer.testing import CliRunner

from ledger.accounts import dev_account
from ledger.chain import LocalChain, free_port
from ledger.client import Ledger
from ledger.merkle import BatchTree, Leaf
from ledger.types import BatchStatus, Ejection, Reason
from protocol.batches import encode_leaves
from protocol.coordinator.client import CoordinatorClient
from protocol.tasks.spec import load_task_spec
from shardcast.client import new_session
from tests.conftest import TOKEN
from tests.ledger.helpers import work_key
from tests.loopback_coordinator import coordinator_service, serving
from tests.network_trainer import TASK
from trainer.api import CoordinatorApi
from validator.cli import app
from validator.config import ValidatorConfig
from validator.daemon import PoolSetup, ValidatorDaemon
from validator.store import (
    ATTESTED,
    GONE,
    INVALIDATED,
    LISTED,
    REFUSED,
    REJECTED,
    SEEN,
    UNVERIFIABLE,
    BatchRow,
    BatchSubmission,
    Submission,
    WorkRow,
)
from validator.verdict import Verdict, borderline, reject

OWNER, PROVIDER, NODE, VALIDATOR = 0, 1, 6, 9
WINDOW = 3600  # the pool's challenge window (make_pool's)
LedgerFor = Callable[[int], Ledger]


def daemon(ledger_for: LedgerFor, pool_id: int, state: Path, *, grace: float = 60.0) -> ValidatorDaemon:
    closed = f"http://127.0.0.1:{free_port()}"
    setup = PoolSetup(pool_id, dev_account(OWNER).address, closed, (closed,), load_task_spec(TASK))
    config = ValidatorConfig(poll_seconds=0.05, grace_seconds=grace)  # type: ignore[arg-type]
    return ValidatorDaemon(ledger_for(VALIDATOR), setup, config, state)


def submitted(
    validator: ValidatorDaemon, node: Ledger, pool_id: int, *labels: str
) -> tuple[BatchSubmission, BatchTree]:
    """Submits a batch of `labels` (100 units each) from `node` and records it in the daemon's store."""
    tree = BatchTree([Leaf(work_key(label), 100) for label in labels])
    receipt = node.submit_batch(pool_id, tree.root, tree.count, tree.total_units)
    record = node.get_batch(pool_id, node.address, tree.root)
    batch = BatchSubmission(
        pool_id, tree.root, node.address, tree.count, tree.total_units, receipt["blockNumber"], 0, record.submitted_at,
        slot=record.slot,
    )  # fmt: skip
    validator.store.record([], next_block=receipt["blockNumber"] + 1, batches=[batch], window=WINDOW)
    return batch, tree


def listed(validator: ValidatorDaemon, batch: BatchSubmission, tree: BatchTree) -> list[Submission]:
    """The batch listed, as `_list` leaves a sound one: its leaves are file rows."""
    files = [
        Submission(
            batch.pool_id, leaf.work_key, batch.node, leaf.units, batch.block, 0, batch.submitted_at,
            root=batch.root, leaf_index=index, slot=batch.slot,
        )
        for index, leaf in enumerate(tree.leaves)
    ]  # fmt: skip
    validator.store.list_batch(batch, encode_leaves(tree.leaves), files, mine=lambda key: True)
    return files


def attested(validator: ValidatorDaemon, file: Submission, verdict: Verdict) -> WorkRow:
    validator.store.record_verdict(file, verdict)
    validator.store.move(file, ATTESTED)  # what `_attest` does once the coordinator took the attestation
    row = validator.store.get(file.work_key, file.node)
    assert row is not None
    return row


def act(validator: ValidatorDaemon, row: WorkRow) -> WorkRow:
    async def scenario() -> None:
        await validator._read_validator_set()
        await validator._invalidate(row)

    asyncio.run(scenario())
    after = validator.store.get(row.work_key, row.node)
    assert after is not None
    return after


def act_on_batch(validator: ValidatorDaemon, batch: BatchSubmission) -> BatchRow:
    row = validator.store.get_batch(batch.root, batch.node, batch.slot)
    assert row is not None

    async def scenario() -> None:
        await validator._read_validator_set()
        await validator._advance_batch(row)

    asyncio.run(scenario())
    after = validator.store.get_batch(batch.root, batch.node, batch.slot)
    assert after is not None
    return after


def test_a_rejected_file_of_a_batch_is_invalidated_with_its_proof_and_the_whole_batch_is_void(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "a", "b", "c")
    files = listed(validator, batch, tree)
    bad = attested(validator, files[2], reject(Reason.PROOF_INVALID, "model", "row 3 at 9x"))

    after = act(validator, bad)

    assert after.stage == INVALIDATED and after.tx_hash is not None
    record = owner.get_batch(pool_id, node.address, tree.root)
    assert record.status == BatchStatus.INVALIDATED  # leaves a and b, never judged bad, are not paid either
    assert owner.burned() == 50 * TOKEN and owner.ejection_of(pool_id, node.address) == Ejection.BY_INVALIDATION
    assert "validator_invalidations_sent_total 1\n" in validator.metrics.render()

    again = act(validator, bad)  # a restart after the transaction, before the store knew: not sent twice
    assert again.stage == INVALIDATED and again.note == "its batch is already invalidated on chain"
    assert owner.burned() == 50 * TOKEN


def test_a_borderline_file_of_a_batch_is_refused_with_its_proof_and_the_rest_is_still_paid(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "a", "b", "c", "d", "e")
    files = listed(validator, batch, tree)
    near = attested(validator, files[3], borderline(Reason.PROOF_INVALID, "model", "row 3 at 2.1x"))

    after = act(validator, near)

    assert after.stage == REFUSED and after.tx_hash is not None
    assert owner.is_leaf_refused(pool_id, node.address, tree.root, 3)
    assert not owner.is_leaf_refused(pool_id, node.address, tree.root, 2)
    record = owner.get_batch(pool_id, node.address, tree.root)
    assert (record.status, record.payable_units) == (BatchStatus.PENDING, 400)
    assert owner.burned() == 0 and owner.ejection_of(pool_id, node.address) == Ejection.NONE
    again = act(validator, near)
    assert again.stage == REFUSED and again.note == "already refused on chain"
    assert validator.store.refusals_sent() == 1

    # a clear rejection of the refused file is still sent: a refusal is never a shield against a slash
    clear = attested(validator, files[3], reject(Reason.PROOF_INVALID, "model", "row 3 at 9x"))
    assert act(validator, clear).stage == INVALIDATED
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED


def test_a_batch_naming_a_file_twice_is_invalidated_with_the_proof_of_the_second_leaf_and_its_evidence_kept(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "a", "b", "a")
    detail = "leaf 2 names file 0x... a second time in the batch: a file is paid once"
    validator.store.reject_batch(
        batch, int(Reason.WRONG_ASSIGNMENT), detail, leaf_index=2, leaves=encode_leaves(tree.leaves)
    )

    after = act_on_batch(validator, batch)

    assert after.stage == INVALIDATED and after.tx_hash is not None
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED
    assert owner.burned() == 50 * TOKEN
    assert "validator_batch_invalidations_sent_total 1\n" in validator.metrics.render()
    kept = json.loads((tmp_path / "state" / "evidence" / "batches" / tree.root.hex() / "record.json").read_text())
    assert (kept["reason"], kept["detail"], kept["proof"]["index"]) == (3, detail, 2)
    assert kept["slot"] == kept["proof"]["slot"] == batch.slot  # what invalidateBatch names the batch by
    assert kept["proof"]["siblings"] == ["0x" + s.hex() for s in tree.proof(2).siblings]
    assert (tmp_path / "state" / "evidence" / "batches" / tree.root.hex() / "leaves.bin").read_bytes() == (
        encode_leaves(tree.leaves)
    )
    validator.store.move_batch(batch, REJECTED)  # as if the store had not recorded the transaction
    assert act_on_batch(validator, batch).note == "already invalidated on chain"
    assert owner.burned() == 50 * TOKEN

    state = ["--state", str(tmp_path / "state")]
    listed = CliRunner().invoke(app, ["rejections", "--json", *state])
    assert listed.exit_code == 0, listed.output
    (entry,) = json.loads(listed.stdout)
    assert (entry["work_key"], entry["batch"], entry["slot"], entry["leaf_index"]) == (
        None, "0x" + tree.root.hex(), batch.slot, 2
    )  # fmt: skip
    assert (entry["reason"], entry["reason_name"], entry["detail"]) == (3, "wrong_assignment", detail)
    table = CliRunner().invoke(app, ["rejections", *state], env={"COLUMNS": "300"})
    assert table.exit_code == 0 and "1 batches rejected for their leaf list" in table.output
    assert f"(slot {batch.slot})" in table.output


def test_a_batch_whose_leaf_list_was_never_available_is_invalidated_without_a_proof(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "a", "b")
    validator.store.reject_batch(
        batch, int(Reason.FILE_UNAVAILABLE), "never made available", leaf_index=None, leaves=None
    )

    after = act_on_batch(validator, batch)

    assert after.stage == INVALIDATED and after.tx_hash is not None
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED
    assert owner.ejection_of(pool_id, node.address) == Ejection.BY_INVALIDATION
    kept = json.loads((tmp_path / "state" / "evidence" / "batches" / tree.root.hex() / "record.json").read_text())
    assert kept["proof"] is None and kept["reason"] == 8


def test_nothing_is_sent_for_a_batch_whose_window_closed(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "a", "b")
    files = listed(validator, batch, tree)
    late_file = attested(validator, files[0], reject(Reason.PROOF_INVALID, "model", "row 3 at 9x"))
    other, other_tree = submitted(validator, node, pool_id, "c", "a")
    validator.store.reject_batch(
        other, int(Reason.WRONG_ASSIGNMENT), "a file paid once", leaf_index=1, leaves=encode_leaves(other_tree.leaves)
    )
    chain.increase_time(3601)

    after_file, after_batch = act(validator, late_file), act_on_batch(validator, other)

    assert after_file.stage == ATTESTED and after_file.note is not None and "window closed" in after_file.note
    assert after_batch.stage == REJECTED and after_batch.note is not None and "window closed" in after_batch.note
    assert after_file.tx_hash is None and after_batch.tx_hash is None
    assert owner.burned() == 0 and validator.store.due_batch(2e9) is None  # leaf b is still judged, late


def test_nothing_is_sent_for_a_batch_claimed_and_written_over_but_its_files_are_still_judged(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    """A validator that fell behind rejects a file, and a batch's list, after their batches were claimed and their
    slots took later batches: the window closed, so nothing is sent, but each was a real submission, and the other
    file of the batch is still judged (and attested, for training)."""
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "a", "b")
    files = listed(validator, batch, tree)
    late_file = attested(validator, files[0], reject(Reason.PROOF_INVALID, "model", "row 3 at 9x"))
    other, other_tree = submitted(validator, node, pool_id, "c", "d")
    validator.store.reject_batch(
        other, int(Reason.BAD_FORMAT), "units", leaf_index=0, leaves=encode_leaves(other_tree.leaves)
    )
    chain.increase_time(WINDOW + 1)
    node.claim_batches(pool_id, node.address, [batch.root, other.root], slots=[batch.slot, other.slot])
    later = [submitted(validator, node, pool_id, label)[0] for label in ("e", "f")]
    assert [b.slot for b in later] == [batch.slot, other.slot]  # both slots written over

    after_file, after_batch = act(validator, late_file), act_on_batch(validator, other)

    assert after_file.stage == ATTESTED and after_file.tx_hash is None
    assert after_file.note is not None and "written over" in after_file.note
    assert after_batch.stage == REJECTED and after_batch.tx_hash is None
    assert after_batch.note is not None and "written over" in after_batch.note
    assert owner.burned() == 0
    waiting = validator.store.get(files[1].work_key, node.address)
    assert waiting is not None and waiting.stage == SEEN
    assert asyncio.run(validator._still_submitted(waiting))  # submitted: judged, however late
    assert validator.store.get(files[1].work_key, node.address) == waiting  # not parked as gone


def test_nothing_is_sent_for_a_batch_a_reorganisation_took_out(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    """Batches recorded here that the chain never held (a reorganisation took them out; slot 3 is empty, slot 0 holds
    a later batch submitted within their window): a rejected file of one and a rejected list of the other are parked
    as gone, nothing sent; a file of theirs is not judged."""
    pool_id, node = pool
    owner = ledger_for(OWNER)
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    now = node.timestamp()
    taken = []
    for slot, labels in ((3, ("a", "b")), (0, ("c",))):
        tree = BatchTree([Leaf(work_key(label), 100) for label in labels])
        batch = BatchSubmission(pool_id, tree.root, node.address, tree.count, tree.total_units, 1, slot, now, slot=slot)
        validator.store.record([], next_block=1, batches=[batch], window=WINDOW)
        taken.append((batch, tree))
    (gone, gone_tree), (gone_list, gone_list_tree) = taken
    files = listed(validator, gone, gone_tree)
    bad = attested(validator, files[0], reject(Reason.PROOF_INVALID, "model", "row 3 at 9x"))
    validator.store.reject_batch(
        gone_list, int(Reason.BAD_FORMAT), "units", leaf_index=0, leaves=encode_leaves(gone_list_tree.leaves)
    )
    submitted(validator, node, pool_id, "d")  # into slot 0, the lowest free one

    after_file, after_batch = act(validator, bad), act_on_batch(validator, gone_list)

    assert (after_file.stage, after_file.note, after_file.tx_hash) == (ATTESTED, GONE, None)
    assert (after_batch.stage, after_batch.note, after_batch.tx_hash) == (UNVERIFIABLE, GONE, None)
    assert owner.burned() == 0
    waiting = validator.store.get(files[1].work_key, node.address)
    assert waiting is not None
    assert not asyncio.run(validator._still_submitted(waiting))
    parked = validator.store.get(files[1].work_key, node.address)
    assert parked is not None and (parked.stage, parked.note) == (UNVERIFIABLE, GONE)


# --- the listing stage, with the real coordinator on loopback ------------------------------------------------


def held(label: str) -> tuple[bytes, bytes]:
    """A file's bytes and its work key, for the coordinator's inbox (its contents are judged elsewhere)."""
    data = f"rollout file {label}".encode()
    return hashlib.sha256(data).digest(), data


def listing(
    ledger_for: LedgerFor,
    pool_id: int,
    tmp_path: Path,
    scenario: Callable[[ValidatorDaemon, CoordinatorApi, CoordinatorClient], Awaitable[None]],
    *,
    grace: float = 60.0,
) -> ValidatorDaemon:
    """Runs `scenario` with a daemon whose coordinator is a real one on loopback (the pool's trainer signs its
    receipts, the node is a member) and a client that uploads as the node."""
    node_account = dev_account(NODE)
    box: list[ValidatorDaemon] = []

    async def main() -> None:
        validator = daemon(ledger_for, pool_id, tmp_path / "state", grace=grace)
        box.append(validator)
        service = coordinator_service(
            tmp_path / "coordinator", validator.domain, trainer=dev_account(OWNER), worker=node_account.address,
            validator=dev_account(VALIDATOR).address, pool_id=pool_id,
        )  # fmt: skip
        async with serving(service) as (api, url), new_session() as session:
            validator.client = CoordinatorClient(session, url, validator.account, validator.domain)
            await validator._read_validator_set()
            validator._max_units = ledger_for(OWNER).pool(pool_id).config.max_units_per_key
            await scenario(validator, api, CoordinatorClient(session, url, node_account, validator.domain))

    asyncio.run(main())
    return box[0]


async def list_once(validator: ValidatorDaemon, batch: BatchSubmission) -> BatchRow:
    row = validator.store.get_batch(batch.root, batch.node, batch.slot)
    assert row is not None
    await validator._advance_batch(row)
    after = validator.store.get_batch(batch.root, batch.node, batch.slot)
    assert after is not None
    return after


def on_chain(
    validator: ValidatorDaemon, node: Ledger, pool_id: int, leaves: list[Leaf], **totals: int
) -> BatchSubmission:
    """Submits a batch of `leaves` from `node` (its total units overridden by `total_units`) and records it."""
    tree = BatchTree(leaves)
    total = totals.get("total_units", tree.total_units)
    receipt = node.submit_batch(pool_id, tree.root, tree.count, total)
    record = node.get_batch(pool_id, node.address, tree.root)
    batch = BatchSubmission(
        pool_id, tree.root, node.address, tree.count, total, receipt["blockNumber"], 0, record.submitted_at,
        slot=record.slot,
    )  # fmt: skip
    validator.store.record([], next_block=receipt["blockNumber"] + 1, batches=[batch], window=WINDOW)
    return batch


def test_a_sound_leaf_list_from_the_coordinator_makes_one_file_row_per_leaf(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    files = [held(label) for label in ("a", "b", "c")]
    leaves = [Leaf(key, 40 + i) for i, (key, _) in enumerate(files)]

    async def scenario(validator: ValidatorDaemon, api: CoordinatorApi, worker: CoordinatorClient) -> None:
        for key, data in files:
            api.service.inbox.put(key, data, node.address)
        await worker.upload_batch(leaves)
        batch = on_chain(validator, node, pool_id, leaves)
        after = await list_once(validator, batch)
        assert after.stage == LISTED and after.leaves == encode_leaves(leaves)
        for index, leaf in enumerate(leaves):
            row = validator.store.get(leaf.work_key, node.address)
            assert row is not None
            assert (row.stage, row.units, row.root, row.leaf_index) == (SEEN, leaf.units, batch.root, index)
            assert row.submitted_at == batch.submitted_at  # judged by the batch's block time

    validator = listing(ledger_for, pool_id, tmp_path, scenario)
    assert "validator_batches_seen_total" in validator.metrics.render()


def test_a_leaf_list_never_uploaded_waits_its_grace_then_condemns_the_batch_as_unavailable(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    leaves = [Leaf(held("a")[0], 10)]

    async def scenario(validator: ValidatorDaemon, api: CoordinatorApi, worker: CoordinatorClient) -> None:
        batch = on_chain(validator, node, pool_id, leaves)
        waiting = await list_once(validator, batch)
        assert waiting.stage == SEEN and waiting.last_error == "the coordinator does not have the leaf list yet"
        validator.config = dataclasses.replace(validator.config, grace_seconds=0.001)
        after = await list_once(validator, batch)
        assert (after.stage, after.reason, after.leaf_index) == (REJECTED, 8, None)

    listing(ledger_for, pool_id, tmp_path, scenario)


def test_a_list_whose_units_are_not_the_records_is_bad_format_and_a_file_listed_twice_is_a_wrong_assignment(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    files = [held(label) for label in ("a", "b", "c")]
    first = [Leaf(files[0][0], 10), Leaf(files[1][0], 10)]
    again = [Leaf(files[2][0], 10), Leaf(files[0][0], 10)]  # file a, in a second batch
    overclaimed = [Leaf(files[2][0], 11)]

    async def scenario(validator: ValidatorDaemon, api: CoordinatorApi, worker: CoordinatorClient) -> None:
        for key, data in files:
            api.service.inbox.put(key, data, node.address)
        for leaves in (first, again, overclaimed):
            await worker.upload_batch(leaves)
        sound = on_chain(validator, node, pool_id, first)
        assert (await list_once(validator, sound)).stage == LISTED
        twice = on_chain(validator, node, pool_id, again)
        rejected = await list_once(validator, twice)
        assert (rejected.stage, rejected.reason, rejected.leaf_index) == (REJECTED, 3, 1)
        assert rejected.detail is not None and sound.root.hex() in rejected.detail
        assert validator.store.get(files[2][0], node.address) is None  # a condemned list makes no file rows
        more = on_chain(validator, node, pool_id, overclaimed, total_units=12)  # the chain pays 12 for 11
        wrong = await list_once(validator, more)
        assert (wrong.stage, wrong.reason, wrong.leaf_index) == (REJECTED, 2, 0)
        assert wrong.detail == "the leaves' units add up to 11; the chain records 12 for the batch"

    listing(ledger_for, pool_id, tmp_path, scenario)


def test_a_leaf_list_the_coordinator_receipted_and_lost_is_never_the_workers_fault(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    key, data = held("a")
    leaves = [Leaf(key, 10)]

    async def scenario(validator: ValidatorDaemon, api: CoordinatorApi, worker: CoordinatorClient) -> None:
        api.service.inbox.put(key, data, node.address)
        await worker.upload_batch(leaves)
        api.service.batches.path(BatchTree(leaves).root).unlink()  # the coordinator's disk loses it
        batch = on_chain(validator, node, pool_id, leaves)
        after = await list_once(validator, batch)
        assert after.stage == UNVERIFIABLE and after.note is not None and "lost" in after.note.lower()
        assert after.reason is None and validator.store.due_batch(2e9) is None  # nothing will ever be sent

    listing(ledger_for, pool_id, tmp_path, scenario)


def test_the_evidence_of_a_rejected_leaf_keeps_its_batch_and_proof(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    """`_record` on a file of a batch: its evidence, written in a worker thread, names the batch and holds the proof
    its invalidation sends (read from the store on the loop's thread: SQLite's connection is bound to it)."""
    pool_id, node = pool
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    batch, tree = submitted(validator, node, pool_id, "a", "b", "c")
    files = listed(validator, batch, tree)
    row = validator.store.get(files[1].work_key, node.address)
    assert row is not None
    verdict = reject(Reason.BAD_FORMAT, "format", "not a Parquet file")

    asyncio.run(validator._record(row, verdict, 0.1, b"not a parquet file", validator._expected(row, [])))

    recorded = validator.store.get(row.work_key, node.address)
    assert recorded is not None and recorded.reason == 2 and recorded.last_error is None
    kept = json.loads((tmp_path / "state" / "evidence" / row.work_key.hex() / "record.json").read_text())
    assert kept["batch"]["root"] == "0x" + tree.root.hex() and kept["batch"]["index"] == 1
    assert kept["batch"]["slot"] == batch.slot
    assert kept["batch"]["siblings"] == ["0x" + s.hex() for s in tree.proof(1).siblings]


def test_a_file_of_a_batch_a_reorganisation_took_out_may_come_back_in_another_batch(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    """The validator listed batches A (slot 0) and A' (slot 7), then a reorganisation took both out, and the worker
    committed their files in batch B, which went into slot 0 within A's window: B is no second submission of the
    files (neither A, whose slot holds B, nor A', whose slot is empty, is on chain), so B is listed and its leaves
    judged under B."""
    pool_id, node = pool
    (key, data), (other, other_data) = held("a"), held("c")
    again = [Leaf(key, 10), Leaf(other, 10)]

    async def scenario(validator: ValidatorDaemon, api: CoordinatorApi, worker: CoordinatorClient) -> None:
        api.service.inbox.put(key, data, node.address)
        api.service.inbox.put(other, other_data, node.address)
        await worker.upload_batch(again)
        now = node.timestamp()
        for slot, leaves in ((0, [Leaf(key, 10), Leaf(held("b")[0], 10)]), (7, [Leaf(other, 10)])):
            gone = BatchTree(leaves)  # recorded and listed here, never on this chain: as if a reorganisation took it
            taken = BatchSubmission(
                pool_id, gone.root, node.address, gone.count, gone.total_units, 1, slot, now - 60, slot=slot
            )
            validator.store.record([], next_block=1, batches=[taken], window=WINDOW)
            listed(validator, taken, gone)
        batch = on_chain(validator, node, pool_id, again)
        assert batch.slot == 0 and batch.submitted_at < now - 60 + WINDOW  # A's slot, within A's window
        after = await list_once(validator, batch)
        assert after.stage == LISTED, after.detail
        for index, file in enumerate((key, other)):
            row = validator.store.get(file, node.address)
            assert row is not None and (row.root, row.slot, row.leaf_index, row.stage) == (batch.root, 0, index, SEEN)
            assert row.submitted_at == batch.submitted_at

    listing(ledger_for, pool_id, tmp_path, scenario)


def test_a_node_that_claims_a_batch_and_names_one_of_its_files_again_in_the_reused_slot_is_condemned(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    """The node's first batch is claimed (paid); its next batch goes into the same slot, written over, and names a
    file of the first again: a file paid once, reason 3, whose invalidation names the new batch by its slot."""
    pool_id, node = pool
    owner = ledger_for(OWNER)
    files = [held(label) for label in ("a", "b", "c")]
    first = [Leaf(files[0][0], 10), Leaf(files[1][0], 10)]
    again = [Leaf(files[2][0], 10), Leaf(files[1][0], 10)]  # file b, paid with the first batch

    async def scenario(validator: ValidatorDaemon, api: CoordinatorApi, worker: CoordinatorClient) -> None:
        for key, data in files:
            api.service.inbox.put(key, data, node.address)
        for leaves in (first, again):
            await worker.upload_batch(leaves)
        paid = on_chain(validator, node, pool_id, first)
        assert (await list_once(validator, paid)).stage == LISTED
        chain.increase_time(WINDOW + 1)
        node.claim_batches(pool_id, node.address, [paid.root], slots=[paid.slot])
        reused = on_chain(validator, node, pool_id, again)
        assert reused.slot == paid.slot  # the claimed batch's slot, written over
        rejected = await list_once(validator, reused)
        assert (rejected.stage, rejected.reason, rejected.leaf_index) == (REJECTED, 3, 1)
        assert rejected.detail is not None and f"0x{paid.root.hex()} (slot {paid.slot})" in rejected.detail
        sent = await list_once(validator, reused)  # the invalidation, with leaf 1's proof
        assert sent.stage == INVALIDATED and sent.tx_hash is not None

    listing(ledger_for, pool_id, tmp_path, scenario)
    record = owner.get_slot(pool_id, node.address, 0)
    assert (record.root, record.status) == (BatchTree(again).root, BatchStatus.INVALIDATED)
    assert owner.burned() == 50 * TOKEN


def test_a_root_claimed_and_submitted_again_into_its_slot_is_condemned_as_a_second_payment_of_its_files(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    """The same root, claimed, then submitted again into its slot (its leaf list still at the coordinator): a new
    batch, not the first read again, and every file of it was paid before."""
    pool_id, node = pool
    files = [held(label) for label in ("a", "b")]
    leaves = [Leaf(key, 10) for key, _ in files]

    async def scenario(validator: ValidatorDaemon, api: CoordinatorApi, worker: CoordinatorClient) -> None:
        for key, data in files:
            api.service.inbox.put(key, data, node.address)
        await worker.upload_batch(leaves)
        paid = on_chain(validator, node, pool_id, leaves)
        assert (await list_once(validator, paid)).stage == LISTED
        chain.increase_time(WINDOW + 1)
        node.claim_batches(pool_id, node.address, [paid.root], slots=[paid.slot])
        again = on_chain(validator, node, pool_id, leaves)
        assert (again.slot, again.root) == (paid.slot, paid.root) and again.submitted_at > paid.submitted_at
        rejected = await list_once(validator, again)
        assert (rejected.stage, rejected.reason, rejected.leaf_index) == (REJECTED, 3, 0)
        assert rejected.submitted_at == again.submitted_at
        row = validator.store.get(files[0][0], node.address)
        assert row is not None and row.submitted_at == paid.submitted_at  # still the first batch's file

    listing(ledger_for, pool_id, tmp_path, scenario)
