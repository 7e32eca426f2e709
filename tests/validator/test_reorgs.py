"""The validator daemon on a chain that reorganises (anvil's `anvil_reorg`): a batch moved into blocks the daemon
already read is still recorded (its leaf list to fetch, its files to judge), one removed is never listed nor
invalidated, and `confirmations` holds the newest blocks back.

The daemon runs for real against anvil; its coordinator is a closed port, so a batch's leaf list it tries to download
is tried again later (never held against the worker): these tests are about what it reads from the chain.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain, free_port
from ledger.client import Ledger
from ledger.merkle import BatchTree, Leaf
from protocol.tasks.spec import load_task_spec
from tests.ledger.helpers import make_pool, onboard, work_key
from tests.network_trainer import TASK
from tests.validator.batching import submit
from validator.config import ValidatorConfig
from validator.daemon import PoolSetup, ValidatorDaemon
from validator.errors import ValidatorError
from validator.store import GONE, SEEN, UNVERIFIABLE

OWNER, PROVIDER, NODE, VALIDATOR = 0, 1, 6, 9
LedgerFor = Callable[[int], Ledger]


@pytest.fixture
def pool(ledger_for: LedgerFor) -> tuple[int, Ledger]:
    """A pool with anvil account 9 as its validator and one onboarded node; returns (pool id, the node's client)."""
    owner = ledger_for(OWNER)
    pool_id = make_pool(owner)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    node = onboard(owner, ledger_for(PROVIDER), dev_account(NODE), pool_id)
    return pool_id, node


def daemon(ledger_for: LedgerFor, pool_id: int, state: Path, **config: object) -> ValidatorDaemon:
    closed = f"http://127.0.0.1:{free_port()}"
    setup = PoolSetup(pool_id, dev_account(OWNER).address, closed, (closed,), load_task_spec(TASK))
    return ValidatorDaemon(ledger_for(VALIDATOR), setup, ValidatorConfig(poll_seconds=0.05, **config), state)  # type: ignore[arg-type]


def batch(label: str) -> BatchTree:
    """A batch of one file, `label`, of 1000 units."""
    return BatchTree([Leaf(work_key(label), 1000)])


def raw_submission(node: Ledger, pool_id: int, tree: BatchTree, nonce: int) -> str:
    account = dev_account(NODE)
    tx = node.work.functions.submitBatch(pool_id, 0, tree.root, tree.count, tree.total_units).build_transaction(
        {"from": account.address, "nonce": nonce, "gas": 300_000, "maxFeePerGas": 10 * 10**9,
         "maxPriorityFeePerGas": 10**9, "chainId": node.w3.eth.chain_id}
    )  # fmt: skip
    return "0x" + bytes(account.sign_transaction(tx).raw_transaction).hex()


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"no {what} within {timeout:g} s"
        await asyncio.sleep(0.05)


def test_a_batch_moved_behind_the_cursor_is_recorded_and_one_removed_is_never_invalidated(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    address = dev_account(NODE).address
    nonce = chain.w3.eth.get_transaction_count(address)
    removed, moved = batch("removed"), batch("moved")
    submit(node, pool_id, removed)
    for _ in range(3):
        chain.mine()
    validator = daemon(ledger_for, pool_id, tmp_path / "state")
    store = validator.store

    async def scenario() -> None:
        running = asyncio.create_task(validator.run())
        try:
            await until(lambda: store.get_batch(removed.root, address, 0) is not None, "first submission recorded")
            # four new blocks from the one before the submission: the submission is gone, another one (same nonce)
            # sits one block later, at a height the daemon has read already
            response = chain.w3.provider.make_request(
                "anvil_reorg", [4, [[raw_submission(node, pool_id, moved, nonce), 1]]]
            )  # type: ignore[arg-type]
            assert "error" not in response, response
            await until(lambda: store.get_batch(moved.root, address, 0) is not None, "the moved submission recorded")
            await until(
                lambda: (row := store.get_batch(removed.root, address, 0)) is not None and row.stage == UNVERIFIABLE,
                "the removed submission parked",
            )
            assert "validator_chain_reorganisations_total 1\n" in validator.metrics.render()
        finally:
            validator.stopping.set()
            await running

    asyncio.run(scenario())

    store = validator.store.open(tmp_path / "state", chain_id=31337, work_ledger=node.work.address, pool_id=pool_id,
                                 validator=dev_account(VALIDATOR).address)  # fmt: skip
    gone, kept = store.get_batch(removed.root, address, 0), store.get_batch(moved.root, address, 0)
    assert gone is not None and (gone.stage, gone.note, gone.tx_hash) == (UNVERIFIABLE, GONE, None)
    assert kept is not None and kept.stage == SEEN  # its leaf list waits for the (closed) coordinator, not skipped
    assert kept.last_error is not None and kept.block < store.cursor(0)
    assert store.get(work_key("removed"), address) is None  # never listed: no file of it was judged


def test_confirmations_hold_a_submission_back_until_it_is_that_deep(
    chain: LocalChain, ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    pool_id, node = pool
    address = dev_account(NODE).address
    validator = daemon(ledger_for, pool_id, tmp_path / "state", confirmations=3)
    store = validator.store
    deep = batch("deep")

    async def scenario() -> None:
        running = asyncio.create_task(validator.run())
        try:
            await asyncio.to_thread(submit, node, pool_id, deep)
            for _ in range(2):
                await asyncio.to_thread(chain.mine)
            await asyncio.sleep(0.5)  # ten polls
            assert store.get_batch(deep.root, address, 0) is None  # two blocks deep: not yet
            await asyncio.to_thread(chain.mine)
            await until(lambda: store.get_batch(deep.root, address, 0) is not None, "the submission three blocks deep")
        finally:
            validator.stopping.set()
            await running

    asyncio.run(scenario())


def test_the_default_confirmations_are_none_on_a_local_chain_and_twelve_elsewhere() -> None:
    from ledger.events import default_confirmations

    assert (default_confirmations(31337), default_confirmations(1337)) == (0, 0)
    assert default_confirmations(1) == default_confirmations(8453) == 12


def test_a_validator_of_another_precision_than_the_pools_task_does_not_start(
    ledger_for: LedgerFor, pool: tuple[int, Ledger], tmp_path: Path
) -> None:
    # a float32 task judged with bfloat16 tolerances would pass cheats; the other way round, it would slash honesty
    refused = r"generates in float32 .* would recompute in bfloat16: pass --dtype float32"
    with pytest.raises(ValidatorError, match=refused):
        daemon(ledger_for, pool[0], tmp_path / "state", dtype="bfloat16")
    assert not (tmp_path / "state").exists()  # refused before the state folder is bound to anything
