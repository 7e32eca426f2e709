"""ComputePool on a real chain: pool creation rules, validators, joining against stake, leaving, ejection."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import role_id
from ledger.errors import ContractRevert
from ledger.types import Ejection, PoolConfig, StakeLock
from tests.conftest import TOKEN, UNBONDING_PERIOD
from tests.ledger.helpers import assert_revert, events, fund_provider, make_pool, onboard, pool_config
from tests.ledger.stake_locks import assert_unbonds_once_released, stake_unlocked

LedgerFor = Callable[[int], Ledger]
OWNER, PROVIDER_A, PROVIDER_B, STRANGER, VALIDATOR = 0, 1, 2, 8, 9
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
WINDOW = 3600  # helpers.make_pool's default challenge window
MIN_WINDOW = 3600  # the session deployment's minChallengeWindow (LocalChain.deploy's default)


# --- createPool -------------------------------------------------------------------------------------


def test_create_pool_returns_increasing_ids_and_emits_pool_created(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    config = pool_config(owner, name="first")

    receipt = owner._send(owner.pools.functions.createPool(config.as_tuple()), "createPool")
    second = make_pool(ledger_for(PROVIDER_A))

    assert events(owner.pools.events.PoolCreated(), receipt) == [
        {"poolId": 1, "owner": owner.address, "name": "first", "trainer": owner.address}
    ]
    assert second == 2
    assert owner.pool_count() == 2
    assert owner.pool(2).owner == ledger_for(PROVIDER_A).address


def test_create_pool_with_window_longer_than_unbonding_reverts(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    with pytest.raises(ContractRevert) as info:
        make_pool(owner, challenge_window=UNBONDING_PERIOD + 1)
    assert_revert(
        info.value, "ChallengeWindowTooLong", challengeWindow=UNBONDING_PERIOD + 1, unbondingPeriod=UNBONDING_PERIOD
    )
    assert owner.pool_count() == 0


def test_create_pool_with_window_equal_to_unbonding_succeeds(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    pool_id = make_pool(owner, challenge_window=UNBONDING_PERIOD)
    assert owner.pool(pool_id).config.challenge_window == UNBONDING_PERIOD
    assert owner.challenge_window(pool_id) == UNBONDING_PERIOD


def test_min_challenge_window_is_the_deployments(ledger_for: LedgerFor) -> None:
    assert ledger_for(OWNER).min_challenge_window() == MIN_WINDOW


@pytest.mark.parametrize("window", [0, 1, MIN_WINDOW - 1])
def test_create_pool_with_window_below_the_minimum_reverts(ledger_for: LedgerFor, window: int) -> None:
    owner = ledger_for(OWNER)
    with pytest.raises(ContractRevert) as info:
        make_pool(owner, challenge_window=window)
    assert_revert(info.value, "ChallengeWindowTooShort", challengeWindow=window, minChallengeWindow=MIN_WINDOW)
    assert owner.pool_count() == 0


def test_create_pool_with_the_minimum_window_succeeds(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    pool_id = make_pool(owner, challenge_window=MIN_WINDOW)
    assert owner.challenge_window(pool_id) == MIN_WINDOW


@pytest.mark.parametrize("min_stake", [0, 2**128])
def test_create_pool_with_min_stake_out_of_range_reverts(ledger_for: LedgerFor, min_stake: int) -> None:
    owner = ledger_for(OWNER)
    with pytest.raises(ContractRevert) as info:
        make_pool(owner, min_stake_per_node=min_stake, slash_amount=1)
    assert_revert(info.value, "MinStakeOutOfRange", minStakePerNode=min_stake, max=2**128 - 1)
    assert owner.pool_count() == 0


@pytest.mark.parametrize("slash", [0, 100 * TOKEN + 1])
def test_create_pool_with_slash_out_of_range_reverts(ledger_for: LedgerFor, slash: int) -> None:
    owner = ledger_for(OWNER)
    with pytest.raises(ContractRevert) as info:
        make_pool(owner, min_stake_per_node=100 * TOKEN, slash_amount=slash)
    assert_revert(info.value, "SlashAmountOutOfRange", slashAmount=slash, minStakePerNode=100 * TOKEN)
    assert owner.pool_count() == 0


@pytest.mark.parametrize("max_units", [0, 2**48])
def test_create_pool_with_max_units_per_key_out_of_range_reverts(ledger_for: LedgerFor, max_units: int) -> None:
    owner = ledger_for(OWNER)
    with pytest.raises(ContractRevert) as info:
        make_pool(owner, max_units_per_key=max_units)
    assert_revert(info.value, "MaxUnitsPerKeyOutOfRange", maxUnitsPerKey=max_units, max=2**48 - 1)
    assert owner.pool_count() == 0


def test_create_pool_at_the_edges_of_the_terms_succeeds(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    smallest = make_pool(owner, min_stake_per_node=1, slash_amount=1, max_units_per_key=1)
    largest = make_pool(owner, min_stake_per_node=2**128 - 1, slash_amount=2**128 - 1, max_units_per_key=2**48 - 1)
    assert owner.pools.functions.terms(smallest).call() == [MIN_WINDOW, 10**15, 1, 1]
    assert owner.pools.functions.terms(largest).call() == [MIN_WINDOW, 10**15, 2**128 - 1, 2**48 - 1]


def test_deploy_refuses_a_min_window_outside_zero_to_unbonding(chain: LocalChain) -> None:
    for min_window in (0, 101):
        with pytest.raises(ContractRevert) as info:
            chain.deploy(unbonding_period=100, min_challenge_window=min_window)
        assert_revert(info.value, "MinChallengeWindowOutOfRange", minChallengeWindow=min_window, unbondingPeriod=100)
    deployment = chain.deploy(unbonding_period=100, min_challenge_window=100)
    assert Ledger(chain.w3, deployment).min_challenge_window() == 100


def test_create_pool_with_zero_trainer_reverts(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    with pytest.raises(ContractRevert) as info:
        make_pool(owner, trainer=ZERO_ADDRESS)
    assert_revert(info.value, "ZeroAddress")
    assert owner.pool_count() == 0


def test_get_pool_round_trips_every_config_field(ledger_for: LedgerFor) -> None:
    creator, trainer = ledger_for(PROVIDER_B), dev_account(7).address
    config = PoolConfig(
        name="qwen-7b / math ∑",
        model_hash=hashlib.sha256(b"weights").digest(),
        spec_uri="https://example.org/pools/spec.toml?rev=3",
        trainer=trainer,
        min_stake_per_node=123 * TOKEN + 4,
        challenge_window=5 * 3600 + 7,
        reward_per_unit=10**15 + 9,
        slash_amount=77 * TOKEN + 1,
        max_nodes=2**32 - 1,
        max_units_per_key=2**40 + 3,
    )

    pool_id = creator.create_pool(config)

    info = creator.pool(pool_id)
    assert info.pool_id == pool_id
    assert info.owner == creator.address
    assert info.config == config


@pytest.mark.parametrize("pool_id", [0, 2, 99])
def test_unknown_pool_id_reverts_pool_not_found(ledger_for: LedgerFor, pool_id: int) -> None:
    owner = ledger_for(OWNER)
    make_pool(owner)  # pool 1 exists

    with pytest.raises(ContractRevert) as info:
        owner.pool(pool_id)
    assert_revert(info.value, "PoolNotFound", poolId=pool_id)

    with pytest.raises(ContractRevert) as info:
        owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    assert_revert(info.value, "PoolNotFound", poolId=pool_id)

    owner.add_node(dev_account(3))
    with pytest.raises(ContractRevert) as info:
        owner.as_account(dev_account(3)).join(pool_id)
    assert_revert(info.value, "PoolNotFound", poolId=pool_id)


# --- validators -------------------------------------------------------------------------------------


def test_owner_appoints_and_dismisses_validators(ledger_for: LedgerFor) -> None:
    owner, validator = ledger_for(OWNER), dev_account(VALIDATOR).address
    pool_id = make_pool(owner)

    receipt = owner.set_validator(pool_id, validator)
    assert events(owner.pools.events.ValidatorSet(), receipt) == [
        {"poolId": pool_id, "validator": validator, "allowed": True}
    ]
    assert owner.is_validator(pool_id, validator)

    owner.set_validator(pool_id, validator, allowed=False)
    assert not owner.is_validator(pool_id, validator)


def test_set_validator_by_non_owner_reverts_not_pool_owner(ledger_for: LedgerFor) -> None:
    owner, stranger = ledger_for(OWNER), ledger_for(STRANGER)
    pool_id = make_pool(owner)

    with pytest.raises(ContractRevert) as info:
        stranger.set_validator(pool_id, stranger.address)

    assert_revert(info.value, "NotPoolOwner", poolId=pool_id, caller=stranger.address)
    assert not owner.is_validator(pool_id, stranger.address)


def test_set_zero_validator_reverts_zero_address(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    pool_id = make_pool(owner)
    with pytest.raises(ContractRevert) as info:
        owner.set_validator(pool_id, ZERO_ADDRESS)
    assert_revert(info.value, "ZeroAddress")
    assert not owner.is_validator(pool_id, ZERO_ADDRESS)


# --- join -------------------------------------------------------------------------------------------


def test_join_locks_min_stake_and_lists_member(ledger_for: LedgerFor) -> None:
    owner, provider, node_account = ledger_for(OWNER), ledger_for(PROVIDER_A), dev_account(3)
    pool_id = make_pool(owner)
    fund_provider(owner, provider, 100)
    provider.add_node(node_account)

    receipt = provider.as_account(node_account).join(pool_id)

    assert events(owner.pools.events.NodeJoined(), receipt) == [
        {"poolId": pool_id, "node": node_account.address, "provider": provider.address}
    ]
    assert events(owner.registry.events.StakeLocked(), receipt) == [
        {"provider": provider.address, "node": node_account.address, "poolId": pool_id, "amount": 100 * TOKEN}
    ]
    assert owner.is_member(pool_id, node_account.address)
    assert owner.members(pool_id) == [node_account.address]
    assert owner.pools.functions.memberProvider(pool_id, node_account.address).call() == provider.address
    assert owner.stake_of(provider.address).locked == 100 * TOKEN
    assert owner.pools.functions.memberTerms(pool_id, node_account.address).call() == [provider.address, 1_000_000]
    assert owner.pools.functions.memberTerms(pool_id, provider.address).call() == [ZERO_ADDRESS, 0]


def test_join_without_enough_stake_reverts_insufficient_active_stake(ledger_for: LedgerFor) -> None:
    owner, provider, node_account = ledger_for(OWNER), ledger_for(PROVIDER_A), dev_account(3)
    pool_id = make_pool(owner)  # min stake 100
    fund_provider(owner, provider, 99)
    provider.add_node(node_account)

    with pytest.raises(ContractRevert) as info:
        provider.as_account(node_account).join(pool_id)

    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=99 * TOKEN, required=100 * TOKEN
    )
    assert not owner.is_member(pool_id, node_account.address)
    assert owner.members(pool_id) == []
    assert owner.stake_of(provider.address).locked == 0


def test_join_requires_stake_for_existing_locks_plus_min_stake(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    cheap = make_pool(owner, min_stake_per_node=30 * TOKEN, slash_amount=30 * TOKEN)
    dear = make_pool(owner, min_stake_per_node=80 * TOKEN)
    node = onboard(owner, provider, dev_account(3), cheap, stake_tokens=100)  # locked 30

    with pytest.raises(ContractRevert) as info:
        node.join(dear)

    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=100 * TOKEN, required=110 * TOKEN
    )
    assert owner.stake_of(provider.address).locked == 30 * TOKEN


def test_stake_for_one_node_covers_one_membership_only(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    first, second = make_pool(owner), make_pool(owner)
    node_1 = onboard(owner, provider, dev_account(3), first, stake_tokens=100)
    provider.add_node(dev_account(4))
    node_2 = provider.as_account(dev_account(4))

    for node, pool_id in ((node_1, second), (node_2, first), (node_2, second)):
        with pytest.raises(ContractRevert) as info:
            node.join(pool_id)
        assert_revert(
            info.value, "InsufficientActiveStake", provider=provider.address, active=100 * TOKEN, required=200 * TOKEN
        )

    assert owner.members(first) == [node_1.address]
    assert owner.members(second) == []
    assert owner.stake_of(provider.address).locked == 100 * TOKEN


def test_join_twice_reverts_already_member(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=300)

    with pytest.raises(ContractRevert) as info:
        node.join(pool_id)

    assert_revert(info.value, "AlreadyMember", poolId=pool_id, node=node.address)
    assert owner.stake_of(provider.address).locked == 100 * TOKEN


def test_join_by_unregistered_node_reverts_node_not_active(ledger_for: LedgerFor) -> None:
    owner, stranger = ledger_for(OWNER), ledger_for(STRANGER)
    pool_id = make_pool(owner)

    with pytest.raises(ContractRevert) as info:
        stranger.join(pool_id)

    assert_revert(info.value, "NodeNotActive", node=stranger.address)
    assert owner.members(pool_id) == []


def test_join_by_removed_node_reverts_node_not_active(ledger_for: LedgerFor) -> None:
    owner, provider, node_account = ledger_for(OWNER), ledger_for(PROVIDER_A), dev_account(3)
    pool_id = make_pool(owner)
    fund_provider(owner, provider, 100)
    provider.add_node(node_account)
    provider.remove_node(node_account.address)

    with pytest.raises(ContractRevert) as info:
        provider.as_account(node_account).join(pool_id)

    assert_revert(info.value, "NodeNotActive", node=node_account.address)
    assert owner.members(pool_id) == []
    assert owner.stake_of(provider.address).locked == 0


def test_join_full_pool_reverts_pool_full(ledger_for: LedgerFor) -> None:
    owner = ledger_for(OWNER)
    pool_id = make_pool(owner, max_nodes=2)
    onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    onboard(owner, ledger_for(PROVIDER_A), dev_account(4), pool_id)
    provider_b = ledger_for(PROVIDER_B)
    fund_provider(owner, provider_b, 100)
    provider_b.add_node(dev_account(5))

    with pytest.raises(ContractRevert) as info:
        provider_b.as_account(dev_account(5)).join(pool_id)

    assert_revert(info.value, "PoolFull", poolId=pool_id, maxNodes=2)
    assert owner.members(pool_id) == [dev_account(3).address, dev_account(4).address]
    assert owner.stake_of(provider_b.address).locked == 0


def test_pool_with_max_nodes_zero_is_unlimited(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner, max_nodes=0, min_stake_per_node=TOKEN, slash_amount=TOKEN)
    fund_provider(owner, provider, 10)
    for index in range(3, 8):
        onboard(owner, provider, dev_account(index), pool_id, stake_tokens=0)
    assert len(owner.members(pool_id)) == 5


# --- leave and eject --------------------------------------------------------------------------------


def test_leave_holds_the_lock_one_window_then_stake_can_be_unstaked(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=100)
    with pytest.raises(ContractRevert) as info:
        provider.request_unstake(100 * TOKEN)
    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=100 * TOKEN, required=200 * TOKEN
    )

    receipt = node.leave(pool_id)

    release_at = owner.timestamp() + WINDOW
    assert events(owner.pools.events.NodeLeft(), receipt) == [{"poolId": pool_id, "node": node.address}]
    assert events(owner.registry.events.StakeUnlocked(), receipt) == stake_unlocked(provider, node, pool_id, release_at)
    assert not owner.is_member(pool_id, node.address)
    assert owner.members(pool_id) == []
    assert owner.stake_of(provider.address).locked == 100 * TOKEN  # work submitted until now may still be slashed
    with pytest.raises(ContractRevert) as info:
        provider.request_unstake(100 * TOKEN)
    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=100 * TOKEN, required=200 * TOKEN
    )

    chain.increase_time(WINDOW)
    provider.release_stake(pool_id, node.address)
    assert_unbonds_once_released(owner, provider)


def test_node_that_left_may_rejoin(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    node = onboard(owner, provider, dev_account(3), pool_id)
    node.leave(pool_id)

    node.join(pool_id)

    assert owner.members(pool_id) == [node.address]
    assert owner.stake_of(provider.address).locked == 100 * TOKEN


def test_leave_by_non_member_reverts_not_member(ledger_for: LedgerFor) -> None:
    owner, stranger = ledger_for(OWNER), ledger_for(STRANGER)
    pool_id = make_pool(owner)
    with pytest.raises(ContractRevert) as info:
        stranger.leave(pool_id)
    assert_revert(info.value, "NotMember", poolId=pool_id, node=stranger.address)
    assert owner.members(pool_id) == []


def test_eject_by_non_owner_reverts_not_allowed_to_eject(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    node = onboard(owner, provider, dev_account(3), pool_id)

    for caller in (provider, ledger_for(VALIDATOR), node):  # not the provider, a validator or the node itself
        with pytest.raises(ContractRevert) as info:
            caller.eject(pool_id, node.address)
        assert_revert(info.value, "NotAllowedToEject", poolId=pool_id, caller=caller.address)

    assert owner.is_member(pool_id, node.address)
    assert not owner.is_ejected(pool_id, node.address)


def test_only_the_work_ledger_may_eject_for_invalidation(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    node = onboard(owner, provider, dev_account(3), pool_id)

    for caller in (owner, ledger_for(VALIDATOR), provider):  # the pool's owner cannot void a member's rewards
        with pytest.raises(ContractRevert) as info:
            caller._send(caller.pools.functions.ejectForInvalidation(pool_id, node.address), "ejectForInvalidation")
        assert_revert(
            info.value, "AccessControlUnauthorizedAccount", account=caller.address, neededRole=role_id("LEDGER_ROLE")
        )

    assert owner.is_member(pool_id, node.address)
    assert owner.ejection_of(pool_id, node.address) == Ejection.NONE


def test_owner_eject_removes_member_holds_lock_one_window_and_bans_rejoin(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    node = onboard(owner, provider, dev_account(3), pool_id)

    receipt = owner.eject(pool_id, node.address)

    assert events(owner.pools.events.NodeEjected(), receipt) == [
        {"poolId": pool_id, "node": node.address, "by": owner.address, "kind": Ejection.BY_OWNER}
    ]
    assert owner.ejection_of(pool_id, node.address) == Ejection.BY_OWNER
    assert not owner.is_voided(pool_id, node.address)  # an owner's ejection voids none of its work
    release_at = owner.timestamp() + WINDOW
    assert events(owner.registry.events.StakeUnlocked(), receipt) == stake_unlocked(provider, node, pool_id, release_at)
    assert not owner.is_member(pool_id, node.address)
    assert owner.is_ejected(pool_id, node.address)
    assert owner.members(pool_id) == []
    assert owner.lock_of(pool_id, node.address) == StakeLock(
        pool_id, node.address, 100 * TOKEN, release_at, False, True
    )

    with pytest.raises(ContractRevert) as info:
        node.join(pool_id)
    assert_revert(info.value, "EjectedFromPool", poolId=pool_id, node=node.address)
    assert owner.members(pool_id) == []
    assert owner.stake_of(provider.address).locked == 100 * TOKEN
    chain.increase_time(WINDOW)
    owner.release_stake(pool_id, node.address)
    assert owner.stake_of(provider.address).locked == 0


def test_eject_of_non_member_bans_it_in_advance(ledger_for: LedgerFor) -> None:
    owner, provider, node_account = ledger_for(OWNER), ledger_for(PROVIDER_A), dev_account(3)
    pool_id = make_pool(owner)
    fund_provider(owner, provider, 100)
    provider.add_node(node_account)

    owner.eject(pool_id, node_account.address)

    with pytest.raises(ContractRevert) as info:
        provider.as_account(node_account).join(pool_id)
    assert_revert(info.value, "EjectedFromPool", poolId=pool_id, node=node_account.address)
    assert owner.stake_of(provider.address).locked == 0


def test_ejection_is_per_pool(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    first, second = make_pool(owner), make_pool(owner)
    node = onboard(owner, provider, dev_account(3), first, stake_tokens=200)  # the ejection holds the first lock
    owner.eject(first, node.address)

    node.join(second)

    assert owner.members(second) == [node.address]
    assert not owner.is_ejected(second, node.address)
    assert owner.stake_of(provider.address).locked == 200 * TOKEN
