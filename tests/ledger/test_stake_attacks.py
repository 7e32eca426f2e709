"""Attacks on stake and rewards, each played on a real chain with the Ledger client.

Every test here is an attack the contracts before 274614e let through: a slash took any stake the provider had
(active, then unbonding) and paid it into the invalidating pool's escrow, a lock ended with the membership,
pool terms were unchecked, a record belonged to whichever node submitted it first, and an ejected node's
pending work was still paid. Issue 32 added two: a borderline file was paid, and an owner's ejection voided an
honest member's rewards. Each is played on batches (one Merkle root per batch of files); each docstring names the
attack and the invariant that now stops it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert
from ledger.types import BatchStatus, Reason, StakeLock
from tests.conftest import TOKEN, UNBONDING_PERIOD
from tests.ledger.helpers import (
    assert_revert,
    batch_of,
    commit_batch,
    events,
    make_pool,
    onboard,
    pool_config,
    transact_at,
)

LedgerFor = Callable[[int], Ledger]
OWNER, PROVIDER_A, PROVIDER_B, MALLORY, VALIDATOR = 0, 1, 2, 8, 9
NODE_A, NODE_B, NODE_C = 3, 4, 5
WINDOW = 3600  # helpers.make_pool's default challenge window, and the deployment's minimum
REWARD = 10**15  # helpers.make_pool's default reward per unit
MAX_STAKE = 2**128 - 1
MAX_UNITS = 2**48 - 1


def honest_pool(ledger_for: LedgerFor, escrow_tokens: int = 100, **overrides: object) -> tuple[Ledger, Ledger, int]:
    """(owner, validator, pool id): an honest pool with the VALIDATOR account appointed and funded rewards."""
    owner, validator = ledger_for(OWNER), ledger_for(VALIDATOR)
    pool_id = make_pool(owner, **overrides)
    owner.set_validator(pool_id, validator.address)
    owner.mint(owner.address, escrow_tokens * TOKEN)
    owner.fund_rewards(pool_id, escrow_tokens * TOKEN)
    return owner, validator, pool_id


def slashed_events(ledger: Ledger, receipt: object) -> list[tuple[int, int]]:
    """(poolId, amount) of every registry Slashed event in `receipt`."""
    return [(e["poolId"], e["amount"]) for e in events(ledger.registry.events.Slashed(), receipt)]  # type: ignore[arg-type]


def test_self_slash_in_an_own_pool_does_not_escape_the_honest_pools_slash(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """Attack: provider A's node is in an honest pool H (min stake 100, slash 100) and submits a batch of garbage
    there. Before H's validator acts, A creates its own pool P with the tiniest terms allowed, appoints itself
    validator, joins P with the same node, submits the same batch there and invalidates it in P, hoping the
    self-inflicted slash uses up (or moves into P's escrow) the stake that H would take.

    Invariant: a slash reaches only the lock of the pool whose batch was invalidated and burns it. H's validator
    still takes the full 100 from H's lock; no token moves to any escrow (P's gains nothing); `burned` counts both
    slashes; createPool refuses the terms that would make such a pool cheaper still (min stake 0, a 1 s window, a
    slash above the lock).
    """
    owner, validator, pool_h = honest_pool(ledger_for, min_stake_per_node=100 * TOKEN, slash_amount=100 * TOKEN)
    attacker = ledger_for(PROVIDER_A)
    node = onboard(owner, attacker, dev_account(NODE_A), pool_h, stake_tokens=101)
    garbage, _ = commit_batch(node, pool_h, ("garbage", 1000), ("more garbage", 1000))

    refused = [
        ({"min_stake_per_node": 0, "slash_amount": 1}, "MinStakeOutOfRange", {"minStakePerNode": 0, "max": MAX_STAKE}),
        (
            {"min_stake_per_node": 1, "slash_amount": 1, "challenge_window": 1},
            "ChallengeWindowTooShort",
            {"challengeWindow": 1, "minChallengeWindow": WINDOW},
        ),
        (
            {"min_stake_per_node": 1, "slash_amount": 101 * TOKEN},
            "SlashAmountOutOfRange",
            {"slashAmount": 101 * TOKEN, "minStakePerNode": 1},
        ),
    ]
    for terms, error, values in refused:
        with pytest.raises(ContractRevert) as info:
            attacker.create_pool(pool_config(attacker, **terms))
        assert_revert(info.value, error, **values)
    assert attacker.min_challenge_window() == WINDOW
    pool_p = make_pool(attacker, min_stake_per_node=1, slash_amount=1, challenge_window=WINDOW, reward_per_unit=1)
    attacker.set_validator(pool_p, attacker.address)
    node.join(pool_p)  # locks 1 base unit: 100 tokens + 1 of the 101 staked
    commit_batch(node, pool_p, ("garbage", 1000), ("more garbage", 1000))
    registry_balance, ledger_balance = owner.balance_of(owner.registry.address), owner.balance_of(owner.work.address)

    self_slash = attacker.invalidate_batch(pool_p, node.address, garbage.root, garbage.proof(0), Reason.HASH_MISMATCH)

    assert slashed_events(owner, self_slash) == [(pool_p, 1)]
    assert owner.lock_of(pool_h, node.address) == StakeLock(pool_h, node.address, 100 * TOKEN, 0, True, True)
    assert owner.get_batch(pool_h, node.address, garbage.root).status == BatchStatus.PENDING
    assert owner.escrow_of(pool_p) == 0

    receipt = validator.invalidate_batch(pool_h, node.address, garbage.root, garbage.proof(1), Reason.HASH_MISMATCH)

    assert slashed_events(owner, receipt) == [(pool_h, 100 * TOKEN)]
    (invalidated,) = events(owner.work.events.BatchInvalidated(), receipt)
    assert invalidated["slashed"] == 100 * TOKEN
    assert owner.lock_of(pool_h, node.address).amount == 0
    assert owner.burned() == 100 * TOKEN + 1
    assert (owner.escrow_of(pool_h), owner.escrow_of(pool_p)) == (100 * TOKEN, 0)
    assert owner.balance_of(owner.work.address) == ledger_balance  # no escrow received a token
    assert owner.balance_of(owner.registry.address) == registry_balance  # burned tokens stay in the registry
    assert owner.balance_of(attacker.address) == 0
    assert attacker.stake_of(attacker.address).active == 101 * TOKEN - 100 * TOKEN - 1
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:  # nor does the attacker's own pool pay the node for anything
        attacker.claim_batches(pool_p, node.address, [garbage.root])
    assert_revert(info.value, "NodeEjected", poolId=pool_p, node=node.address)


def test_hostile_pool_owner_takes_at_most_its_own_pools_lock_and_gains_nothing(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """Attack: Mallory creates a pool, baits it with escrow, appoints herself validator and falsely invalidates an
    honest provider's batches there, hoping to seize the provider's whole stake into her pool's escrow.

    Invariant: a slash takes at most the lock in the pool where it happens (slashAmount <= minStakePerNode), and
    burns it. The provider's lock in its other, honest pool and its free stake are untouched; a second false
    invalidation takes nothing more; Mallory and her escrow gain nothing.
    """
    owner, _, pool_h = honest_pool(ledger_for)  # locks 100, slashes 50
    mallory, provider = ledger_for(MALLORY), ledger_for(PROVIDER_B)
    hostile = make_pool(mallory, min_stake_per_node=30 * TOKEN, slash_amount=30 * TOKEN)  # the most it may slash
    mallory.set_validator(hostile, mallory.address)
    owner.mint(mallory.address, 10 * TOKEN)
    mallory.fund_rewards(hostile, 10 * TOKEN)
    node = onboard(owner, provider, dev_account(NODE_B), pool_h, stake_tokens=200)
    node.join(hostile)
    honest_work, _ = commit_batch(node, pool_h, ("honest", 100))
    accused, _ = commit_batch(node, hostile, ("accused", 100))
    accused_again, _ = commit_batch(node, hostile, ("accused-again", 100))
    registry_balance, ledger_balance = owner.balance_of(owner.registry.address), owner.balance_of(owner.work.address)

    first = mallory.invalidate_batch(hostile, node.address, accused.root, accused.proof(0), Reason.PROOF_INVALID)
    second = mallory.invalidate_batch(
        hostile, node.address, accused_again.root, accused_again.proof(0), Reason.PROOF_INVALID
    )

    assert slashed_events(owner, first) == [(hostile, 30 * TOKEN)]
    assert slashed_events(owner, second) == []  # the lock in her pool is spent
    assert [e["slashed"] for e in events(owner.work.events.BatchInvalidated(), second)] == [0]
    assert owner.lock_of(hostile, node.address).amount == 0
    assert owner.lock_of(pool_h, node.address) == StakeLock(pool_h, node.address, 100 * TOKEN, 0, True, True)
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.locked) == (170 * TOKEN, 0, 100 * TOKEN)  # free: 70, as before
    assert owner.balance_of(mallory.address) == 0
    assert owner.escrow_of(hostile) == 10 * TOKEN
    assert owner.balance_of(owner.work.address) == ledger_balance
    assert owner.balance_of(owner.registry.address) == registry_balance
    assert owner.burned() == 30 * TOKEN

    provider.request_unstake(70 * TOKEN)  # the free stake is the provider's to take
    with pytest.raises(ContractRevert) as info:  # Mallory cannot touch the honest pool either
        mallory.eject(pool_h, node.address)
    assert_revert(info.value, "NotAllowedToEject", poolId=pool_h, caller=mallory.address)
    chain.increase_time(WINDOW)
    provider.claim_batches(pool_h, node.address, [honest_work.root])
    assert owner.balance_of(provider.address) == 100 * REWARD


def test_unbonding_and_leaving_before_the_slash_keeps_the_lock_slashable(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """Attack: a provider stakes 1000, locks 100 in a pool (slash 100), requests to unbond the other 900, submits
    a bad batch and has its node leave the pool at once, hoping the stake behind the bad batch is gone (unbonded, or
    freed with the membership) by the time the validator acts.

    Invariant: stake backing an open window cannot be withdrawn. The 900 are withdrawn on time, but the 100 lock
    stays held until one challenge window after the leave: requestUnstake cannot dip below it, `releaseStake` is
    refused (LockHeld) before `releaseAt`, and the validator's invalidation inside the window slashes the full 100
    even though the node left. createPool refuses a slash above the lock (SlashAmountOutOfRange).
    """
    owner, validator, pool_id = honest_pool(
        ledger_for, min_stake_per_node=100 * TOKEN, slash_amount=100 * TOKEN, challenge_window=UNBONDING_PERIOD
    )
    with pytest.raises(ContractRevert) as info:
        make_pool(owner, min_stake_per_node=100 * TOKEN, slash_amount=100 * TOKEN + 1)
    assert_revert(info.value, "SlashAmountOutOfRange", slashAmount=100 * TOKEN + 1, minStakePerNode=100 * TOKEN)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(NODE_A), pool_id, stake_tokens=1000)
    provider.request_unstake(900 * TOKEN)
    unbonded_at = provider.stake_of(provider.address).release_at
    with pytest.raises(ContractRevert) as info:
        provider.request_unstake(1)
    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=100 * TOKEN, required=100 * TOKEN + 1
    )
    bad = batch_of(("bad", 10), ("good", 10))
    submitted_at = provider.timestamp() + 10
    transact_at(
        chain, node, node.work.functions.submitBatch(pool_id, 0, bad.root, bad.count, bad.total_units), submitted_at
    )
    transact_at(chain, node, node.pools.functions.leave(pool_id), submitted_at + 10)
    release_at = submitted_at + 10 + UNBONDING_PERIOD
    assert owner.lock_of(pool_id, node.address) == StakeLock(
        pool_id, node.address, 100 * TOKEN, release_at, False, True
    )
    with pytest.raises(ContractRevert) as info:
        provider.release_stake(pool_id, node.address)
    assert_revert(info.value, "LockHeld", poolId=pool_id, node=node.address, member=False, releaseAt=release_at)

    transact_at(chain, provider, provider.registry.functions.withdraw(), unbonded_at)

    assert provider.balance_of(provider.address) == 900 * TOKEN
    assert provider.stake_of(provider.address).locked == 100 * TOKEN  # still held
    with pytest.raises(ContractRevert) as info:
        provider.request_unstake(1)
    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=100 * TOKEN, required=100 * TOKEN + 1
    )
    with pytest.raises(ContractRevert) as info:
        transact_at(chain, provider, provider.registry.functions.releaseStake(pool_id, node.address), unbonded_at + 1)
    assert_revert(info.value, "LockHeld", poolId=pool_id, node=node.address, member=False, releaseAt=release_at)

    proof = bad.proof(0).as_tuple()
    ref = (0, bad.root)
    call = validator.work.functions.invalidateBatch(pool_id, node.address, ref, proof, int(Reason.STALE_STEP))
    receipt = transact_at(chain, validator, call, submitted_at + UNBONDING_PERIOD - 1)  # the window's last second

    assert slashed_events(owner, receipt) == [(pool_id, 100 * TOKEN)]
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.locked) == (0, 0, 0)
    assert owner.burned() == 100 * TOKEN
    assert owner.balance_of(owner.registry.address) == 100 * TOKEN
    assert owner.escrow_of(pool_id) == 100 * TOKEN

    release = provider.registry.functions.releaseStake(pool_id, node.address)
    with pytest.raises(ContractRevert) as info:
        transact_at(chain, provider, release, release_at - 1)
    assert_revert(info.value, "LockHeld", poolId=pool_id, node=node.address, member=False, releaseAt=release_at)
    receipt = transact_at(chain, provider, release, release_at)
    assert events(owner.registry.events.StakeReleased(), receipt) == [
        {"provider": provider.address, "node": node.address, "poolId": pool_id, "amount": 0}
    ]
    assert not owner.lock_of(pool_id, node.address).open
    provider.remove_node(node.address)  # no open lock is left behind it


def test_claims_after_an_ejection_by_invalidation_are_void(chain: LocalChain, ledger_for: LedgerFor) -> None:
    """Attack: a node spreads 32 files over four batches of eight, one file bad, so that a validator who catches it
    voids one batch only. It is caught and ejected for that batch, but its provider waits out the window and claims
    the other three, which nobody had time to check.

    Invariant: a node ejected by an invalidation is never paid again: claiming any of its batches after the window
    reverts NodeEjected, and the escrow is unchanged. A node that was not ejected is paid as usual, for its own batch
    of the same root too.
    """
    owner, validator, pool_id = honest_pool(ledger_for)
    provider_a, provider_b = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B)
    cheater = onboard(owner, provider_a, dev_account(NODE_A), pool_id)
    honest = onboard(owner, provider_b, dev_account(NODE_C), pool_id)
    trees = [commit_batch(cheater, pool_id, *[(f"file-{8 * b + i}", 10) for i in range(8)])[0] for b in range(4)]
    caught = trees[1]
    honest.submit_batch(pool_id, trees[0].root, trees[0].count, trees[0].total_units)

    validator.invalidate_batch(pool_id, cheater.address, caught.root, caught.proof(5), Reason.PROOF_INVALID)
    chain.increase_time(WINDOW)

    others = [tree.root for tree in trees if tree is not caught]
    for claim in (others[:1], others[2:], others):
        with pytest.raises(ContractRevert) as info:
            provider_a.claim_batches(pool_id, cheater.address, claim)
        assert_revert(info.value, "NodeEjected", poolId=pool_id, node=cheater.address)
    assert owner.escrow_of(pool_id) == 100 * TOKEN
    assert owner.balance_of(provider_a.address) == 0
    assert [owner.get_batch(pool_id, cheater.address, root).status for root in others] == [BatchStatus.PENDING] * 3

    provider_b.claim_batches(pool_id, honest.address, [trees[0].root])
    assert owner.balance_of(provider_b.address) == 80 * REWARD
    assert owner.escrow_of(pool_id) == 100 * TOKEN - 80 * REWARD


def test_an_owners_ejection_does_not_void_an_honest_members_earned_rewards(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """Attack (issue 32, 7): a pool owner ejects an honest member that has a matured, unclaimed batch and a batch
    still in its window, hoping to keep the escrow: before, a claim of any ejected node was refused.

    Invariant: an owner's ejection stops new work only. Every batch the member submitted before is paid after its
    window unless a validator invalidates it (with evidence, inside the window); its lock is held until then, so
    that batch stays slashable. Only an ejection by invalidation voids a node's pending batches.
    """
    owner, _, pool_id = honest_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    member = onboard(owner, provider, dev_account(NODE_A), pool_id)
    matured, _ = commit_batch(member, pool_id, *[(f"matured-{i}", 100) for i in range(3)])
    chain.increase_time(WINDOW)
    recent, _ = commit_batch(member, pool_id, ("recent", 200))

    owner.eject(pool_id, member.address)
    assert owner.lock_of(pool_id, member.address).amount == 100 * TOKEN  # still backing `recent` in its window

    provider.claim_batches(pool_id, member.address, [matured.root])
    chain.increase_time(WINDOW)
    provider.claim_batches(pool_id, member.address, [recent.root])
    assert owner.balance_of(provider.address) == 500 * REWARD
    assert owner.escrow_of(pool_id) == 100 * TOKEN - 500 * REWARD
    provider.release_stake(pool_id, member.address)
    assert owner.stake_of(provider.address).locked == 0


def test_a_borderline_file_is_refused_on_chain_and_never_paid(chain: LocalChain, ledger_for: LedgerFor) -> None:
    """Attack (issue 32, 6): a cheater tunes its files into the band between 1x and 4x a threshold, where the
    validator's verdict is borderline: refused for training but, before, never sent on chain, so a claim paid it
    after the window.

    Invariant: a validator refuses such a file on chain (`refuseLeaf`, with the leaf's proof): its units are never
    paid, and the node is neither slashed nor ejected (the evidence is not clear enough for that). The rest of its
    batch, and its other batches, are paid as usual.
    """
    owner, validator, pool_id = honest_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    cheater = onboard(owner, provider, dev_account(NODE_A), pool_id)
    tree, _ = commit_batch(cheater, pool_id, ("tuned", 1000), ("honest", 10))
    other, _ = commit_batch(cheater, pool_id, ("honest too", 20))

    validator.refuse_leaf(pool_id, cheater.address, tree.root, tree.proof(0), Reason.PROOF_INVALID)
    chain.increase_time(WINDOW)

    provider.claim_batches(pool_id, cheater.address, [tree.root, other.root])
    assert owner.balance_of(provider.address) == 30 * REWARD
    assert owner.escrow_of(pool_id) == 100 * TOKEN - 30 * REWARD
    assert owner.burned() == 0 and owner.is_member(pool_id, cheater.address)


def test_a_squatted_root_neither_blocks_nor_taints_the_honest_record(chain: LocalChain, ledger_for: LedgerFor) -> None:
    """Attack: another member watches the mempool and front-runs an honest node's submitBatch with the same root, so
    that the batch is recorded as its own, with more units: a record that belonged to whichever node came first would
    make the honest submission revert, and give the honest node's files the squatter's reward (or its slash).

    Invariant: a batch record belongs to the node that made it, in that node's own slots: the honest submitBatch still
    succeeds, getBatch(pool, node, slot) names each node's own record, the squatter's record can be invalidated (with
    a proof of one of the honest node's files, which it was never assigned) without touching the honest one, and
    claims are per node.
    """
    owner, validator, pool_id = honest_pool(ledger_for)
    provider_a, provider_b = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B)
    honest = onboard(owner, provider_a, dev_account(NODE_A), pool_id)
    squatter = onboard(owner, provider_b, dev_account(NODE_B), pool_id)
    tree = batch_of(("the honest node's rollout file", 10))

    squatter.submit_batch(pool_id, tree.root, tree.count, 999)  # first in the block
    honest.submit_batch(pool_id, tree.root, tree.count, tree.total_units)

    mine, theirs = (
        owner.get_batch(pool_id, honest.address, tree.root),
        owner.get_batch(pool_id, squatter.address, tree.root),
    )
    assert (mine.provider, mine.total_units, mine.status) == (provider_a.address, 10, BatchStatus.PENDING)
    assert (theirs.provider, theirs.total_units, theirs.status) == (provider_b.address, 999, BatchStatus.PENDING)
    assert owner.get_batch(pool_id, dev_account(NODE_C).address, tree.root).status == BatchStatus.NONE

    validator.invalidate_batch(pool_id, squatter.address, tree.root, tree.proof(0), Reason.WRONG_ASSIGNMENT)

    assert owner.get_batch(pool_id, squatter.address, tree.root).status == BatchStatus.INVALIDATED
    assert owner.get_batch(pool_id, honest.address, tree.root).status == BatchStatus.PENDING
    assert owner.is_member(pool_id, honest.address) and not owner.is_ejected(pool_id, honest.address)
    assert owner.lock_of(pool_id, honest.address).amount == 100 * TOKEN
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:
        provider_b.claim_batches(pool_id, squatter.address, [tree.root])
    assert_revert(info.value, "NodeEjected", poolId=pool_id, node=squatter.address)
    provider_b.claim_batches(
        pool_id, honest.address, [tree.root]
    )  # whoever sends the claim, the honest provider is paid
    assert (owner.balance_of(provider_a.address), owner.balance_of(provider_b.address)) == (10 * REWARD, 0)


def test_one_batch_cannot_claim_more_units_than_its_files_at_the_pools_cap(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """Attack: a node submits one batch claiming a huge number of units (up to the 2^80 a record can hold), so that
    one batch, if it survives the window, drains the pool's escrow.

    Invariant: a batch claims at most its count times the pool's maxUnitsPerKey (0 < cap < 2^48, fixed at
    creation): one unit more reverts UnitsOutOfRange(units, count x cap) and records nothing; at the cap it is
    recorded and paid exactly that.
    """
    owner, _, pool_id = honest_pool(ledger_for, max_units_per_key=1000)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(NODE_A), pool_id)
    fair = batch_of(("fair", 1000), ("fair too", 1000))

    for units in (2001, 2 * MAX_UNITS, 2**80 - 1):
        with pytest.raises(ContractRevert) as info:
            node.submit_batch(pool_id, fair.root, fair.count, units)
        assert_revert(info.value, "UnitsOutOfRange", units=units, max=2000)
    assert owner.get_batch(pool_id, node.address, fair.root).status == BatchStatus.NONE

    node.submit_batch(pool_id, fair.root, fair.count, fair.total_units)
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [fair.root])
    assert owner.escrow_of(pool_id) == 100 * TOKEN - 2000 * REWARD
    for cap in (0, MAX_UNITS + 1):
        with pytest.raises(ContractRevert) as info:
            make_pool(owner, max_units_per_key=cap)
        assert_revert(info.value, "MaxUnitsPerKeyOutOfRange", maxUnitsPerKey=cap, max=MAX_UNITS)
