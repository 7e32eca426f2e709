"""The worker's web dashboard: each file's challenge-window state (the chain's word first; an ejected node's pending
work void), stake and the node's lock in the pool, earned and at-risk tokens, in `/api/state` and in the page as
headless Chromium renders it; `prime-node start --dashboard` serves it.

The journal and the chain are real: files recorded with `WorkerState`, formed into batches, submitted, claimed and
invalidated on anvil.
Screenshots land in each test's tmp path; their paths are printed and recorded as the test's `screenshot` property.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.events import BatchInvalidated, EventPosition, LeafRefused
from ledger.merkle import BatchTree
from ledger.types import BatchRecord, BatchStatus, PoolConfig, Reason, StakeInfo, StakeLock
from node.daemon.state import BatchEntry, FileRecord, WorkerState
from node.dashboard import serve_dashboard
from node.dashboard.chain import WorkerChain
from node.dashboard.model import ChainReading, WorkerLive, file_state, lock_state, throughput, worker_snapshot
from node.dashboard.worker import WorkerDashboard
from tests.chromium import Chromium, element_text, require_chromium, row_text
from tests.ledger.helpers import DEFAULT_POOL, make_pool, onboard
from tests.node import test_worker_daemon as worker_daemon

TOKEN = 10**18
T = TypeVar("T")

pool = worker_daemon.pool  # the fixture: a trainer process in network mode and one member node


@pytest.fixture
def chromium() -> Chromium:
    return require_chromium()


def keep_screenshot(path: Path, record_property: Callable[[str, object], None]) -> None:
    record_property("screenshot", str(path))
    print(f"screenshot: {path}")


# --- pure: states, throughput, exposure -----------------------------------------------------------------------


ROOT = b"\xaa" * 32  # the batch the pure tests' files are leaves of


def record(
    key: bytes, stage: str, *, created: float = 0.0, units: int = 10, detail: str | None = None, leaf: int = 0
) -> FileRecord:
    return FileRecord(key, 0, 0, units, stage, created, created, "0xtx", detail, None, None, ROOT, leaf)


def batch(submitted_at: int, status: BatchStatus = BatchStatus.PENDING, root: bytes = ROOT) -> BatchRecord:
    return BatchRecord(1, root, "0xnode", "0xprovider", 2, 20, 0, submitted_at, status)


def invalidation(leaf: int | None, key: bytes | None, validator: str = "0xvalidator") -> BatchInvalidated:
    return BatchInvalidated(
        1, ROOT, "0xnode", validator, leaf, key, int(Reason.PROOF_INVALID), 50 * TOKEN, EventPosition(9, 0, "0x")
    )


def test_a_file_is_pending_until_its_batchs_window_closes_and_claimable_from_that_second() -> None:
    key = b"\x01" * 32
    submitted = record(key, "submitted")
    assert file_state(submitted, batch(1000), None, 3600, 4599).state == "pending"
    assert file_state(submitted, batch(1000), None, 3600, 4600).state == "claimable"  # claimBatches' boundary
    assert file_state(submitted, batch(1000), None, 3600, 4599).closes_at == 4600
    assert file_state(submitted, None, None, 3600, 4599).state == "submitted"  # the chain not read yet


def test_the_pending_work_of_a_node_ejected_by_an_invalidation_is_void_not_claimable() -> None:
    key = b"\x03" * 32
    submitted = record(key, "submitted")
    for now in (4599, 4600):  # in its window or past it: never paid once an invalidation ejected the node
        state = file_state(submitted, batch(1000), None, 3600, now, voided=True)
        assert (state.state, state.closes_at) == ("void", 4600)
        assert state.reason is not None and "ejected" in state.reason
    claimed = file_state(record(key, "claimed"), batch(1000, BatchStatus.CLAIMED), None, 3600, 9999, voided=True)
    assert claimed.state == "claimed"  # paid before the ejection: stays paid
    # the daemon journals claimable work of an ejected node as expired, with a detail that says void
    journaled = file_state(record(key, "expired", detail="void: node ejected from pool 1"), None, None, 0, 0)
    assert (journaled.state, journaled.reason) == ("void", "void: node ejected from pool 1")


def test_the_chains_invalidation_voids_every_file_of_the_batch_before_the_journal_hears_of_it() -> None:
    bad, neighbour = b"\x02" * 32, b"\x05" * 32
    event = invalidation(1, bad)
    shown = file_state(record(bad, "submitted", leaf=1), batch(1000), event, 3600, 1001, voided=True)
    assert (shown.state, shown.slashed, shown.reason) == (
        "invalidated",
        50 * TOKEN,
        "proof_invalid (7); validator 0xvalidator",
    )
    voided = file_state(record(neighbour, "submitted", leaf=0), batch(1000), event, 3600, 1001, voided=True)
    assert (voided.state, voided.slashed) == ("invalidated", 0)  # the slash is counted once, on the leaf it proved
    assert (
        voided.reason
        == f"its batch was voided by leaf 1 (0x{bad.hex()[:12]}): proof_invalid (7); validator 0xvalidator"
    )
    unlisted = invalidation(None, None)  # reason 8 with no list to prove a leaf of: the slash shows on leaf 0
    assert file_state(record(neighbour, "submitted", leaf=0), batch(1000), unlisted, 3600, 1001).slashed == 50 * TOKEN
    assert file_state(record(bad, "submitted", leaf=1), batch(1000), unlisted, 3600, 1001).slashed == 0
    journaled = file_state(record(bad, "invalidated", detail="proof_invalid (7), 50 tokens slashed"), None, None, 0, 0)
    assert (journaled.state, journaled.reason) == ("invalidated", "proof_invalid (7), 50 tokens slashed")
    expired = file_state(record(bad, "expired", detail="step < 1 when submitting"), None, None, 0, 0)
    assert (expired.state, expired.reason) == ("expired", "step < 1 when submitting")


def test_throughput_averages_over_the_recent_window_or_since_the_start() -> None:
    now = 10_000.0
    files = [record(bytes([i]) * 32, "submitted", created=now - age, units=300) for i, age in enumerate((900, 50, 10))]
    since_start = throughput(files, now=now, since=now - 60, window=600)  # started a minute ago: 2 files in 60 s
    assert (since_start["files"], since_start["files_per_min"], since_start["tokens_per_s"]) == (2, 2.0, 10.0)
    long_running = throughput(files, now=now, since=0.0, window=600)  # the file 900 s old is outside the window
    assert (long_running["files"], long_running["files_per_min"], long_running["estimate"]) == (2, 0.2, True)


def test_a_refused_file_is_never_paid_and_shows_its_validator_before_the_journal_hears_of_it() -> None:
    key = b"\x04" * 32
    event = LeafRefused(
        1, ROOT, "0xnode", "0xvalidator", 0, key, 10, int(Reason.PROOF_INVALID), EventPosition(9, 0, "0x")
    )
    state = file_state(record(key, "submitted"), batch(1000), None, 3600, 1001, refusal=event)
    assert (state.state, state.closes_at, state.slashed) == ("refused", 4600, 0)
    assert state.reason == "proof_invalid (7); validator 0xvalidator"
    past = file_state(record(key, "submitted"), batch(1000), None, 3600, 9999, refusal=event)
    assert past.state == "refused"  # past its window: never claimable, though the rest of its batch is
    journaled = file_state(record(key, "refused", detail="refused on chain"), None, None, 0, 0)
    assert (journaled.state, journaled.reason) == ("refused", "refused on chain")
    overridden = file_state(
        record(key, "refused"), batch(1000, BatchStatus.INVALIDATED), invalidation(0, key), 3600, 1002
    )
    assert overridden.state == "invalidated"  # an invalidation overrides a refusal


def reading_of(
    roots: list[bytes], *, lock: StakeLock, ejected: bool = False, voided: bool | None = None, chain_time: int = 2000
) -> ChainReading:
    """`ejected` alone is an ejection by invalidation (void); pass `voided=False` for the owner's ejection."""
    return ChainReading(
        read_at=0.0, block=1, chain_time=chain_time, pool=DEFAULT_POOL, decimals=18, provider="0xprovider",
        stake=StakeInfo(active=300 * TOKEN, unbonding=0, locked=lock.amount, release_at=0), member=not ejected,
        ejected=ejected, lock=lock, batches={r: batch(1000, root=r) for r in roots}, invalidations={},
        voided=ejected if voided is None else voided,
    )  # fmt: skip


def alone(key: bytes) -> FileRecord:
    """A submitted file of 1000 units that is a batch of one, whose root is its key."""
    return dataclasses.replace(record(key, "submitted", units=1000), root=key)


def test_an_owner_ejected_nodes_files_stay_pending_then_claimable() -> None:
    keys = [bytes([i]) * 32 for i in range(2)]
    live = WorkerLive(stopping=False, held_step=3, started_at=0.0)
    records = [record(k, "submitted", units=1000, leaf=i) for i, k in enumerate(keys)]  # one batch
    held = StakeLock(1, "0xnode", 100 * TOKEN, 5600, False, True)
    for chain_time, state in ((2000, "pending"), (4600, "claimable")):
        reading = reading_of([ROOT], lock=held, ejected=True, voided=False, chain_time=chain_time)
        snapshot = worker_snapshot(node="0xnode", pool_id=1, records=records, reading=reading, live=live, now=1.0)
        assert snapshot["standing"] == "ejected by its owner"
        assert {f["state"] for f in snapshot["files"]} == {state} and all(f["reward"] == "1" for f in snapshot["files"])
        assert snapshot["tokens"]["void_files"] == 0


def test_slash_exposure_counts_each_batch_in_its_window_and_is_capped_by_the_nodes_lock_in_the_pool() -> None:
    keys = [bytes([i]) * 32 for i in range(3)]
    live = WorkerLive(stopping=False, held_step=3, started_at=0.0)
    records = [alone(k) for k in keys]  # three batches of one
    member = StakeLock(1, "0xnode", 100 * TOKEN, 0, True, True)
    snapshot = worker_snapshot(
        node="0xnode", pool_id=1, records=records, reading=reading_of(keys, lock=member), live=live, now=1.0
    )
    tokens = snapshot["tokens"]
    assert (tokens["pending_files"], tokens["exposed_files"], tokens["exposed_batches"]) == (3, 3, 3)
    # 3 x 50 = 150 slashable, but a slash reaches only this pool's lock of 100 (not the provider's other 200)
    assert tokens["slash_exposure"] == "100"
    assert tokens["pending_rewards"] == "3"  # 3 x 1000 units x 1e15 per unit
    assert snapshot["lock"] == {"amount": "100", "state": "member", "release_at": None}
    assert snapshot["stake"]["node_locked"] == "100"
    one_batch = [record(k, "submitted", units=1000, leaf=i) for i, k in enumerate(keys)]
    snapshot = worker_snapshot(
        node="0xnode", pool_id=1, records=one_batch, reading=reading_of([ROOT], lock=member), live=live, now=1.0
    )
    # one invalidation voids the batch: one slash, however many of its files are in their window
    assert (snapshot["tokens"]["exposed_files"], snapshot["tokens"]["exposed_batches"]) == (3, 1)
    assert snapshot["tokens"]["slash_exposure"] == "50"

    # ejected: the files are void, the lock (50 left after a slash) is held until 5600, and a void file can still
    # be invalidated until its window closes at 4600
    held = StakeLock(1, "0xnode", 50 * TOKEN, 5600, False, True)
    snapshot = worker_snapshot(
        node="0xnode", pool_id=1, records=records, reading=reading_of(keys, lock=held, ejected=True), live=live,
        now=1.0,
    )  # fmt: skip
    tokens = snapshot["tokens"]
    assert {f["state"] for f in snapshot["files"]} == {"void"} and all(f["reward"] is None for f in snapshot["files"])
    assert (tokens["pending_files"], tokens["void_files"], tokens["exposed_files"]) == (0, 3, 3)
    assert (tokens["void_rewards"], tokens["pending_rewards"], tokens["claimable"]) == ("3", "0", "0")
    assert tokens["slash_exposure"] == "50"
    assert snapshot["lock"] == {"amount": "50", "state": "held", "release_at": 5600}
    assert snapshot["stake"]["node_locked"] == "50"  # still locked: held one challenge window after the ejection
    late = worker_snapshot(
        node="0xnode", pool_id=1, records=records, reading=reading_of(keys, lock=held, ejected=True, chain_time=5600),
        live=live, now=1.0,
    )  # fmt: skip
    assert late["tokens"]["exposed_files"] == 0 and late["tokens"]["slash_exposure"] == "0"
    assert late["lock"]["state"] == "releasable"


def test_lock_states() -> None:
    assert lock_state(None, 0) == "none"
    assert lock_state(StakeLock(1, "0xnode", 0, 0, False, False), 0) == "none"  # never joined, or released
    assert lock_state(StakeLock(1, "0xnode", 1, 0, True, True), 10**9) == "member"
    assert lock_state(StakeLock(1, "0xnode", 1, 100, False, True), 99) == "held"
    assert lock_state(StakeLock(1, "0xnode", 1, 100, False, True), 100) == "releasable"


def test_the_dashboard_port_comes_from_the_flags_then_the_config() -> None:
    from ledger.cli.common import CommandError
    from node.cli.start import DEFAULT_DASHBOARD_PORT, _dashboard_port
    from node.config import WorkerSettings

    none, file = WorkerSettings(), WorkerSettings(dashboard_port=9000)
    assert _dashboard_port(None, None, none) is None
    assert _dashboard_port(True, None, none) == DEFAULT_DASHBOARD_PORT
    assert _dashboard_port(None, None, file) == 9000  # the config alone turns it on
    assert (
        _dashboard_port(None, 0, WorkerSettings(dashboard_port=0)) == 0
    )  # the flag, laid over the file by WorkerSettings
    assert _dashboard_port(False, None, file) is None
    with pytest.raises(CommandError, match="do not go together"):
        _dashboard_port(False, 9000, none)


# --- a real journal and chain, served -------------------------------------------------------------------------


@dataclass
class Journal:
    state: WorkerState
    ledger: Ledger  # read-only: what the dashboard reads with
    pool_id: int
    node: str
    keys: dict[str, bytes]
    trees: dict[str, BatchTree]  # each submitted file's batch, by the file's name
    config: PoolConfig
    chain: LocalChain
    validator: Ledger

    def invalidate_cheat(self) -> int:
        """The validator invalidates the batch of `cheat` with its proof (the journal does not look): 50 of the node's
        lock of 100 are burned and the node is ejected. Returns the block time of the ejection."""
        tree = self.trees["cheat"]
        receipt = self.validator.invalidate_batch(
            self.pool_id, self.node, tree.root, tree.proof(0), Reason.PROOF_INVALID
        )
        return int(self.chain.w3.eth.get_block(receipt["blockNumber"])["timestamp"])


@pytest.fixture
def journaled(
    tmp_path: Path, chain: LocalChain, ledger_for: Callable[[int], Ledger], deployment: Deployment
) -> Iterator[Journal]:
    """A member node's files in every state, each submitted file a batch of one: claimed, claimable, pending
    (accepted by a validator) and `cheat` (pending), written, expired. `invalidate_cheat()` then invalidates
    `cheat`'s batch on chain, leaving it `submitted` in the journal: the node is ejected and its other pending
    batches are void."""
    owner, provider, validator = ledger_for(0), ledger_for(1), ledger_for(6)
    pool_id = make_pool(owner)  # window 3600 s, 100 tokens per node, 1e15 per unit, slash 50
    node = dev_account(3)
    node_ledger = onboard(owner, provider, node, pool_id)
    owner.set_validator(pool_id, validator.address)
    owner.mint(owner.address, 1000 * TOKEN)
    owner.fund_rewards(pool_id, 1000 * TOKEN)
    state = WorkerState(tmp_path / "state", chain_id=deployment.chain_id, pool_id=pool_id, node=node.address)
    keys: dict[str, bytes] = {}
    trees: dict[str, BatchTree] = {}

    def write(name: str, units: int, step: int) -> bytes:
        data = f"rollouts of {name}".encode()
        key = keys[name] = hashlib.sha256(data).digest()
        state.path_of(key).write_bytes(data)
        state.add(key, step=step, counter=len(keys), units=units)
        return key

    def submit(name: str) -> BatchEntry:
        state.move([keys[name]], "uploaded")
        batch = state.form_batch([state.get(keys[name])])  # type: ignore[list-item]
        trees[name] = BatchTree([state.get(keys[name]).leaf])  # type: ignore[union-attr]
        receipt = node_ledger.submit_batch(pool_id, batch.root, batch.count, batch.total_units, slot=batch.slot)
        tx = "0x" + bytes(receipt["transactionHash"]).hex()
        state.move_batch(batch.root, "submitted", tx=tx, files="submitted")
        return batch

    write("claimed", 1000, 0)
    write("claimable", 2000, 0)
    claimed = submit("claimed")
    submit("claimable")
    chain.increase_time(3601)
    write("pending", 3000, 1)
    write("cheat", 4000, 1)
    submit("pending")
    submit("cheat")
    state.note_verdict(keys["pending"], f"accepted by {validator.address}")
    provider.claim_batches(pool_id, node.address, [claimed.root])
    state.move_batch(claimed.root, "claimed", files="claimed")
    write("written", 500, 2)
    write("expired", 600, 0)
    state.move([keys["expired"]], "expired", detail="step < 1 when submitting")
    reader = Ledger(chain.w3, deployment)
    yield Journal(state, reader, pool_id, node.address, keys, trees, owner.pool(pool_id).config, chain, validator)
    state.close()


async def with_dashboard(journal: Journal, use: Callable[[str, WorkerDashboard], Awaitable[T]]) -> T:
    """Serves the journal's dashboard on a free port until `use(url, source)` returns, after a first chain read."""
    live = WorkerLive(stopping=False, held_step=1, started_at=time.time() - 120)
    source = WorkerDashboard(
        journal.state, WorkerChain(journal.ledger, journal.pool_id, journal.node), lambda: live, refresh_seconds=0.2
    )
    runner, url = await serve_dashboard(source, "127.0.0.1", 0)
    try:
        deadline = time.monotonic() + 30
        while source.reading is None:
            assert time.monotonic() < deadline, f"no chain reading: {source.error}"
            await asyncio.sleep(0.05)
        return await use(url, source)
    finally:
        await runner.cleanup()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def served_state(journal: Journal) -> Any:
    async def use(url: str, _: WorkerDashboard) -> Any:
        return await asyncio.to_thread(get_json, f"{url}/api/state")

    return asyncio.run(with_dashboard(journal, use))


def states_by_name(journal: Journal, state: Any) -> dict[str, Any]:
    files = {f["work_key"]: f for f in state["files"]}
    return {name: files["0x" + key.hex()] for name, key in journal.keys.items()}


def test_the_state_api_puts_the_chains_word_first_and_accounts_for_every_token(journaled: Journal) -> None:
    state = served_state(journaled)
    by_name = states_by_name(journaled, state)
    assert {name: f["state"] for name, f in by_name.items()} == {
        "claimed": "claimed",
        "claimable": "claimable",
        "pending": "pending",
        "cheat": "pending",
        "written": "written",
        "expired": "expired",
    }
    pending = by_name["pending"]
    root = journaled.trees["pending"].root
    submitted = journaled.ledger.get_batch(journaled.pool_id, journaled.node, root)
    assert pending["closes_at"] == submitted.submitted_at + journaled.config.challenge_window
    assert pending["batch"] == "0x" + root.hex() and pending["leaf_index"] == 0
    assert pending["verdict"] == f"accepted by {dev_account(6).address}" and pending["reward"] == "3"
    assert by_name["expired"]["reward"] is None  # never submitted, never paid
    assert state["standing"] == "member" and state["step"] == 1
    assert state["stake"]["active"] == "100" and state["stake"]["node_locked"] == "100"
    assert state["lock"] == {"amount": "100", "state": "member", "release_at": None}
    assert state["tokens"] == {
        "claimed": "1",  # 1000 units x 1e15
        "claimable": "2",
        "pending_rewards": "7",  # pending 3000 + cheat 4000 units
        "slash_exposure": "100",  # two batches in their window x 50, and the node's lock holds 100
        "pending_files": 2,
        "exposed_files": 2,
        "exposed_batches": 2,
        "void_rewards": "0",
        "void_files": 0,
        "refused_rewards": "0",
        "refused_files": 0,
        "lost_rewards": "0",
        "slashed": "0",
    }
    assert state["counts"]["submitted"] == 3 and state["files_total"] == 6
    assert state["batch_counts"] == {
        "formed": 0,
        "listed": 0,
        "submitted": 3,
        "claimed": 1,
        "invalidated": 0,
        "void": 0,
    }
    assert state["chain"]["error"] is None and state["chain"]["block"] >= 1


def test_after_an_invalidation_the_node_is_ejected_its_pending_work_void_and_its_lock_held(
    journaled: Journal,
) -> None:
    ejected_at = journaled.invalidate_cheat()
    state = served_state(journaled)
    by_name = states_by_name(journaled, state)
    assert {name: f["state"] for name, f in by_name.items()} == {
        "claimed": "claimed",
        "claimable": "void",  # its window closed, but the node is ejected: never paid
        "pending": "void",
        "cheat": "invalidated",  # the journal still says submitted; the chain said it first
        "written": "written",
        "expired": "expired",
    }
    assert by_name["cheat"]["stage"] == "submitted" and by_name["cheat"]["slashed"] == "50"
    assert by_name["cheat"]["reason"].startswith("proof_invalid (7); validator ")
    assert all(by_name[n]["reward"] is None for n in ("cheat", "claimable", "pending", "expired"))
    assert state["standing"] == "ejected"
    # 100 staked, 50 burned from the lock; the other 50 stay locked one challenge window after the ejection
    assert state["stake"]["active"] == "50" and state["stake"]["node_locked"] == "50"
    release_at = ejected_at + journaled.config.challenge_window
    assert state["lock"] == {"amount": "50", "state": "held", "release_at": release_at}
    assert state["tokens"] == {
        "claimed": "1",
        "claimable": "0",
        "pending_rewards": "0",
        "slash_exposure": "50",  # `pending` is void but still in its window: it may burn the 50 left
        "pending_files": 0,
        "exposed_files": 1,
        "exposed_batches": 1,
        "void_rewards": "5",  # claimable 2000 + pending 3000 units, never paid
        "void_files": 2,
        "refused_rewards": "0",
        "refused_files": 0,
        "lost_rewards": "4",
        "slashed": "50",
    }

    journaled.chain.increase_time(journaled.config.challenge_window + 1)
    later = served_state(journaled)
    assert later["lock"] == {"amount": "50", "state": "releasable", "release_at": release_at}
    assert later["tokens"]["exposed_files"] == 0 and later["tokens"]["slash_exposure"] == "0"


def test_a_refused_file_shows_refused_from_the_chain_and_an_owners_ejection_voids_nothing(journaled: Journal) -> None:
    """The validator refuses `cheat` (a borderline file) and the pool's owner ejects the node: `cheat` is refused
    (never paid, not slashed), the others stay pending or claimable, and the standing says who ejected it."""
    tree = journaled.trees["cheat"]
    journaled.validator.refuse_leaf(journaled.pool_id, journaled.node, tree.root, tree.proof(0), Reason.PROOF_INVALID)
    owner = journaled.validator.as_account(dev_account(0))
    owner.eject(journaled.pool_id, journaled.node)
    state = served_state(journaled)
    by_name = states_by_name(journaled, state)
    assert {name: by_name[name]["state"] for name in ("claimable", "pending", "cheat")} == {
        "claimable": "claimable",  # an owner's ejection voids nothing
        "pending": "pending",
        "cheat": "refused",  # the journal still says submitted; the chain's LeafRefused said it first
    }
    assert by_name["cheat"]["reason"] == f"proof_invalid (7); validator {journaled.validator.address}"
    assert by_name["cheat"]["reward"] is None and by_name["pending"]["reward"] == "3"
    assert state["standing"] == "ejected by its owner"
    tokens = state["tokens"]
    assert (tokens["refused_files"], tokens["refused_rewards"]) == (1, "4")  # 4000 units, never paid
    assert (tokens["void_files"], tokens["claimable"], tokens["slashed"]) == (0, "2", "0")
    assert tokens["exposed_files"] == 2  # pending and refused, both still in their window


def test_another_nodes_invalidation_of_the_same_key_is_not_this_nodes(
    journaled: Journal, ledger_for: Callable[[int], Ledger]
) -> None:
    """Records are per node: another member submitting this node's batch (its root), and being invalidated for it,
    leaves this node's record pending and the node a member."""
    other = onboard(ledger_for(0), ledger_for(2), dev_account(4), journaled.pool_id)
    tree = journaled.trees["pending"]
    other.submit_batch(journaled.pool_id, tree.root, tree.count, tree.total_units)
    journaled.validator.invalidate_batch(
        journaled.pool_id, other.address, tree.root, tree.proof(0), Reason.PROOF_INVALID
    )
    state = served_state(journaled)
    by_name = states_by_name(journaled, state)
    assert by_name["pending"]["state"] == "pending" and by_name["pending"]["slashed"] is None
    assert state["standing"] == "member" and state["tokens"]["slashed"] == "0"


def test_the_page_in_chromium_shows_each_files_state_and_the_lock(
    journaled: Journal, chromium: Chromium, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    ejected_at = journaled.invalidate_cheat()

    async def use(url: str, _: WorkerDashboard) -> tuple[str, Path]:
        dom = await asyncio.to_thread(chromium.dom, url)
        shot = await asyncio.to_thread(chromium.screenshot, url, tmp_path / "dashboard-worker.png")
        return dom, shot

    dom, shot = asyncio.run(with_dashboard(journaled, use))
    keep_screenshot(shot, record_property)
    row = {name: row_text(dom, "0x" + key.hex()) for name, key in journaled.keys.items()}
    pending = journaled.ledger.get_batch(journaled.pool_id, journaled.node, journaled.trees["pending"].root)
    closes = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(pending.submitted_at + 3600))
    assert "void: never paid, the node was ejected from the pool" in row["pending"], row["pending"]
    assert f"may still be invalidated until {closes}" in row["pending"]
    assert f"accepted by {dev_account(6).address}" in row["pending"]
    assert "void: never paid" in row["claimable"] and "may still be invalidated" not in row["claimable"]
    assert "invalidated: proof_invalid (7)" in row["cheat"] and "slashed 50 tokens (burned)" in row["cheat"]
    assert "reward claimed" in row["claimed"]
    assert "never submitted: step < 1 when submitting" in row["expired"]
    assert element_text(dom, "stake-active") == "50 tokens"
    assert element_text(dom, "stake-node-locked") == "50 tokens"
    release = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ejected_at + 3600))
    assert element_text(dom, "lock-release").startswith(f"held until {release}")
    assert element_text(dom, "standing") == "ejected"
    assert element_text(dom, "void-rewards") == "5 tokens (2 files)"
    assert element_text(dom, "earned") == "1 tokens" and element_text(dom, "slash-exposure") == "50 tokens"


# --- the daemon serves it -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_prime_node_start_dashboard_shows_a_submitted_files_state_and_the_stake(
    pool: worker_daemon.Pool, chromium: Chromium, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    process = worker_daemon.start(pool, "--dashboard", "--dashboard-port", "0", "--submit-batch", "1", log="dash.log")
    log = pool.root / "dash.log"
    try:
        worker_daemon.wait_for(lambda: "dashboard on http://127.0.0.1:" in log.read_text(), "the dashboard's URL")
        found = re.search(r"dashboard on (http://127\.0\.0\.1:\d+)", log.read_text())
        assert found, log.read_text()[-3000:]
        url = found.group(1)
        worker_daemon.wait_for(
            lambda: any(s == "submitted" for s, _ in worker_daemon.journal(pool).values()), "a submitted file"
        )
        key = "0x" + next(k for k, (s, _) in worker_daemon.journal(pool).items() if s == "submitted")

        def shown_pending() -> bool:  # the dashboard reads the chain every 5 s
            files = {f["work_key"]: f for f in get_json(f"{url}/api/state")["files"]}
            return key in files and files[key]["state"] == "pending"

        worker_daemon.wait_for(shown_pending, "the file pending in /api/state", timeout=30)
        dom = chromium.dom(url)
        keep_screenshot(chromium.screenshot(url, tmp_path / "dashboard-daemon.png"), record_property)
    finally:
        process.send_signal(signal.SIGTERM)
        code = worker_daemon.finish(pool, process, "dash.log")
    assert code == 0, log.read_text()[-3000:]  # SIGTERM stops the dashboard with the daemon
    assert "pending until " in row_text(dom, key)
    assert element_text(dom, "stake-active") == "100 tokens"  # onboarding staked 100; nothing slashed
    assert element_text(dom, "stake-node-locked") == "100 tokens"
    assert element_text(dom, "lock-release").startswith("member held while a member")
    assert element_text(dom, "standing") == "member" and "running" in element_text(dom, "daemon")
    assert element_text(dom, "step") == "0"


def test_an_invalidation_a_reorganisation_removed_is_no_longer_shown(journaled: Journal) -> None:
    """The dashboard follows the chain through reorganisations: what the new blocks no longer hold goes away."""
    reader = WorkerChain(journaled.ledger, journaled.pool_id, journaled.node)
    cheat = journaled.trees["cheat"].root
    batches = journaled.state.all_batches()
    assert {b.root for b in batches} == {tree.root for tree in journaled.trees.values()}
    journaled.invalidate_cheat()
    before = reader.read(batches)
    assert cheat in before.invalidations and before.batches[cheat].status == BatchStatus.INVALIDATED
    w3 = journaled.chain.w3
    assert "error" not in w3.provider.make_request("anvil_reorg", [1, []])  # type: ignore[arg-type]
    w3.provider.make_request("anvil_dropAllTransactions", [])  # type: ignore[arg-type]

    after = reader.read(batches)

    assert cheat not in after.invalidations
    assert after.batches[cheat].status == BatchStatus.PENDING and not after.ejected


def test_a_claimed_batch_whose_slot_a_later_batch_took_stays_claimed_and_is_read_once(
    journaled: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, pool_id = journaled.state, journaled.pool_id
    data = b"rollouts of later"
    later_key = hashlib.sha256(data).digest()
    state.path_of(later_key).write_bytes(data)
    state.add(later_key, step=1, counter=9, units=700)
    state.move([later_key], "uploaded")
    later = state.form_batch([state.get(later_key)])  # type: ignore[list-item]
    claimed = state.batch(journaled.trees["claimed"].root)
    assert claimed is not None and later.slot == claimed.slot == 0  # the claimed batch's slot, free again
    node = journaled.validator.as_account(dev_account(3))
    node.submit_batch(pool_id, later.root, later.count, later.total_units, slot=later.slot)
    state.move_batch(later.root, "submitted", tx="0x01", files="submitted")

    reads: list[bytes] = []
    get_batch = journaled.ledger.get_batch

    def counted(pool: int, who: str, root: bytes, *, slot: int | None = None) -> BatchRecord:
        reads.append(root)
        return get_batch(pool, who, root, slot=slot)

    monkeypatch.setattr(journaled.ledger, "get_batch", counted)
    reader = WorkerChain(journaled.ledger, pool_id, journaled.node)
    first = reader.read(state.all_batches())
    assert first.batches[later.root].status == BatchStatus.PENDING
    assert first.batches[claimed.root].status == BatchStatus.NONE  # its slot holds the later batch now
    reader.read(state.all_batches())
    assert reads.count(claimed.root) == 1  # settled: the journal holds its fate, the chain is not asked again

    monkeypatch.undo()
    served = served_state(journaled)
    files = {f["work_key"]: f for f in served["files"]}
    assert files["0x" + journaled.keys["claimed"].hex()]["state"] == "claimed"
    assert files["0x" + later_key.hex()]["state"] == "pending"
    assert served["tokens"]["claimed"] == "1"
