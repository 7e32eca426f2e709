"""WorkLedger on a real chain: the reward escrow, and what a node's stake, membership and ejection do to its batches.
A slash of one node leaves its provider's other nodes submitting; the batches of a node that left stay slashable from
its held lock and are claimable after their window; an owner's ejection voids nothing, an invalidation everything.
A batch's own rules (its record, each revert of a challenge, refusals, claims) are pinned in test_batches.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert
from ledger.merkle import BatchTree
from ledger.types import BatchStatus, Ejection, Reason, StakeLock
from tests.conftest import TOKEN
from tests.ledger.helpers import (
    assert_revert,
    batch_of,
    commit_batch,
    events,
    fund_provider,
    make_pool,
    onboard,
    work_key,
)

LedgerFor = Callable[[int], Ledger]
OWNER, PROVIDER_A, PROVIDER_B, STRANGER, VALIDATOR = 0, 1, 2, 8, 9
WINDOW = 3600  # helpers.make_pool's default challenge window
REWARD = 10**15  # helpers.make_pool's default reward per unit
SLASH = 50 * TOKEN  # helpers.make_pool's default slash
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"


def funded_pool(ledger_for: LedgerFor, escrow_tokens: int = 100, **overrides: Any) -> tuple[Ledger, Ledger, int]:
    """(owner, validator, pool id): a pool with the VALIDATOR account appointed and `escrow_tokens` of rewards."""
    owner, validator = ledger_for(OWNER), ledger_for(VALIDATOR)
    pool_id = make_pool(owner, **overrides)
    owner.set_validator(pool_id, validator.address)
    if escrow_tokens:
        owner.mint(owner.address, escrow_tokens * TOKEN)
        owner.fund_rewards(pool_id, escrow_tokens * TOKEN)
    return owner, validator, pool_id


def submitted_at(ledger: Ledger, pool_id: int, node: Ledger, tree: BatchTree) -> int:
    return ledger.get_batch(pool_id, node.address, tree.root).submitted_at


# --- funding ----------------------------------------------------------------------------------------


def test_fund_rewards_moves_tokens_into_escrow(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    pool_id = make_pool(owner)
    owner.mint(owner.address, 5 * TOKEN)

    receipt = owner.fund_rewards(pool_id, 5 * TOKEN)

    assert events(owner.work.events.RewardsFunded(), receipt) == [
        {"poolId": pool_id, "funder": owner.address, "amount": 5 * TOKEN}
    ]
    assert owner.escrow_of(pool_id) == 5 * TOKEN
    assert owner.balance_of(owner.work.address) == 5 * TOKEN


@pytest.mark.parametrize(
    ("pool_id", "amount", "error", "values"),
    [
        (1, 0, "ZeroAmount", {}),
        (0, TOKEN, "PoolNotFound", {"poolId": 0}),
        (2, TOKEN, "PoolNotFound", {"poolId": 2}),
    ],
)
def test_fund_rewards_rejects_zero_and_unknown_pools(
    ledger_for: LedgerFor, pool_id: int, amount: int, error: str, values: dict[str, int]
) -> None:
    owner = ledger_for(OWNER)
    make_pool(owner)
    owner.mint(owner.address, TOKEN)
    with pytest.raises(ContractRevert) as info:
        owner.fund_rewards(pool_id, amount)
    assert_revert(info.value, error, **values)
    assert owner.balance_of(owner.work.address) == 0


# --- submitting -------------------------------------------------------------------------------------


def test_get_batch_of_an_unknown_root_is_empty(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    record = owner.get_batch(pool_id, node.address, work_key("never"))
    assert (record.node, record.provider, record.count, record.total_units, record.refused_units) == (
        node.address,
        ZERO_ADDRESS,
        0,
        0,
        0,
    )
    assert (record.submitted_at, record.status) == (0, BatchStatus.NONE)


def test_a_bound_node_that_never_joined_submits_no_batch(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider, node_account = ledger_for(PROVIDER_A), dev_account(3)
    fund_provider(owner, provider, 100)
    provider.add_node(node_account)  # registered, but never joined
    node = provider.as_account(node_account)
    tree = batch_of(("outsider", 10))

    with pytest.raises(ContractRevert) as info:
        node.submit_batch(pool_id, tree.root, tree.count, tree.total_units)

    assert_revert(info.value, "NotPoolMember", poolId=pool_id, node=node.address)
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.NONE


def test_the_same_root_in_another_pool_is_a_separate_batch(ledger_for: LedgerFor) -> None:
    owner, validator, first = funded_pool(ledger_for)
    second = make_pool(owner)
    owner.set_validator(second, validator.address)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), first, stake_tokens=200)
    node.join(second)
    tree, _ = commit_batch(node, first, ("shared-0", 1), ("shared-1", 2))
    node.submit_batch(second, tree.root, tree.count, 7)

    validator.invalidate_batch(second, node.address, tree.root, tree.proof(0), Reason.HASH_MISMATCH)

    in_first, in_second = (
        owner.get_batch(first, node.address, tree.root),
        owner.get_batch(second, node.address, tree.root),
    )
    assert (in_first.total_units, in_first.status) == (3, BatchStatus.PENDING)
    assert (in_second.total_units, in_second.status) == (7, BatchStatus.INVALIDATED)
    assert owner.is_member(first, node.address) and not owner.is_member(second, node.address)
    assert owner.lock_of(first, node.address).amount == 100 * TOKEN


def test_a_slash_of_one_node_leaves_the_providers_other_nodes_submitting(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    # was: a slash could leave the provider's active stake below its locks, and its other nodes were refused
    # (ProviderUndercollateralized). Now a slash takes only the cheater's lock, so the locks always stay covered.
    owner, validator, pool_id = funded_pool(ledger_for, min_stake_per_node=50 * TOKEN, slash_amount=50 * TOKEN)
    provider = ledger_for(PROVIDER_A)
    cheater = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=100)
    honest = onboard(owner, provider, dev_account(4), pool_id, stake_tokens=0)
    bad, _ = commit_batch(cheater, pool_id, ("bad", 10))

    validator.invalidate_batch(pool_id, cheater.address, bad.root, bad.proof(0), Reason.PROOF_INVALID)

    stake = owner.stake_of(provider.address)
    assert (stake.active, stake.locked) == (50 * TOKEN, 50 * TOKEN)  # the honest node's lock, intact
    assert owner.lock_of(pool_id, cheater.address).amount == 0
    assert owner.lock_of(pool_id, honest.address).amount == 50 * TOKEN
    good, _ = commit_batch(honest, pool_id, ("good", 10), ("good-2", 10))
    chain.increase_time(WINDOW)
    provider.claim_batches(pool_id, honest.address, [good.root])
    assert owner.balance_of(provider.address) == 20 * REWARD


# --- invalidation -----------------------------------------------------------------------------------


def test_an_invalidation_burns_the_slash_holds_the_rest_of_the_lock_a_window_and_bars_a_rejoin(
    ledger_for: LedgerFor,
) -> None:
    # was: the slash was paid into the pool's escrow; now it is burned and no escrow changes
    owner, validator, pool_id = funded_pool(ledger_for, escrow_tokens=7)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=150)
    tree, _ = commit_batch(node, pool_id, ("forged", 10), ("fine", 20))
    ledger_balance = owner.balance_of(owner.work.address)
    registry_balance = owner.balance_of(owner.registry.address)

    validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(0), Reason.REWARD_MISMATCH)

    assert owner.escrow_of(pool_id) == 7 * TOKEN
    assert owner.balance_of(owner.work.address) == ledger_balance
    assert owner.balance_of(owner.registry.address) == registry_balance
    assert owner.burned() == SLASH
    stake = owner.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.locked) == (100 * TOKEN, 0, 100 * TOKEN - SLASH)  # the rest, held
    release_at = owner.timestamp() + WINDOW
    held = StakeLock(pool_id, node.address, 100 * TOKEN - SLASH, release_at, member=False, open=True)
    assert owner.lock_of(pool_id, node.address) == held
    assert not owner.is_member(pool_id, node.address)
    assert owner.is_ejected(pool_id, node.address)
    with pytest.raises(ContractRevert) as info:
        node.join(pool_id)
    assert_revert(info.value, "EjectedFromPool", poolId=pool_id, node=node.address)


def test_a_validator_of_another_pool_cannot_challenge_a_batch_here(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    tree, _ = commit_batch(node, pool_id, ("contested", 10), ("beside", 20))
    other_owner, stranger = ledger_for(PROVIDER_B), ledger_for(STRANGER)
    other_pool = make_pool(other_owner)
    other_owner.set_validator(other_pool, stranger.address)  # validates another pool only

    challenges = (
        lambda: stranger.invalidate_batch(pool_id, node.address, tree.root, tree.proof(0), Reason.HASH_MISMATCH),
        lambda: stranger.refuse_leaf(pool_id, node.address, tree.root, tree.proof(0), Reason.HASH_MISMATCH),
        lambda: stranger.invalidate_unavailable_batch(pool_id, node.address, tree.root),
    )
    for challenge in challenges:
        with pytest.raises(ContractRevert) as info:
            challenge()
        assert_revert(info.value, "NotValidator", poolId=pool_id, caller=stranger.address)

    record = owner.get_batch(pool_id, node.address, tree.root)
    assert (record.status, record.refused_units) == (BatchStatus.PENDING, 0)
    assert owner.burned() == 0
    assert owner.is_member(pool_id, node.address)


# --- claims -----------------------------------------------------------------------------------------


def test_a_claim_names_one_node_so_another_nodes_root_is_not_found(chain: LocalChain, ledger_for: LedgerFor) -> None:
    # was MixedProviders: a claim listed keys of any nodes; now it names one node, so it pays one provider
    owner, _, pool_id = funded_pool(ledger_for)
    provider_a, provider_b = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B)
    node_a = onboard(owner, provider_a, dev_account(3), pool_id)
    node_b = onboard(owner, provider_b, dev_account(4), pool_id)
    from_a, _ = commit_batch(node_a, pool_id, ("from-a", 10))
    from_b, _ = commit_batch(node_b, pool_id, ("from-b", 20))
    chain.increase_time(WINDOW)

    with pytest.raises(ContractRevert) as info:
        provider_a.claim_batches(pool_id, node_a.address, [from_a.root, from_b.root], slots=[0, 0])  # B's slot 0

    assert_revert(info.value, "BatchNotFound", poolId=pool_id, node=node_a.address, slot=0, root=from_b.root)
    assert owner.get_batch(pool_id, node_a.address, from_a.root).status == BatchStatus.PENDING
    assert owner.get_batch(pool_id, node_b.address, from_b.root).status == BatchStatus.PENDING
    assert owner.balance_of(provider_a.address) == owner.balance_of(provider_b.address) == 0
    assert owner.escrow_of(pool_id) == 100 * TOKEN

    provider_a.claim_batches(pool_id, node_b.address, [from_b.root])  # whoever sends it, B's node pays B
    assert (owner.balance_of(provider_a.address), owner.balance_of(provider_b.address)) == (0, 20 * REWARD)


def test_a_claim_larger_than_the_escrow_reverts_and_leaves_what_it_covers_claimable(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, _, pool_id = funded_pool(ledger_for, escrow_tokens=1)  # 1 token pays 1000 units
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    first, _ = commit_batch(node, pool_id, ("big-1", 600))
    second, _ = commit_batch(node, pool_id, ("big-2", 401))
    chain.increase_time(WINDOW)

    with pytest.raises(ContractRevert) as info:
        provider.claim_batches(pool_id, node.address, [first.root, second.root])

    assert_revert(info.value, "InsufficientEscrow", poolId=pool_id, needed=1001 * REWARD, available=TOKEN)
    for tree in (first, second):
        assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.PENDING
    assert owner.escrow_of(pool_id) == TOKEN
    assert owner.balance_of(provider.address) == 0

    provider.claim_batches(pool_id, node.address, [first.root])  # what the escrow covers can still be claimed
    assert owner.escrow_of(pool_id) == TOKEN - 600 * REWARD
    assert owner.balance_of(provider.address) == 600 * REWARD
    assert owner.get_batch(pool_id, node.address, second.root).status == BatchStatus.PENDING


# --- a node that left -------------------------------------------------------------------------------


def test_batches_of_a_node_that_left_are_still_slashable_from_its_held_lock(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    bad, _ = commit_batch(node, pool_id, ("left-bad", 10))
    good, _ = commit_batch(node, pool_id, ("left-good", 70))
    node.leave(pool_id)
    with pytest.raises(ContractRevert) as info:  # nor can it retire from the registry while the lock is held
        provider.remove_node(node.address)
    assert_revert(info.value, "NodeInPools", node=node.address, pools=1)

    receipt = validator.invalidate_batch(pool_id, node.address, bad.root, bad.proof(0), Reason.FILE_UNAVAILABLE)

    (invalidated,) = events(owner.work.events.BatchInvalidated(), receipt)
    assert invalidated["slashed"] == SLASH
    assert owner.ejection_of(pool_id, node.address) == Ejection.BY_INVALIDATION
    assert owner.stake_of(provider.address).active == 100 * TOKEN - SLASH
    assert owner.lock_of(pool_id, node.address).amount == 100 * TOKEN - SLASH
    with pytest.raises(ContractRevert) as info:  # its other batch is void with the ejection
        owner.claim_batches(pool_id, node.address, [good.root])
    assert_revert(info.value, "NodeEjected", poolId=pool_id, node=node.address)


def test_batches_of_a_node_that_left_are_claimable_after_their_window(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    good, _ = commit_batch(node, pool_id, ("left-good", 70))
    node.leave(pool_id)
    chain.increase_time(WINDOW)
    provider.release_stake(pool_id, node.address)
    provider.remove_node(node.address)  # even retired from the registry

    owner.claim_batches(pool_id, node.address, [good.root])

    assert owner.balance_of(provider.address) == 70 * REWARD
    record = owner.get_batch(pool_id, node.address, good.root)
    assert (record.status, record.provider) == (BatchStatus.CLAIMED, provider.address)


# --- the two kinds of ejection -------------------------------------------------------------------------


def test_owner_ejected_nodes_earlier_batches_are_claimable_after_their_window(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    matured, _ = commit_batch(node, pool_id, ("matured", 30))
    chain.increase_time(WINDOW)  # `matured` is claimable now; `fresh` is still in its window at the ejection
    fresh, _ = commit_batch(node, pool_id, ("fresh", 40))
    fresh_at = submitted_at(owner, pool_id, node, fresh)

    owner.eject(pool_id, node.address)
    with pytest.raises(ContractRevert) as info:  # it submits no more
        commit_batch(node, pool_id, ("after", 10))
    assert_revert(info.value, "NotPoolMember", poolId=pool_id, node=node.address)
    with pytest.raises(ContractRevert) as info:  # and `fresh` is not claimable before its window closes
        provider.claim_batches(pool_id, node.address, [fresh.root])
    assert_revert(
        info.value,
        "BatchChallengeWindowOpen",
        poolId=pool_id,
        node=node.address,
        root=fresh.root,
        closesAt=fresh_at + WINDOW,
    )
    provider.claim_batches(pool_id, node.address, [matured.root])
    chain.increase_time(WINDOW)
    provider.claim_batches(pool_id, node.address, [fresh.root])

    assert submitted_at(owner, pool_id, node, matured) + WINDOW <= fresh_at
    assert owner.balance_of(provider.address) == 70 * REWARD
    assert owner.escrow_of(pool_id) == 100 * TOKEN - 70 * REWARD
    assert owner.get_batch(pool_id, node.address, fresh.root).status == BatchStatus.CLAIMED


def test_owner_ejected_nodes_pending_batches_stay_slashable_and_an_invalidation_voids_the_rest(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    bad, _ = commit_batch(node, pool_id, ("ejected-bad", 10))
    good, _ = commit_batch(node, pool_id, ("ejected-good", 10))
    owner.eject(pool_id, node.address)
    release_at = owner.timestamp() + WINDOW
    held = StakeLock(pool_id, node.address, 100 * TOKEN, release_at, member=False, open=True)
    assert owner.lock_of(pool_id, node.address) == held  # the lock still backs the batches in their window

    receipt = validator.invalidate_batch(pool_id, node.address, bad.root, bad.proof(0), Reason.PROOF_INVALID)

    (invalidated,) = events(owner.work.events.BatchInvalidated(), receipt)
    assert invalidated["slashed"] == SLASH
    assert events(owner.pools.events.NodeEjected(), receipt) == [
        {"poolId": pool_id, "node": node.address, "by": owner.work.address, "kind": Ejection.BY_INVALIDATION}
    ]
    assert owner.lock_of(pool_id, node.address).amount == 100 * TOKEN - SLASH
    owner.eject(pool_id, node.address)  # the owner cannot turn the invalidation's ejection back into its own
    assert owner.ejection_of(pool_id, node.address) == Ejection.BY_INVALIDATION
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:
        provider.claim_batches(pool_id, node.address, [good.root])
    assert_revert(info.value, "NodeEjected", poolId=pool_id, node=node.address)
