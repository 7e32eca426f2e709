"""The ledger client on two EVM implementations: the tests here run on anvil and on Hardhat Network.

Anvil and Hardhat answer the same JSON-RPC calls in their own words (revert data, nonce errors, fee methods),
and Hardhat 2.20 executes with ethereumjs where anvil uses revm. Here the whole devnet lifecycle and the
client's sharp edges (a batch's submission, a leaf's proof, a slash, a claim after the window, decoded custom
errors, nonce resynchronisation, fees, time control) must come out the same on both. Hardhat is pinned in
contracts/package.json; without it the hardhat cases skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devnet.lifecycle import LifecycleReport, Role, run_lifecycle
from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.errors import ChainError, ContractRevert
from ledger.hardhat import HardhatChain, find_hardhat
from ledger.merkle import Leaf, LeafProof, leaf_hash, root_of
from ledger.tx import Transactor
from ledger.types import BatchStatus, Reason
from ledger.units import parse_amount
from tests.conftest import TOKEN, UNBONDING_PERIOD
from tests.ledger.helpers import assert_revert, batch_of, commit_batch, events, make_pool, onboard, transact_at

pytestmark = [
    pytest.mark.slow,  # a Hardhat Network node per session
    # Hardhat has no eth_maxPriorityFeePerGas; web3 then takes the tip from eth_feeHistory and warns on every send.
    pytest.mark.filterwarnings("ignore:There was an issue with the method eth_maxPriorityFeePerGas:UserWarning"),
]

LedgerFor = Callable[[int], Ledger]
IMPLEMENTATIONS = ("anvil", "hardhat")
OWNER, PROVIDER, NODE, VALIDATOR, STRANGER = 0, 1, 3, 9, 7
WINDOW = 3600  # helpers.make_pool's default challenge window
REWARD = 10**15  # helpers.make_pool's default reward per unit
SLASH = 50 * TOKEN  # helpers.make_pool's default slash


def unstarted(implementation: str) -> LocalChain:
    if implementation == "anvil":
        return LocalChain()
    try:
        find_hardhat()
    except ChainError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true requires Hardhat: {exc}")
        pytest.skip(str(exc))
    return HardhatChain()


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def session_chain(request: pytest.FixtureRequest) -> Iterator[tuple[LocalChain, Deployment]]:
    """Overrides the conftest's anvil, so its `chain`, `deployment` and `ledger_for` fixtures (a snapshot revert
    after every test) run on each implementation in turn."""
    chain = unstarted(request.param).start()
    try:
        yield chain, chain.deploy(unbonding_period=UNBONDING_PERIOD)
    finally:
        chain.stop()


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def lifecycle(request: pytest.FixtureRequest) -> tuple[LocalChain, LifecycleReport]:
    """`prime-devnet lifecycle` run to its end on a fresh chain of one implementation (stopped afterwards)."""
    chain = unstarted(request.param)
    try:
        return chain, run_lifecycle(chain=chain)
    finally:
        chain.stop()


@dataclass(frozen=True)
class Pool:
    pool_id: int
    provider: str  # PROVIDER's address: staked 100 tokens, bound NODE
    node: str  # NODE's address, a member of the pool


@pytest.fixture(scope="module")
def pool(session_chain: tuple[LocalChain, Deployment]) -> Pool:
    """A default pool (window 1 h, reward 1e15 per unit, slash 50) with 100 tokens of rewards, VALIDATOR appointed
    and NODE a member: made once per chain, before the snapshot of the first test that asks for it, so every test
    starts from it (ten transactions fewer each)."""
    chain, deployment = session_chain
    owner, provider = (Ledger(chain.w3, deployment, dev_account(index)) for index in (OWNER, PROVIDER))
    pool_id = make_pool(owner)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    owner.mint(owner.address, 100 * TOKEN)
    owner.fund_rewards(pool_id, 100 * TOKEN)
    onboard(owner, provider, dev_account(NODE), pool_id)
    return Pool(pool_id, provider.address, dev_account(NODE).address)


# --- the devnet lifecycle -----------------------------------------------------------------------------


def test_lifecycle_pays_burns_and_releases_by_the_numbers(lifecycle: tuple[LocalChain, LifecycleReport]) -> None:
    _, report = lifecycle
    config, before, after = report.config, report.before, report.after
    reward = parse_amount(config.reward_per_unit, report.decimals)
    slash = parse_amount(config.slash_amount, report.decimals)
    min_stake = parse_amount(config.min_stake_per_node, report.decimals)
    assert (report.claimed, report.slashed) == (config.units[0] * reward, slash)
    gained = {role: after.holdings[role].balance - before.holdings[role].balance for role in after.holdings}
    assert gained == {role: 0 for role in gained} | {Role.PROVIDER_1: report.claimed, Role.ESCROW: -report.claimed}
    assert before.holdings[Role.PROVIDER_2].active_stake - after.holdings[Role.PROVIDER_2].active_stake == slash
    assert (before.escrow, after.escrow) == (report.funded, report.funded - report.claimed)
    assert (before.burned, after.burned) == (0, slash)
    assert after.members == ()
    assert report.releases[Role.NODE_1].provider_locked == (min_stake, 0)
    assert report.releases[Role.NODE_2].provider_locked == (min_stake - slash, 0)
    staked = sum(h.active_stake + h.unbonding for h in after.holdings.values())
    assert after.holdings[Role.REGISTRY].balance == staked + after.burned


def test_lifecycle_refusals_name_the_contracts_custom_errors(lifecycle: tuple[LocalChain, LifecycleReport]) -> None:
    _, report = lifecycle
    node_1, node_2 = report.addresses[Role.NODE_1], report.addresses[Role.NODE_2]
    assert report.repeat_claim.error == "BatchNotPending"
    assert (report.repeat_claim.values["node"], report.repeat_claim.values["status"]) == (node_1, BatchStatus.CLAIMED)
    assert (report.ejected_claim.error, report.ejected_claim.values) == (
        "NodeEjected",
        {"poolId": report.pool_id, "node": node_2},
    )
    assert report.early_release.error == "LockHeld"
    assert report.early_release.values["releaseAt"] == report.releases[Role.NODE_1].held_until
    assert report.early_release.values["member"] is False


# --- work: submit a batch, refuse a leaf, invalidate, claim ------------------------------------------


def test_a_submitted_batch_is_one_pending_record_at_its_block_time_and_one_event(
    chain: LocalChain, ledger_for: LedgerFor, pool: Pool
) -> None:
    node, tree = ledger_for(NODE), batch_of(("file 0", 10), ("file 1", 20), ("file 2", 30))

    receipt = node.submit_batch(pool.pool_id, tree.root, tree.count, tree.total_units)

    assert events(node.work.events.BatchSubmitted(), receipt) == [
        {"poolId": pool.pool_id, "root": tree.root, "node": pool.node, "slot": 0, "count": 3, "totalUnits": 60}
    ]
    record = node.get_batch(pool.pool_id, pool.node, tree.root)
    assert (record.status, record.count, record.total_units, record.provider) == (
        BatchStatus.PENDING,
        3,
        60,
        pool.provider,
    )
    assert record.submitted_at == chain.w3.eth.get_block(receipt["blockNumber"])["timestamp"]


def test_a_refused_leaf_is_checked_against_its_proof_and_left_out_of_the_claim(
    chain: LocalChain, ledger_for: LedgerFor, pool: Pool
) -> None:
    node, validator = ledger_for(NODE), ledger_for(VALIDATOR)
    tree, _ = commit_batch(node, pool.pool_id, *[(f"borderline {i}", 100 * (i + 1)) for i in range(5)])
    wrong = LeafProof(3, Leaf(tree.leaves[3].work_key, 401), tree.proof(3).siblings)

    with pytest.raises(ContractRevert) as info:
        validator.refuse_leaf(pool.pool_id, pool.node, tree.root, wrong, Reason.PROOF_INVALID)
    computed = root_of(leaf_hash(wrong.leaf), 3, wrong.siblings)
    assert_revert(info.value, "InvalidProof", root=tree.root, index=3, computed=computed)
    validator.refuse_leaf(pool.pool_id, pool.node, tree.root, tree.proof(3), Reason.PROOF_INVALID)
    chain.increase_time(WINDOW + 1)
    node.claim_batches(pool.pool_id, pool.node, [tree.root])

    assert node.is_leaf_refused(pool.pool_id, pool.node, tree.root, 3)
    assert node.balance_of(pool.provider) == (1500 - 400) * REWARD


def test_invalidation_burns_the_slash_from_the_lock_and_ejects_the_node(ledger_for: LedgerFor, pool: Pool) -> None:
    node, validator = ledger_for(NODE), ledger_for(VALIDATOR)
    tree, _ = commit_batch(node, pool.pool_id, *[(f"forged {i}", 10 * (i + 1)) for i in range(4)])
    registry_balance = node.balance_of(node.registry.address)

    receipt = validator.invalidate_batch(pool.pool_id, pool.node, tree.root, tree.proof(2), Reason.REWARD_MISMATCH)

    (invalidated,) = events(node.work.events.BatchInvalidated(), receipt)
    assert (invalidated["slashed"], invalidated["reason"], invalidated["leafIndex"]) == (
        SLASH,
        int(Reason.REWARD_MISMATCH),
        2,
    )
    stake = node.stake_of(pool.provider)
    assert (stake.active, stake.locked) == (100 * TOKEN - SLASH, 100 * TOKEN - SLASH)  # the rest, held in the lock
    assert (node.burned(), node.balance_of(node.registry.address)) == (SLASH, registry_balance)
    assert node.escrow_of(pool.pool_id) == 100 * TOKEN  # burned, not paid into the escrow
    assert node.get_batch(pool.pool_id, pool.node, tree.root).status == BatchStatus.INVALIDATED
    assert node.is_ejected(pool.pool_id, pool.node) and not node.is_member(pool.pool_id, pool.node)


def test_a_claim_after_the_window_pays_the_provider_units_times_reward(
    chain: LocalChain, ledger_for: LedgerFor, pool: Pool
) -> None:
    node = ledger_for(NODE)
    tree, _ = commit_batch(node, pool.pool_id, ("paid 0", 1000), ("paid 1", 500))
    chain.increase_time(WINDOW + 1)

    receipt = ledger_for(STRANGER).claim_batches(pool.pool_id, pool.node, [tree.root])  # anyone may send the claim

    (claimed,) = events(node.work.events.BatchesClaimed(), receipt)
    assert (claimed["provider"], claimed["amount"]) == (pool.provider, 1500 * REWARD)
    assert [(ref["slot"], ref["root"]) for ref in claimed["batches"]] == [(0, tree.root)]
    assert node.balance_of(pool.provider) == 1500 * REWARD
    assert node.escrow_of(pool.pool_id) == 100 * TOKEN - 1500 * REWARD
    assert node.get_batch(pool.pool_id, pool.node, tree.root).status == BatchStatus.CLAIMED


def test_a_claim_mined_exactly_at_the_window_end_is_paid(chain: LocalChain, ledger_for: LedgerFor, pool: Pool) -> None:
    """evm_setNextBlockTimestamp: the claim's block is stamped exactly when the window closes."""
    node, provider = ledger_for(NODE), ledger_for(PROVIDER)
    tree, _ = commit_batch(node, pool.pool_id, ("at the edge", 10))
    closes_at = node.get_batch(pool.pool_id, pool.node, tree.root).submitted_at + WINDOW

    claim = provider.work.functions.claimBatches(pool.pool_id, pool.node, [(0, tree.root)])
    transact_at(chain, provider, claim, closes_at)

    assert node.balance_of(pool.provider) == 10 * REWARD
    assert node.get_batch(pool.pool_id, pool.node, tree.root).status == BatchStatus.CLAIMED


# --- reverts ------------------------------------------------------------------------------------------


def test_a_revert_at_estimation_names_the_custom_error_and_its_values(
    chain: LocalChain, ledger_for: LedgerFor, pool: Pool
) -> None:
    node = ledger_for(NODE)
    tree, _ = commit_batch(node, pool.pool_id, ("early", 10))
    closes_at = node.get_batch(pool.pool_id, pool.node, tree.root).submitted_at + WINDOW

    with pytest.raises(ContractRevert) as info:
        ledger_for(PROVIDER).claim_batches(pool.pool_id, pool.node, [tree.root])

    assert info.value.tx_hash is None  # refused before anything was sent
    assert_revert(
        info.value,
        "BatchChallengeWindowOpen",
        poolId=pool.pool_id,
        node=pool.node,
        root=tree.root,
        closesAt=closes_at,
    )


def test_a_mined_failure_is_reported_with_its_transaction(chain: LocalChain, ledger_for: LedgerFor) -> None:
    """With the gas given nothing is estimated: the transaction is mined, fails, and costs its nonce."""
    account = dev_account(STRANGER)
    nonce = chain.w3.eth.get_transaction_count(account.address)
    registry = ledger_for(STRANGER).registry

    with pytest.raises(ContractRevert) as info:
        Transactor(chain.w3, account).send(registry.functions.withdraw(), description="withdraw", gas=200_000)

    tx_hash = info.value.tx_hash
    assert tx_hash is not None
    receipt = chain.w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
    assert receipt["status"] == 0
    assert chain.w3.eth.get_transaction(tx_hash)["nonce"] == nonce  # type: ignore[arg-type]
    assert chain.w3.eth.get_transaction_count(account.address) == nonce + 1


def test_a_mined_failure_is_replayed_to_name_the_custom_error(chain: LocalChain, ledger_for: LedgerFor) -> None:
    stranger = ledger_for(STRANGER)

    with pytest.raises(ContractRevert) as info:
        Transactor(chain.w3, dev_account(STRANGER)).send(
            stranger.registry.functions.withdraw(), description="withdraw", gas=200_000
        )

    assert_revert(info.value, "NothingToWithdraw", provider=stranger.address)


# --- nonces, fees, time -------------------------------------------------------------------------------


def test_two_senders_sharing_a_key_resynchronise_their_nonce(
    chain: LocalChain, ledger_for: LedgerFor, caplog: pytest.LogCaptureFixture
) -> None:
    """The second sender takes the nonce the first expects next: the node refuses it, each in its own words
    (anvil "nonce too low", Hardhat "Nonce too low. Expected nonce to be ..."), and the first reads the count
    again and sends at the next one."""
    account = dev_account(OWNER)
    first, second = ledger_for(OWNER), ledger_for(OWNER)
    receiver = dev_account(STRANGER).address
    start = chain.w3.eth.get_transaction_count(account.address)

    with caplog.at_level(logging.WARNING, logger="ledger.tx"):
        receipts = [first.mint(receiver, TOKEN), second.mint(receiver, TOKEN), first.mint(receiver, TOKEN)]

    (resync,) = [record.getMessage() for record in caplog.records if "resynchronising" in record.getMessage()]
    assert f"nonce {start + 1} rejected" in resync and "nonce too low" in resync.lower()
    nonces = [chain.w3.eth.get_transaction(r["transactionHash"])["nonce"] for r in receipts]
    assert nonces == [start, start + 1, start + 2]
    assert first.balance_of(receiver) == 3 * TOKEN


def test_transactions_are_eip_1559_above_the_base_fee(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    receipt = owner.mint(owner.address, TOKEN)
    tx = chain.w3.eth.get_transaction(receipt["transactionHash"])
    block = chain.w3.eth.get_block(receipt["blockNumber"])
    assert tx["type"] == 2
    assert tx["maxFeePerGas"] >= block["baseFeePerGas"] + tx["maxPriorityFeePerGas"]
    assert receipt["effectiveGasPrice"] >= block["baseFeePerGas"]
    assert tx["gas"] > receipt["gasUsed"]  # the estimate plus its margin


def test_time_control_and_snapshots_move_the_chain_exactly(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    start = owner.timestamp()
    assert chain.increase_time(WINDOW) >= start + WINDOW  # both add the offset to the wall clock, which moved too
    chain.set_next_timestamp(start + 2 * WINDOW)
    chain.mine()
    assert owner.timestamp() == start + 2 * WINDOW

    block, balance = chain.w3.eth.block_number, owner.balance_of(owner.address)
    snapshot = chain.snapshot()
    owner.mint(owner.address, TOKEN)
    assert owner.balance_of(owner.address) == balance + TOKEN
    chain.revert(snapshot)
    assert (chain.w3.eth.block_number, owner.balance_of(owner.address)) == (block, balance)


# --- the launcher -------------------------------------------------------------------------------------


def test_a_missing_hardhat_is_one_chain_error_that_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(ChainError, match=r"hardhat not found in contracts/node_modules: run `make install`"):
        HardhatChain(package=tmp_path / "hardhat").start()
    package = tmp_path / "broken"
    package.mkdir()
    (package / "package.json").write_text('{"name": "hardhat", "bin": {"hardhat": "gone.js"}}')
    with pytest.raises(ChainError, match="has no hardhat command-line script: reinstall with `npm ci`"):
        HardhatChain(package=package).start()
