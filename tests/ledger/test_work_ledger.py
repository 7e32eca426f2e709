"""WorkLedger on a real chain: per-node submissions, invalidation (burned) and refusal (no slash) inside the window,
claims after it, and what each kind of ejection does to a node's earlier work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert
from ledger.types import Ejection, Reason, StakeLock, WorkStatus
from tests.conftest import TOKEN
from tests.ledger.helpers import assert_revert, events, fund_provider, make_pool, onboard, transact_at, work_key

LedgerFor = Callable[[int], Ledger]
OWNER, PROVIDER_A, PROVIDER_B, STRANGER, VALIDATOR = 0, 1, 2, 8, 9
WINDOW = 3600  # helpers.make_pool's default challenge window
REWARD = 10**15  # helpers.make_pool's default reward per unit
SLASH = 50 * TOKEN  # helpers.make_pool's default slash
CAP = 1_000_000  # PoolConfig's default maxUnitsPerKey
MAX_UNITS = 2**48 - 1  # the largest cap a pool may set
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


def submitted(node: Ledger, pool_id: int, label: str, units: int = 10) -> tuple[bytes, int]:
    """Submits work `label` from `node` and returns (its key, its submittedAt)."""
    key = work_key(label)
    node.submit_work(pool_id, key, units)
    return key, node.get_work(pool_id, node.address, key).submitted_at


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


def test_submit_work_records_pending_work_and_emits_work_submitted(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key = work_key("rollout-0")

    receipt = node.submit_work(pool_id, key, 1234)

    assert events(owner.work.events.WorkSubmitted(), receipt) == [
        {"poolId": pool_id, "workKey": key, "node": node.address, "provider": provider.address, "units": 1234}
    ]
    work = owner.get_work(pool_id, node.address, key)
    block_time = owner.w3.eth.get_block(receipt["blockNumber"])["timestamp"]
    assert (work.pool_id, work.work_key, work.node, work.provider) == (pool_id, key, node.address, provider.address)
    assert (work.units, work.submitted_at, work.status) == (1234, block_time, WorkStatus.PENDING)


def test_get_work_of_unknown_key_is_empty(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    work = owner.get_work(pool_id, node.address, work_key("never"))
    assert (work.node, work.provider, work.units, work.submitted_at) == (node.address, ZERO_ADDRESS, 0, 0)
    assert work.status == WorkStatus.NONE


def test_submit_by_non_member_reverts_not_pool_member(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider, node_account = ledger_for(PROVIDER_A), dev_account(3)
    fund_provider(owner, provider, 100)
    provider.add_node(node_account)  # registered, but never joined
    key = work_key("outsider")

    for sender in (provider.as_account(node_account), provider, ledger_for(STRANGER)):
        with pytest.raises(ContractRevert) as info:
            sender.submit_work(pool_id, key, 10)
        assert_revert(info.value, "NotPoolMember", poolId=pool_id, node=sender.address)
        assert owner.get_work(pool_id, sender.address, key).status == WorkStatus.NONE


def test_submit_duplicate_key_reverts_work_exists(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    key, submitted_at = submitted(node, pool_id, "once")

    with pytest.raises(ContractRevert) as info:
        node.submit_work(pool_id, key, 99)

    assert_revert(info.value, "WorkExists", poolId=pool_id, node=node.address, workKey=key)
    work = owner.get_work(pool_id, node.address, key)
    assert (work.node, work.units, work.submitted_at) == (node.address, 10, submitted_at)


def test_same_key_from_another_node_is_its_own_record(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider_a, provider_b = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B)
    node_a = onboard(owner, provider_a, dev_account(3), pool_id)
    node_b = onboard(owner, provider_b, dev_account(4), pool_id)
    key, _ = submitted(node_a, pool_id, "shared", units=10)

    node_b.submit_work(pool_id, key, 99)  # no member can take another's key

    record_a, record_b = owner.get_work(pool_id, node_a.address, key), owner.get_work(pool_id, node_b.address, key)
    assert (record_a.provider, record_a.units, record_a.status) == (provider_a.address, 10, WorkStatus.PENDING)
    assert (record_b.provider, record_b.units, record_b.status) == (provider_b.address, 99, WorkStatus.PENDING)


def test_same_key_in_another_pool_is_separate_work(ledger_for: LedgerFor) -> None:
    owner, _, first = funded_pool(ledger_for)
    second = make_pool(owner)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), first, stake_tokens=200)
    node.join(second)
    key = work_key("shared")

    node.submit_work(first, key, 1)
    node.submit_work(second, key, 2)

    assert (owner.get_work(first, node.address, key).units, owner.get_work(second, node.address, key).units) == (1, 2)


def test_duplicate_key_inside_one_batch_reverts_work_exists(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    first, repeated = work_key("a"), work_key("b")

    with pytest.raises(ContractRevert) as info:
        node.submit_work_batch(pool_id, [first, repeated, repeated], [1, 2, 3])

    assert_revert(info.value, "WorkExists", poolId=pool_id, node=node.address, workKey=repeated)
    assert owner.get_work(pool_id, node.address, first).status == WorkStatus.NONE  # the whole batch reverted
    assert owner.get_work(pool_id, node.address, repeated).status == WorkStatus.NONE


def test_batch_with_already_submitted_key_reverts_work_exists(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    old, _ = submitted(node, pool_id, "old")

    with pytest.raises(ContractRevert) as info:
        node.submit_work_batch(pool_id, [work_key("new"), old], [1, 2])

    assert_revert(info.value, "WorkExists", poolId=pool_id, node=node.address, workKey=old)
    assert owner.get_work(pool_id, node.address, work_key("new")).status == WorkStatus.NONE


@pytest.mark.parametrize("units", [0, CAP + 1, 2**48, 2**256 - 1])
def test_units_out_of_range_revert(ledger_for: LedgerFor, units: int) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    key = work_key("units")

    with pytest.raises(ContractRevert) as info:
        node.submit_work(pool_id, key, units)
    assert_revert(info.value, "UnitsOutOfRange", units=units, max=CAP)

    with pytest.raises(ContractRevert) as info:
        node.submit_work_batch(pool_id, [work_key("ok"), key], [1, units])
    assert_revert(info.value, "UnitsOutOfRange", units=units, max=CAP)
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.NONE
    assert owner.get_work(pool_id, node.address, work_key("ok")).status == WorkStatus.NONE


def test_units_at_the_pools_cap_are_accepted(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    key, _ = submitted(node, pool_id, "cap", units=CAP)
    assert owner.get_work(pool_id, node.address, key).units == CAP


def test_largest_units_value_is_stored_exactly(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for, max_units_per_key=MAX_UNITS)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, submitted_at = submitted(node, pool_id, "max", units=MAX_UNITS)
    work = owner.get_work(pool_id, node.address, key)
    # the record is packed into one slot by hand; neighbouring fields must survive the largest units
    assert (work.provider, work.units, work.submitted_at, work.status) == (
        provider.address,
        MAX_UNITS,
        submitted_at,
        WorkStatus.PENDING,
    )
    with pytest.raises(ContractRevert) as info:
        node.submit_work(pool_id, work_key("over"), MAX_UNITS + 1)
    assert_revert(info.value, "UnitsOutOfRange", units=MAX_UNITS + 1, max=MAX_UNITS)


def test_batch_length_mismatch_reverts(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    keys = [work_key("x"), work_key("y")]

    with pytest.raises(ContractRevert) as info:
        node.submit_work_batch(pool_id, keys, [1])
    assert_revert(info.value, "LengthMismatch", workKeys=2, units=1)

    with pytest.raises(ContractRevert) as info:
        node.submit_work_batch(pool_id, keys[:1], [1, 2])
    assert_revert(info.value, "LengthMismatch", workKeys=1, units=2)
    assert owner.get_work(pool_id, node.address, keys[0]).status == WorkStatus.NONE


def test_empty_batch_reverts(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    with pytest.raises(ContractRevert) as info:
        node.submit_work_batch(pool_id, [], [])
    assert_revert(info.value, "EmptyBatch")
    assert owner.get_work(pool_id, node.address, b"\x00" * 32).status == WorkStatus.NONE


def test_batch_submit_records_every_key_and_emits_one_event(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    keys = [work_key(f"batch-{i}") for i in range(5)]
    units = [1, 20, 300, 4000, CAP]

    receipt = node.submit_work_batch(pool_id, keys, units)

    assert events(owner.work.events.WorkBatchSubmitted(), receipt) == [
        {"poolId": pool_id, "node": node.address, "provider": provider.address, "workKeys": keys, "units": units}
    ]
    assert events(owner.work.events.WorkSubmitted(), receipt) == []
    block_time = owner.w3.eth.get_block(receipt["blockNumber"])["timestamp"]
    for key, amount in zip(keys, units, strict=True):
        work = owner.get_work(pool_id, node.address, key)
        assert (work.node, work.provider, work.units) == (node.address, provider.address, amount)
        assert (work.submitted_at, work.status) == (block_time, WorkStatus.PENDING)


def test_a_slash_of_one_node_leaves_the_providers_other_nodes_submitting(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    # was: a slash could leave the provider's active stake below its locks, and its other nodes were refused
    # (ProviderUndercollateralized). Now a slash takes only the cheater's lock, so the locks always stay covered.
    owner, validator, pool_id = funded_pool(ledger_for, min_stake_per_node=50 * TOKEN, slash_amount=50 * TOKEN)
    provider = ledger_for(PROVIDER_A)
    cheater = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=100)
    honest = onboard(owner, provider, dev_account(4), pool_id, stake_tokens=0)
    key, _ = submitted(cheater, pool_id, "bad")

    validator.invalidate_work(pool_id, cheater.address, key, Reason.PROOF_INVALID)

    stake = owner.stake_of(provider.address)
    assert (stake.active, stake.locked) == (50 * TOKEN, 50 * TOKEN)  # the honest node's lock, intact
    assert owner.lock_of(pool_id, cheater.address).amount == 0
    assert owner.lock_of(pool_id, honest.address).amount == 50 * TOKEN
    good, _ = submitted(honest, pool_id, "good")
    honest.submit_work_batch(pool_id, [work_key("good-2")], [10])
    chain.increase_time(WINDOW)
    provider.claim_rewards(pool_id, honest.address, [good, work_key("good-2")])
    assert owner.balance_of(provider.address) == 20 * REWARD


# --- invalidation -----------------------------------------------------------------------------------


def test_invalidation_burns_the_slash_ejects_node_and_emits(ledger_for: LedgerFor) -> None:
    # was: the slash was paid into the pool's escrow; now it is burned and no escrow changes
    owner, validator, pool_id = funded_pool(ledger_for, escrow_tokens=7)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=150)
    key, _ = submitted(node, pool_id, "forged")
    ledger_balance = owner.balance_of(owner.work.address)
    registry_balance = owner.balance_of(owner.registry.address)

    receipt = validator.invalidate_work(pool_id, node.address, key, Reason.REWARD_MISMATCH)

    assert events(owner.work.events.WorkInvalidated(), receipt) == [
        {
            "poolId": pool_id,
            "workKey": key,
            "node": node.address,
            "validator": validator.address,
            "reason": 6,
            "slashed": SLASH,
        }
    ]
    assert events(owner.registry.events.Slashed(), receipt) == [
        {"provider": provider.address, "node": node.address, "poolId": pool_id, "amount": SLASH}
    ]
    assert events(owner.pools.events.NodeEjected(), receipt) == [
        {"poolId": pool_id, "node": node.address, "by": owner.work.address, "kind": Ejection.BY_INVALIDATION}
    ]
    assert owner.escrow_of(pool_id) == 7 * TOKEN
    assert owner.balance_of(owner.work.address) == ledger_balance
    assert owner.balance_of(owner.registry.address) == registry_balance
    assert owner.burned() == SLASH
    stake = owner.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.locked) == (100 * TOKEN, 0, 100 * TOKEN - SLASH)  # the rest, held
    release_at = owner.timestamp() + WINDOW
    held = StakeLock(pool_id, node.address, 100 * TOKEN - SLASH, release_at, member=False, open=True)
    assert owner.lock_of(pool_id, node.address) == held
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.INVALIDATED
    assert not owner.is_member(pool_id, node.address)
    assert owner.is_ejected(pool_id, node.address)
    with pytest.raises(ContractRevert) as info:
        node.join(pool_id)
    assert_revert(info.value, "EjectedFromPool", poolId=pool_id, node=node.address)


def test_invalidate_by_non_validator_reverts_not_validator(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, _ = submitted(node, pool_id, "contested")
    other_pool = make_pool(ledger_for(PROVIDER_B))
    ledger_for(PROVIDER_B).set_validator(other_pool, ledger_for(STRANGER).address)  # validates another pool only
    owner.set_validator(pool_id, validator.address, allowed=False)  # a dismissed validator

    for caller in (owner, provider, node, ledger_for(STRANGER), validator):
        with pytest.raises(ContractRevert) as info:
            caller.invalidate_work(pool_id, node.address, key, Reason.HASH_MISMATCH)
        assert_revert(info.value, "NotValidator", poolId=pool_id, caller=caller.address)

    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.PENDING
    assert owner.stake_of(provider.address).active == 100 * TOKEN
    assert owner.is_member(pool_id, node.address)


def test_invalidate_at_last_second_of_window_succeeds(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    key, submitted_at = submitted(node, pool_id, "late")

    call = validator.work.functions.invalidateWork(pool_id, node.address, key, int(Reason.STALE_STEP))
    transact_at(chain, validator, call, submitted_at + WINDOW - 1)

    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.INVALIDATED
    assert owner.burned() == SLASH
    assert owner.escrow_of(pool_id) == 100 * TOKEN


def test_invalidate_at_window_end_reverts_challenge_window_closed(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, submitted_at = submitted(node, pool_id, "too-late")

    call = validator.work.functions.invalidateWork(pool_id, node.address, key, int(Reason.STALE_STEP))
    with pytest.raises(ContractRevert) as info:
        transact_at(chain, validator, call, submitted_at + WINDOW)

    assert_revert(
        info.value,
        "ChallengeWindowClosed",
        poolId=pool_id,
        node=node.address,
        workKey=key,
        closedAt=submitted_at + WINDOW,
    )
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.PENDING
    assert owner.stake_of(provider.address).active == 100 * TOKEN
    assert owner.escrow_of(pool_id) == 100 * TOKEN
    assert owner.is_member(pool_id, node.address)


def test_invalidate_twice_reverts_work_not_pending(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=200)
    key, _ = submitted(node, pool_id, "twice")
    validator.invalidate_work(pool_id, node.address, key, Reason.HASH_MISMATCH)

    with pytest.raises(ContractRevert) as info:
        validator.invalidate_work(pool_id, node.address, key, Reason.HASH_MISMATCH)

    assert_revert(
        info.value, "WorkNotPending", poolId=pool_id, node=node.address, workKey=key, status=WorkStatus.INVALIDATED
    )
    assert owner.stake_of(provider.address).active == 200 * TOKEN - SLASH  # slashed once only
    assert owner.burned() == SLASH
    assert owner.escrow_of(pool_id) == 100 * TOKEN


@pytest.mark.parametrize("reason", [0, max(Reason) + 1])
def test_invalidate_with_unknown_reason_reverts_invalid_reason(ledger_for: LedgerFor, reason: int) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    key, _ = submitted(node, pool_id, "no-reason")

    with pytest.raises(ContractRevert) as info:
        validator.invalidate_work(pool_id, node.address, key, reason)

    assert_revert(info.value, "InvalidReason", reason=reason)
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.PENDING


def test_invalidate_unknown_work_reverts_work_not_found(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    other = onboard(owner, ledger_for(PROVIDER_B), dev_account(4), pool_id)
    key, _ = submitted(other, pool_id, "ghost")  # another node's key is not this node's work
    with pytest.raises(ContractRevert) as info:
        validator.invalidate_work(pool_id, node.address, key, Reason.HASH_MISMATCH)
    assert_revert(info.value, "WorkNotFound", poolId=pool_id, node=node.address, workKey=key)
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.NONE
    assert owner.get_work(pool_id, other.address, key).status == WorkStatus.PENDING
    assert owner.is_member(pool_id, node.address)
    assert owner.burned() == 0


# --- claims -----------------------------------------------------------------------------------------


def test_claim_one_second_before_window_end_reverts_challenge_window_open(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, submitted_at = submitted(node, pool_id, "early")

    call = provider.work.functions.claimRewards(pool_id, node.address, [key])
    with pytest.raises(ContractRevert) as info:
        transact_at(chain, provider, call, submitted_at + WINDOW - 1)

    assert_revert(
        info.value,
        "ChallengeWindowOpen",
        poolId=pool_id,
        node=node.address,
        workKey=key,
        closesAt=submitted_at + WINDOW,
    )
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.PENDING
    assert owner.escrow_of(pool_id) == 100 * TOKEN
    assert owner.balance_of(provider.address) == 0


def test_claim_at_window_end_pays_provider_not_node(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, submitted_at = submitted(node, pool_id, "paid", units=1500)
    claimer = ledger_for(STRANGER)  # anyone may trigger the claim; the tokens still go to the provider

    call = claimer.work.functions.claimRewards(pool_id, node.address, [key])
    receipt = transact_at(chain, claimer, call, submitted_at + WINDOW)

    amount = 1500 * REWARD
    assert events(owner.work.events.RewardsClaimed(), receipt) == [
        {"poolId": pool_id, "provider": provider.address, "node": node.address, "amount": amount, "count": 1}
    ]
    assert owner.balance_of(provider.address) == amount
    assert owner.balance_of(node.address) == 0
    assert owner.balance_of(claimer.address) == 0
    assert owner.escrow_of(pool_id) == 100 * TOKEN - amount
    assert owner.balance_of(owner.work.address) == 100 * TOKEN - amount
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.CLAIMED


def test_claim_of_several_works_pays_their_sum_once(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node_1 = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=200)
    node_2 = onboard(owner, provider, dev_account(4), pool_id, stake_tokens=0)
    keys = [work_key("w1"), work_key("w2"), work_key("w3")]
    node_1.submit_work_batch(pool_id, keys, [10, 20, 30])
    node_2.submit_work(pool_id, keys[0], 40)  # the same key from the provider's other node: its own record
    chain.increase_time(WINDOW)

    receipt = provider.claim_rewards(pool_id, node_1.address, keys)

    (claimed,) = events(owner.work.events.RewardsClaimed(), receipt)
    assert (claimed["node"], claimed["amount"], claimed["count"]) == (node_1.address, 60 * REWARD, 3)
    assert owner.balance_of(provider.address) == 60 * REWARD
    assert all(owner.get_work(pool_id, node_1.address, key).status == WorkStatus.CLAIMED for key in keys)
    assert owner.get_work(pool_id, node_2.address, keys[0]).status == WorkStatus.PENDING
    provider.claim_rewards(pool_id, node_2.address, keys[:1])
    assert owner.balance_of(provider.address) == 100 * REWARD


def test_claim_twice_reverts_work_not_pending(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, _ = submitted(node, pool_id, "claimed")
    chain.increase_time(WINDOW)
    provider.claim_rewards(pool_id, node.address, [key])

    with pytest.raises(ContractRevert) as info:
        provider.claim_rewards(pool_id, node.address, [key])
    assert_revert(
        info.value, "WorkNotPending", poolId=pool_id, node=node.address, workKey=key, status=WorkStatus.CLAIMED
    )

    fresh, _ = submitted(node, pool_id, "fresh")
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:  # the same key twice in one claim
        provider.claim_rewards(pool_id, node.address, [fresh, fresh])
    assert_revert(
        info.value, "WorkNotPending", poolId=pool_id, node=node.address, workKey=fresh, status=WorkStatus.CLAIMED
    )

    assert owner.balance_of(provider.address) == 10 * REWARD  # paid once
    assert owner.get_work(pool_id, node.address, fresh).status == WorkStatus.PENDING


def test_claim_after_invalidation_reverts_node_ejected(chain: LocalChain, ledger_for: LedgerFor) -> None:
    # was WorkNotPending for the invalidated key only; now the ejection voids every pending work of the node
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, _ = submitted(node, pool_id, "rejected")
    other, _ = submitted(node, pool_id, "other")
    validator.invalidate_work(pool_id, node.address, key, Reason.WRONG_ASSIGNMENT)
    chain.increase_time(WINDOW)

    for keys in ([key], [other], [other, key]):
        with pytest.raises(ContractRevert) as info:
            provider.claim_rewards(pool_id, node.address, keys)
        assert_revert(info.value, "NodeEjected", poolId=pool_id, node=node.address)

    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.INVALIDATED
    assert owner.get_work(pool_id, node.address, other).status == WorkStatus.PENDING
    assert owner.balance_of(provider.address) == 0
    assert owner.escrow_of(pool_id) == 100 * TOKEN


def test_claim_unknown_or_empty_reverts(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = dev_account(3).address
    key = work_key("ghost")
    with pytest.raises(ContractRevert) as info:
        owner.claim_rewards(pool_id, node, [key])
    assert_revert(info.value, "WorkNotFound", poolId=pool_id, node=node, workKey=key)
    with pytest.raises(ContractRevert) as info:
        owner.claim_rewards(pool_id, node, [])
    assert_revert(info.value, "EmptyBatch")
    assert owner.escrow_of(pool_id) == 100 * TOKEN


def test_claim_names_one_node_so_another_nodes_key_is_not_found(chain: LocalChain, ledger_for: LedgerFor) -> None:
    # was MixedProviders: a claim listed keys of any nodes; now it names one node, so it pays one provider
    owner, _, pool_id = funded_pool(ledger_for)
    provider_a, provider_b = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B)
    node_a = onboard(owner, provider_a, dev_account(3), pool_id)
    node_b = onboard(owner, provider_b, dev_account(4), pool_id)
    key_a, _ = submitted(node_a, pool_id, "from-a")
    key_b, _ = submitted(node_b, pool_id, "from-b", units=20)
    chain.increase_time(WINDOW)

    with pytest.raises(ContractRevert) as info:
        provider_a.claim_rewards(pool_id, node_a.address, [key_a, key_b])

    assert_revert(info.value, "WorkNotFound", poolId=pool_id, node=node_a.address, workKey=key_b)
    assert owner.get_work(pool_id, node_a.address, key_a).status == WorkStatus.PENDING
    assert owner.get_work(pool_id, node_b.address, key_b).status == WorkStatus.PENDING
    assert owner.balance_of(provider_a.address) == owner.balance_of(provider_b.address) == 0
    assert owner.escrow_of(pool_id) == 100 * TOKEN

    provider_a.claim_rewards(pool_id, node_b.address, [key_b])  # whoever sends it, B's node pays B
    assert (owner.balance_of(provider_a.address), owner.balance_of(provider_b.address)) == (0, 20 * REWARD)


def test_claim_larger_than_escrow_reverts_and_leaves_work_pending(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for, escrow_tokens=1)  # 1 token pays 1000 units
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    keys = [work_key("big-1"), work_key("big-2")]
    node.submit_work_batch(pool_id, keys, [600, 401])
    chain.increase_time(WINDOW)

    with pytest.raises(ContractRevert) as info:
        provider.claim_rewards(pool_id, node.address, keys)

    assert_revert(info.value, "InsufficientEscrow", poolId=pool_id, needed=1001 * REWARD, available=TOKEN)
    assert all(owner.get_work(pool_id, node.address, key).status == WorkStatus.PENDING for key in keys)
    assert owner.escrow_of(pool_id) == TOKEN
    assert owner.balance_of(provider.address) == 0

    provider.claim_rewards(pool_id, node.address, keys[:1])  # what the escrow covers can still be claimed
    assert owner.escrow_of(pool_id) == TOKEN - 600 * REWARD


def test_work_of_a_node_that_left_is_still_slashable_from_its_held_lock(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    bad, _ = submitted(node, pool_id, "left-bad")
    good, _ = submitted(node, pool_id, "left-good", units=70)
    node.leave(pool_id)
    with pytest.raises(ContractRevert) as info:  # nor can it retire from the registry while the lock is held
        provider.remove_node(node.address)
    assert_revert(info.value, "NodeInPools", node=node.address, pools=1)

    receipt = validator.invalidate_work(pool_id, node.address, bad, Reason.FILE_UNAVAILABLE)

    (invalidated,) = events(owner.work.events.WorkInvalidated(), receipt)
    assert invalidated["slashed"] == SLASH
    assert owner.is_ejected(pool_id, node.address)
    assert owner.stake_of(provider.address).active == 100 * TOKEN - SLASH
    assert owner.lock_of(pool_id, node.address).amount == 100 * TOKEN - SLASH
    with pytest.raises(ContractRevert) as info:  # its other work is void with the ejection
        owner.claim_rewards(pool_id, node.address, [good])
    assert_revert(info.value, "NodeEjected", poolId=pool_id, node=node.address)


def test_work_of_a_node_that_left_is_claimable_after_its_window(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    good, _ = submitted(node, pool_id, "left-good", units=70)
    node.leave(pool_id)
    chain.increase_time(WINDOW)
    provider.release_stake(pool_id, node.address)
    provider.remove_node(node.address)  # even retired from the registry

    owner.claim_rewards(pool_id, node.address, [good])

    assert owner.balance_of(provider.address) == 70 * REWARD
    record = owner.get_work(pool_id, node.address, good)
    assert (record.status, record.provider) == (WorkStatus.CLAIMED, provider.address)


# --- refusal: voided without a slash --------------------------------------------------------------------


def test_refuse_work_voids_it_without_a_slash_or_an_ejection_and_emits(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, _ = submitted(node, pool_id, "borderline")
    fine, _ = submitted(node, pool_id, "fine", units=20)

    receipt = validator.refuse_work(pool_id, node.address, key, Reason.PROOF_INVALID)

    assert events(owner.work.events.WorkRefused(), receipt) == [
        {"poolId": pool_id, "workKey": key, "node": node.address, "validator": validator.address, "reason": 7}
    ]
    assert events(owner.registry.events.Slashed(), receipt) == []
    assert events(owner.pools.events.NodeEjected(), receipt) == []
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.REFUSED
    assert owner.is_member(pool_id, node.address) and owner.ejection_of(pool_id, node.address) == Ejection.NONE
    assert owner.burned() == 0
    assert owner.lock_of(pool_id, node.address) == StakeLock(pool_id, node.address, 100 * TOKEN, 0, True, True)
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:  # never paid
        provider.claim_rewards(pool_id, node.address, [fine, key])
    assert_revert(info.value, "WorkNotPending", poolId=pool_id, node=node.address, workKey=key, status=4)
    provider.claim_rewards(pool_id, node.address, [fine])  # the node's other work is paid as usual
    assert owner.balance_of(provider.address) == 20 * REWARD
    assert owner.escrow_of(pool_id) == 100 * TOKEN - 20 * REWARD


def test_refuse_by_non_validator_reverts_not_validator(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, _ = submitted(node, pool_id, "contested")
    owner.set_validator(pool_id, validator.address, allowed=False)

    for caller in (owner, provider, node, ledger_for(STRANGER), validator):
        with pytest.raises(ContractRevert) as info:
            caller.refuse_work(pool_id, node.address, key, Reason.PROOF_INVALID)
        assert_revert(info.value, "NotValidator", poolId=pool_id, caller=caller.address)

    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.PENDING


def test_refuse_only_inside_the_challenge_window(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    late, late_at = submitted(node, pool_id, "refused-late")
    last, last_at = submitted(node, pool_id, "refused-last")

    call = validator.work.functions.refuseWork(pool_id, node.address, last, int(Reason.PROOF_INVALID))
    transact_at(chain, validator, call, last_at + WINDOW - 1)
    call = validator.work.functions.refuseWork(pool_id, node.address, late, int(Reason.PROOF_INVALID))
    with pytest.raises(ContractRevert) as info:
        transact_at(chain, validator, call, late_at + WINDOW)

    assert_revert(
        info.value, "ChallengeWindowClosed", poolId=pool_id, node=node.address, workKey=late, closedAt=late_at + WINDOW
    )
    assert owner.get_work(pool_id, node.address, last).status == WorkStatus.REFUSED
    assert owner.get_work(pool_id, node.address, late).status == WorkStatus.PENDING


@pytest.mark.parametrize("reason", [0, max(Reason) + 1])
def test_refuse_with_unknown_reason_or_work_reverts(ledger_for: LedgerFor, reason: int) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    key, _ = submitted(node, pool_id, "odd-reason")
    with pytest.raises(ContractRevert) as info:
        validator.refuse_work(pool_id, node.address, key, reason)
    assert_revert(info.value, "InvalidReason", reason=reason)
    with pytest.raises(ContractRevert) as info:
        validator.refuse_work(pool_id, node.address, work_key("never"), Reason.PROOF_INVALID)
    assert_revert(info.value, "WorkNotFound", poolId=pool_id, node=node.address, workKey=work_key("never"))


def test_refuse_is_once_and_never_after_a_verdict(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=200)
    refused, _ = submitted(node, pool_id, "refused")
    validator.refuse_work(pool_id, node.address, refused, Reason.PROOF_INVALID)
    with pytest.raises(ContractRevert) as info:
        validator.refuse_work(pool_id, node.address, refused, Reason.PROOF_INVALID)
    assert_revert(info.value, "WorkNotPending", poolId=pool_id, node=node.address, workKey=refused, status=4)

    claimed, _ = submitted(node, pool_id, "claimed")
    chain.increase_time(WINDOW)
    provider.claim_rewards(pool_id, node.address, [claimed])
    with pytest.raises(ContractRevert) as info:
        validator.refuse_work(pool_id, node.address, claimed, Reason.PROOF_INVALID)
    assert_revert(info.value, "WorkNotPending", poolId=pool_id, node=node.address, workKey=claimed, status=3)

    bad, _ = submitted(node, pool_id, "bad")
    validator.invalidate_work(pool_id, node.address, bad, Reason.HASH_MISMATCH)
    with pytest.raises(ContractRevert) as info:  # an invalidation is never softened into a refusal
        validator.refuse_work(pool_id, node.address, bad, Reason.PROOF_INVALID)
    assert_revert(info.value, "WorkNotPending", poolId=pool_id, node=node.address, workKey=bad, status=2)
    assert owner.burned() == SLASH


def test_refused_work_may_still_be_invalidated_inside_its_window(chain: LocalChain, ledger_for: LedgerFor) -> None:
    """A refusal does not shield a cheater: a validator that later finds the file clearly bad still slashes it."""
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    key, submitted_at = submitted(node, pool_id, "refused-then-bad")
    too_late, too_late_at = submitted(node, pool_id, "refused-then-closed")
    validator.refuse_work(pool_id, node.address, key, Reason.PROOF_INVALID)
    validator.refuse_work(pool_id, node.address, too_late, Reason.PROOF_INVALID)

    call = validator.work.functions.invalidateWork(pool_id, node.address, key, int(Reason.PROOF_INVALID))
    receipt = transact_at(chain, validator, call, submitted_at + WINDOW - 1)

    (invalidated,) = events(owner.work.events.WorkInvalidated(), receipt)
    assert invalidated["slashed"] == SLASH
    assert owner.get_work(pool_id, node.address, key).status == WorkStatus.INVALIDATED
    assert owner.ejection_of(pool_id, node.address) == Ejection.BY_INVALIDATION
    call = validator.work.functions.invalidateWork(pool_id, node.address, too_late, int(Reason.PROOF_INVALID))
    with pytest.raises(ContractRevert) as info:  # past its window a refusal is final
        transact_at(chain, validator, call, too_late_at + WINDOW)
    assert_revert(
        info.value,
        "ChallengeWindowClosed",
        poolId=pool_id,
        node=node.address,
        workKey=too_late,
        closedAt=too_late_at + WINDOW,
    )
    assert owner.get_work(pool_id, node.address, too_late).status == WorkStatus.REFUSED


# --- the two kinds of ejection -------------------------------------------------------------------------


def test_owner_ejected_nodes_earlier_work_is_claimable_after_its_window(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    matured, matured_at = submitted(node, pool_id, "matured", units=30)
    chain.increase_time(WINDOW)  # `matured` is claimable now; `fresh` is still in its window at the ejection
    fresh, fresh_at = submitted(node, pool_id, "fresh", units=40)

    owner.eject(pool_id, node.address)
    with pytest.raises(ContractRevert) as info:  # it submits no more
        node.submit_work(pool_id, work_key("after"), 10)
    assert_revert(info.value, "NotPoolMember", poolId=pool_id, node=node.address)
    with pytest.raises(ContractRevert) as info:  # and `fresh` is not claimable before its window closes
        provider.claim_rewards(pool_id, node.address, [fresh])
    assert_revert(
        info.value, "ChallengeWindowOpen", poolId=pool_id, node=node.address, workKey=fresh, closesAt=fresh_at + WINDOW
    )
    provider.claim_rewards(pool_id, node.address, [matured])
    chain.increase_time(WINDOW)
    provider.claim_rewards(pool_id, node.address, [fresh])

    assert matured_at + WINDOW <= fresh_at
    assert owner.balance_of(provider.address) == 70 * REWARD
    assert owner.escrow_of(pool_id) == 100 * TOKEN - 70 * REWARD
    assert owner.get_work(pool_id, node.address, fresh).status == WorkStatus.CLAIMED


def test_owner_ejected_nodes_pending_work_stays_slashable_and_an_invalidation_voids_the_rest(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    bad, _ = submitted(node, pool_id, "ejected-bad")
    good, _ = submitted(node, pool_id, "ejected-good")
    owner.eject(pool_id, node.address)
    release_at = owner.timestamp() + WINDOW
    held = StakeLock(pool_id, node.address, 100 * TOKEN, release_at, member=False, open=True)
    assert owner.lock_of(pool_id, node.address) == held  # the lock still backs the work in its window

    receipt = validator.invalidate_work(pool_id, node.address, bad, Reason.PROOF_INVALID)

    (invalidated,) = events(owner.work.events.WorkInvalidated(), receipt)
    assert invalidated["slashed"] == SLASH
    assert events(owner.pools.events.NodeEjected(), receipt) == [
        {"poolId": pool_id, "node": node.address, "by": owner.work.address, "kind": Ejection.BY_INVALIDATION}
    ]
    assert owner.lock_of(pool_id, node.address).amount == 100 * TOKEN - SLASH
    owner.eject(pool_id, node.address)  # the owner cannot turn the invalidation's ejection back into its own
    assert owner.ejection_of(pool_id, node.address) == Ejection.BY_INVALIDATION
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:
        provider.claim_rewards(pool_id, node.address, [good])
    assert_revert(info.value, "NodeEjected", poolId=pool_id, node=node.address)
