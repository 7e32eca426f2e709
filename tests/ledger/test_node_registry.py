"""NodeRegistry on a real chain: stake lifecycle, per-pool locks, burned slashes, node bindings, roles."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from eth_abi import encode as abi_encode
from eth_account import Account
from eth_utils import keccak

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger, node_binding_signature
from ledger.deployment import role_id
from ledger.errors import ContractRevert
from ledger.types import BatchStatus, Reason, StakeInfo, StakeLock
from tests.conftest import TOKEN, UNBONDING_PERIOD
from tests.ledger.helpers import assert_revert, commit_batch, events, fund_provider, make_pool, onboard, transact_at
from tests.ledger.stake_locks import assert_unbonds_once_released, stake_unlocked

LedgerFor = Callable[[int], Ledger]
OWNER, PROVIDER_A, PROVIDER_B, STRANGER, VALIDATOR = 0, 1, 2, 8, 9
WINDOW = 3600  # helpers.make_pool's default challenge window
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
ADMIN_ROLE = b"\x00" * 32


def binding_digest(ledger: Ledger, node: str, provider: str) -> bytes:
    """The EIP-712 digest of NodeBinding(provider, node) that the registry itself checks."""
    typehash = keccak(text="NodeBinding(address provider,address node)")
    struct_hash = keccak(abi_encode(["bytes32", "address", "address"], [typehash, provider, node]))
    domain = ledger.registry.functions.domainSeparator().call()
    return keccak(b"\x19\x01" + domain + struct_hash)


def recovered_signer(ledger: Ledger, node: str, provider: str, signature: bytes) -> str:
    """Whom the registry recovers from `signature` for NodeBinding(provider, node)."""
    return str(Account._recover_hash(binding_digest(ledger, node, provider), signature=signature))


# --- stake, unstake, withdraw ----------------------------------------------------------------------


def test_stake_moves_tokens_into_active_stake(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    owner.mint(provider.address, 100 * TOKEN)

    receipt = provider.stake(60 * TOKEN)

    assert events(provider.registry.events.Staked(), receipt) == [{"provider": provider.address, "amount": 60 * TOKEN}]
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.locked, stake.release_at) == (60 * TOKEN, 0, 0, 0)
    assert provider.balance_of(provider.address) == 40 * TOKEN
    assert provider.balance_of(provider.registry.address) == 60 * TOKEN


def test_stake_zero_reverts_zero_amount(ledger_for: LedgerFor) -> None:
    provider = ledger_for(PROVIDER_A)
    with pytest.raises(ContractRevert) as info:
        provider.stake(0)
    assert_revert(info.value, "ZeroAmount")
    assert provider.stake_of(provider.address).active == 0


def test_request_unstake_zero_reverts_zero_amount(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    fund_provider(owner, provider, 10)
    with pytest.raises(ContractRevert) as info:
        provider.request_unstake(0)
    assert_revert(info.value, "ZeroAmount")
    assert provider.stake_of(provider.address).active == 10 * TOKEN


def test_request_unstake_more_than_active_reverts_insufficient_active_stake(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    fund_provider(owner, provider, 10)
    with pytest.raises(ContractRevert) as info:
        provider.request_unstake(10 * TOKEN + 1)
    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=10 * TOKEN, required=10 * TOKEN + 1
    )
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding) == (10 * TOKEN, 0)


def test_withdraw_without_unbonding_reverts_nothing_to_withdraw(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    fund_provider(owner, provider, 10)
    with pytest.raises(ContractRevert) as info:
        provider.withdraw()
    assert_revert(info.value, "NothingToWithdraw", provider=provider.address)
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.release_at) == (10 * TOKEN, 0, 0)


def test_request_unstake_starts_unbonding_period(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    fund_provider(owner, provider, 100)

    receipt = provider.request_unstake(30 * TOKEN)

    now = provider.timestamp()
    assert events(provider.registry.events.UnstakeRequested(), receipt) == [
        {"provider": provider.address, "amount": 30 * TOKEN, "releaseAt": now + UNBONDING_PERIOD}
    ]
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.release_at) == (70 * TOKEN, 30 * TOKEN, now + UNBONDING_PERIOD)


def test_second_unstake_request_delays_release_of_all_unbonding_stake(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    fund_provider(owner, provider, 100)
    provider.request_unstake(30 * TOKEN)
    chain.increase_time(UNBONDING_PERIOD // 2)

    provider.request_unstake(20 * TOKEN)

    stake = provider.stake_of(provider.address)
    assert (stake.unbonding, stake.release_at) == (50 * TOKEN, provider.timestamp() + UNBONDING_PERIOD)


def test_withdraw_one_second_before_release_reverts_still_unbonding(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    fund_provider(owner, provider, 100)
    provider.request_unstake(40 * TOKEN)
    release_at = provider.stake_of(provider.address).release_at

    with pytest.raises(ContractRevert) as info:
        transact_at(chain, provider, provider.registry.functions.withdraw(), release_at - 1)

    assert_revert(
        info.value, "StillUnbonding", provider=provider.address, releaseAt=release_at, timestamp=release_at - 1
    )
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.release_at) == (60 * TOKEN, 40 * TOKEN, release_at)
    assert provider.balance_of(provider.address) == 0


def test_withdraw_at_release_pays_unbonding_stake(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    fund_provider(owner, provider, 100)
    provider.request_unstake(40 * TOKEN)
    release_at = provider.stake_of(provider.address).release_at

    receipt = transact_at(chain, provider, provider.registry.functions.withdraw(), release_at)

    assert events(provider.registry.events.Withdrawn(), receipt) == [
        {"provider": provider.address, "amount": 40 * TOKEN}
    ]
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.locked, stake.release_at) == (60 * TOKEN, 0, 0, 0)
    assert provider.balance_of(provider.address) == 40 * TOKEN
    assert provider.balance_of(provider.registry.address) == 60 * TOKEN


def test_unstake_below_locked_stake_reverts_insufficient_active_stake(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)  # locks 100 tokens per node
    onboard(owner, provider, dev_account(3), pool_id, stake_tokens=150)

    with pytest.raises(ContractRevert) as info:
        provider.request_unstake(50 * TOKEN + 1)

    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=150 * TOKEN, required=150 * TOKEN + 1
    )
    provider.request_unstake(50 * TOKEN)  # exactly the unlocked part may go
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.locked) == (100 * TOKEN, 50 * TOKEN, 100 * TOKEN)


# --- locks per pool: held past the membership by one challenge window ---------------------------------


def test_join_opens_a_lock_in_that_pool_only(ledger_for: LedgerFor) -> None:
    owner, provider, node_account = ledger_for(OWNER), ledger_for(PROVIDER_A), dev_account(3)
    first, second = make_pool(owner), make_pool(owner)
    onboard(owner, provider, node_account, first, stake_tokens=150)

    assert owner.lock_of(first, node_account.address) == StakeLock(
        first, node_account.address, 100 * TOKEN, 0, True, True
    )
    assert owner.lock_of(second, node_account.address) == StakeLock(second, node_account.address, 0, 0, False, False)
    assert owner.stake_of(provider.address).locked == 100 * TOKEN


def test_leave_holds_the_lock_for_one_window_then_anyone_may_release_it(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, provider, stranger = ledger_for(OWNER), ledger_for(PROVIDER_A), ledger_for(STRANGER)
    pool_id = make_pool(owner)  # window 3600 s, locks 100
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=100)

    receipt = node.leave(pool_id)

    release_at = owner.timestamp() + WINDOW
    assert events(owner.registry.events.StakeUnlocked(), receipt) == stake_unlocked(provider, node, pool_id, release_at)
    assert events(owner.registry.events.StakeReleased(), receipt) == []
    assert owner.lock_of(pool_id, node.address) == StakeLock(
        pool_id, node.address, 100 * TOKEN, release_at, False, True
    )
    assert owner.stake_of(provider.address).locked == 100 * TOKEN
    with pytest.raises(ContractRevert) as info:
        provider.request_unstake(1)
    assert_revert(
        info.value, "InsufficientActiveStake", provider=provider.address, active=100 * TOKEN, required=100 * TOKEN + 1
    )

    call = stranger.registry.functions.releaseStake(pool_id, node.address)
    with pytest.raises(ContractRevert) as info:
        transact_at(chain, stranger, call, release_at - 1)
    assert_revert(info.value, "LockHeld", poolId=pool_id, node=node.address, member=False, releaseAt=release_at)

    receipt = transact_at(chain, stranger, call, release_at)  # anyone: the stake stays the provider's

    assert events(owner.registry.events.StakeReleased(), receipt) == [
        {"provider": provider.address, "node": node.address, "poolId": pool_id, "amount": 100 * TOKEN}
    ]
    assert owner.lock_of(pool_id, node.address) == StakeLock(pool_id, node.address, 0, 0, False, False)
    assert owner.balance_of(stranger.address) == 0
    assert_unbonds_once_released(owner, provider)


def test_release_of_a_membership_or_of_no_lock_is_refused(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    node = onboard(owner, provider, dev_account(3), pool_id)

    with pytest.raises(ContractRevert) as info:
        owner.release_stake(pool_id, node.address)
    assert_revert(info.value, "LockHeld", poolId=pool_id, node=node.address, member=True, releaseAt=0)

    with pytest.raises(ContractRevert) as info:
        owner.release_stake(pool_id, dev_account(4).address)
    assert_revert(info.value, "NotLocked", poolId=pool_id, node=dev_account(4).address)
    assert owner.stake_of(provider.address).locked == 100 * TOKEN


def test_rejoining_while_the_lock_is_held_reuses_it(ledger_for: LedgerFor) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=100)  # exactly one lock's worth
    node.leave(pool_id)

    receipt = node.join(pool_id)

    assert events(owner.registry.events.StakeLocked(), receipt) == [
        {"provider": provider.address, "node": node.address, "poolId": pool_id, "amount": 100 * TOKEN}
    ]
    assert owner.lock_of(pool_id, node.address) == StakeLock(pool_id, node.address, 100 * TOKEN, 0, True, True)
    assert owner.stake_of(provider.address).locked == 100 * TOKEN


# --- slashing, driven through WorkLedger.invalidateBatch --------------------------------------------


def test_slash_takes_the_lock_never_unbonding_stake_and_burns_it(ledger_for: LedgerFor) -> None:
    owner, provider, validator = ledger_for(OWNER), ledger_for(PROVIDER_A), ledger_for(VALIDATOR)
    pool_id = make_pool(owner)  # locks 100, slashes 50
    owner.set_validator(pool_id, validator.address)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=170)
    tree, _ = commit_batch(node, pool_id, ("slashed", 10))
    node.leave(pool_id)  # the lock stays held for the window, so only the free 70 may start unbonding
    provider.request_unstake(70 * TOKEN)
    release_at = provider.stake_of(provider.address).release_at

    receipt = validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(0), Reason.HASH_MISMATCH)

    assert events(owner.registry.events.Slashed(), receipt) == [
        {"provider": provider.address, "node": node.address, "poolId": pool_id, "amount": 50 * TOKEN}
    ]
    assert provider.stake_of(provider.address) == StakeInfo(
        active=50 * TOKEN, unbonding=70 * TOKEN, locked=50 * TOKEN, release_at=release_at
    )
    assert owner.lock_of(pool_id, node.address).amount == 50 * TOKEN
    assert owner.burned() == 50 * TOKEN
    assert owner.escrow_of(pool_id) == 0  # nothing is credited to the pool
    assert owner.balance_of(owner.work.address) == 0
    assert owner.balance_of(owner.registry.address) == 170 * TOKEN  # the burned tokens never leave the registry
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED


def test_slashes_in_one_pool_take_at_most_its_lock(ledger_for: LedgerFor) -> None:
    owner, provider, validator = ledger_for(OWNER), ledger_for(PROVIDER_A), ledger_for(VALIDATOR)
    pool_id = make_pool(owner, slash_amount=60 * TOKEN)  # locks 100
    owner.set_validator(pool_id, validator.address)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=300)
    trees = [commit_batch(node, pool_id, (f"bad-{i}", 10))[0] for i in range(3)]

    slashed = []
    for tree in trees:  # the first ejects the node; its other pending batches may still be invalidated
        receipt = validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(0), Reason.BAD_FORMAT)
        (invalidated,) = events(owner.work.events.BatchInvalidated(), receipt)
        slashed.append(invalidated["slashed"])

    assert slashed == [60 * TOKEN, 40 * TOKEN, 0]
    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.unbonding, stake.locked) == (200 * TOKEN, 0, 0)  # the free 200 are untouched
    assert owner.lock_of(pool_id, node.address).amount == 0
    assert owner.burned() == 100 * TOKEN
    assert owner.escrow_of(pool_id) == 0


def test_slash_leaves_unbonding_stake_and_its_release_time(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, provider, validator = ledger_for(OWNER), ledger_for(PROVIDER_A), ledger_for(VALIDATOR)
    pool_id = make_pool(owner, slash_amount=100 * TOKEN)
    owner.set_validator(pool_id, validator.address)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=160)
    tree, _ = commit_batch(node, pool_id, ("emptied", 10))
    provider.request_unstake(60 * TOKEN)
    release_at = provider.stake_of(provider.address).release_at

    validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(0), Reason.PROOF_INVALID)

    assert provider.stake_of(provider.address) == StakeInfo(
        active=0, unbonding=60 * TOKEN, locked=0, release_at=release_at
    )
    transact_at(chain, provider, provider.registry.functions.withdraw(), release_at)
    assert provider.balance_of(provider.address) == 60 * TOKEN
    assert owner.burned() == 100 * TOKEN
    assert owner.balance_of(owner.registry.address) == 100 * TOKEN


# --- node bindings ----------------------------------------------------------------------------------


def test_add_node_binds_node_to_provider(ledger_for: LedgerFor) -> None:
    provider = ledger_for(PROVIDER_A)
    node_a, node_b = dev_account(3), dev_account(4)

    receipt = provider.add_node(node_a)
    provider.add_node(node_b)

    assert events(provider.registry.events.NodeAdded(), receipt) == [
        {"provider": provider.address, "node": node_a.address}
    ]
    assert provider.nodes_of(provider.address) == [node_a.address, node_b.address]
    assert provider.provider_of(node_a.address) == provider.address
    assert provider.is_active_node(node_a.address)
    assert provider.provider_of(dev_account(5).address) is None
    assert not provider.is_active_node(dev_account(5).address)
    assert provider.nodes_of(ledger_for(PROVIDER_B).address) == []


def test_add_active_node_again_reverts_node_already_active(ledger_for: LedgerFor) -> None:
    provider, node = ledger_for(PROVIDER_A), dev_account(3)
    provider.add_node(node)
    with pytest.raises(ContractRevert) as info:
        provider.add_node(node)
    assert_revert(info.value, "NodeAlreadyActive", node=node.address)
    assert provider.nodes_of(provider.address) == [node.address]


def test_node_bound_to_provider_a_cannot_be_added_by_provider_b(ledger_for: LedgerFor) -> None:
    provider_a, provider_b, node = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B), dev_account(3)
    provider_a.add_node(node)

    with pytest.raises(ContractRevert) as info:
        provider_b.add_node(node)  # with a valid signature by the node for provider B

    assert_revert(info.value, "NodeBoundToOtherProvider", node=node.address, provider=provider_a.address)
    assert provider_b.nodes_of(provider_b.address) == []
    assert provider_b.provider_of(node.address) == provider_a.address


def test_node_stays_bound_to_provider_a_after_a_removes_it(ledger_for: LedgerFor) -> None:
    provider_a, provider_b, node = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B), dev_account(3)
    provider_a.add_node(node)
    receipt = provider_a.remove_node(node.address)
    assert events(provider_a.registry.events.NodeRemoved(), receipt) == [
        {"provider": provider_a.address, "node": node.address}
    ]

    with pytest.raises(ContractRevert) as info:
        provider_b.add_node(node)

    assert_revert(info.value, "NodeBoundToOtherProvider", node=node.address, provider=provider_a.address)
    assert provider_a.provider_of(node.address) == provider_a.address
    assert not provider_a.is_active_node(node.address)
    assert provider_a.nodes_of(provider_a.address) == []
    assert provider_b.nodes_of(provider_b.address) == []


def test_removed_node_can_be_added_again_by_its_provider(ledger_for: LedgerFor) -> None:
    provider, node = ledger_for(PROVIDER_A), dev_account(3)
    provider.add_node(node)
    provider.remove_node(node.address)

    provider.add_node(node)

    assert provider.is_active_node(node.address)
    assert provider.nodes_of(provider.address) == [node.address]


@pytest.mark.parametrize("wrong", ["chain_id", "registry"])
def test_binding_signature_for_other_domain_is_rejected(ledger_for: LedgerFor, wrong: str) -> None:
    provider, node = ledger_for(PROVIDER_A), dev_account(3)
    chain_id = provider.deployment.chain_id + 1 if wrong == "chain_id" else provider.deployment.chain_id
    registry = provider.pools.address if wrong == "registry" else provider.registry.address
    signature = node_binding_signature(node, provider.address, chain_id=chain_id, registry=registry)
    recovered = recovered_signer(provider, node.address, provider.address, signature)
    assert recovered != node.address

    with pytest.raises(ContractRevert) as info:
        provider.add_node(node.address, signature)

    assert_revert(info.value, "InvalidNodeSignature", node=node.address, recovered=recovered)
    assert provider.provider_of(node.address) is None
    assert provider.nodes_of(provider.address) == []


def test_binding_signature_by_another_key_is_rejected(ledger_for: LedgerFor) -> None:
    provider, node, impostor = ledger_for(PROVIDER_A), dev_account(3), dev_account(4)
    # the right message, NodeBinding(provider, node) for this chain and registry, signed by the wrong key
    digest = binding_digest(provider, node.address, provider.address)
    signature = bytes(Account.unsafe_sign_hash(digest, impostor.key).signature)

    with pytest.raises(ContractRevert) as info:
        provider.add_node(node.address, signature)

    assert_revert(info.value, "InvalidNodeSignature", node=node.address, recovered=impostor.address)
    assert provider.provider_of(node.address) is None
    assert provider.nodes_of(provider.address) == []


def test_binding_signature_check_accepts_the_node_key(ledger_for: LedgerFor) -> None:
    provider, node = ledger_for(PROVIDER_A), dev_account(3)
    digest = binding_digest(provider, node.address, provider.address)
    signature = bytes(Account.unsafe_sign_hash(digest, node.key).signature)
    assert signature == provider.node_binding_signature(node)  # client and contract agree on the digest

    provider.add_node(node.address, signature)

    assert provider.provider_of(node.address) == provider.address


def test_binding_signature_for_another_provider_is_rejected(ledger_for: LedgerFor) -> None:
    provider_a, provider_b, node = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B), dev_account(3)
    signature = provider_a.node_binding_signature(node)  # the node consented to work for A only

    with pytest.raises(ContractRevert) as info:
        provider_b.add_node(node.address, signature)

    recovered = recovered_signer(provider_b, node.address, provider_b.address, signature)
    assert_revert(info.value, "InvalidNodeSignature", node=node.address, recovered=recovered)
    assert provider_b.provider_of(node.address) is None


def test_malformed_binding_signature_is_rejected(ledger_for: LedgerFor) -> None:
    provider, node = ledger_for(PROVIDER_A), dev_account(3)
    with pytest.raises(ContractRevert) as info:
        provider.add_node(node.address, b"\x01" * 64)
    assert_revert(info.value, "InvalidNodeSignature", node=node.address, recovered=ZERO_ADDRESS)
    assert provider.provider_of(node.address) is None


def test_remove_node_while_its_lock_is_open_reverts_node_in_pools(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, provider, node_account = ledger_for(OWNER), ledger_for(PROVIDER_A), dev_account(3)
    pool_id = make_pool(owner)
    node = onboard(owner, provider, node_account, pool_id)

    with pytest.raises(ContractRevert) as info:
        provider.remove_node(node_account.address)
    assert_revert(info.value, "NodeInPools", node=node_account.address, pools=1)

    node.leave(pool_id)
    with pytest.raises(ContractRevert) as info:  # a held lock still counts: its window may hold work
        provider.remove_node(node_account.address)
    assert_revert(info.value, "NodeInPools", node=node_account.address, pools=1)
    assert provider.is_active_node(node_account.address)

    chain.increase_time(WINDOW)
    provider.release_stake(pool_id, node_account.address)
    provider.remove_node(node_account.address)
    assert not provider.is_active_node(node_account.address)


def test_remove_node_of_another_provider_reverts_not_node_provider(ledger_for: LedgerFor) -> None:
    provider_a, provider_b, node = ledger_for(PROVIDER_A), ledger_for(PROVIDER_B), dev_account(3)
    provider_a.add_node(node)
    with pytest.raises(ContractRevert) as info:
        provider_b.remove_node(node.address)
    assert_revert(info.value, "NotNodeProvider", node=node.address, caller=provider_b.address)
    assert provider_a.is_active_node(node.address)


def test_remove_node_twice_reverts_node_not_active(ledger_for: LedgerFor) -> None:
    provider, node = ledger_for(PROVIDER_A), dev_account(3)
    provider.add_node(node)
    provider.remove_node(node.address)
    with pytest.raises(ContractRevert) as info:
        provider.remove_node(node.address)
    assert_revert(info.value, "NodeNotActive", node=node.address)
    assert provider.provider_of(node.address) == provider.address


# --- roles ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "role"),
    [("slash", "SLASHER_ROLE"), ("lockStake", "POOL_ROLE"), ("unlockStake", "POOL_ROLE")],
)
def test_only_role_holders_may_move_stake(ledger_for: LedgerFor, function: str, role: str) -> None:
    owner, provider = ledger_for(OWNER), ledger_for(PROVIDER_A)
    pool_id = make_pool(owner)
    node = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=150).address
    calls = {
        "slash": owner.registry.functions.slash(pool_id, node, 50 * TOKEN),
        "lockStake": owner.registry.functions.lockStake(pool_id + 1, node, 50 * TOKEN),
        "unlockStake": owner.registry.functions.unlockStake(pool_id, node, 0),
    }

    for caller in (owner, provider):  # neither the deployer nor a provider holds the role
        with pytest.raises(ContractRevert) as info:
            caller._send(calls[function], function)
        assert_revert(info.value, "AccessControlUnauthorizedAccount", account=caller.address, neededRole=role_id(role))

    stake = provider.stake_of(provider.address)
    assert (stake.active, stake.locked) == (150 * TOKEN, 100 * TOKEN)
    assert owner.lock_of(pool_id, node) == StakeLock(pool_id, node, 100 * TOKEN, 0, True, True)
    assert owner.burned() == 0


def test_roles_are_wired_to_the_contracts(ledger_for: LedgerFor) -> None:
    ledger = ledger_for(OWNER)
    has_registry_role = ledger.registry.functions.hasRole
    assert has_registry_role(role_id("SLASHER_ROLE"), ledger.work.address).call()
    assert has_registry_role(role_id("POOL_ROLE"), ledger.pools.address).call()
    assert ledger.pools.functions.hasRole(role_id("LEDGER_ROLE"), ledger.work.address).call()


def test_deployer_renounced_admin_and_cannot_grant_itself_slasher(ledger_for: LedgerFor) -> None:
    deployer = ledger_for(OWNER)
    assert not deployer.registry.functions.hasRole(ADMIN_ROLE, deployer.address).call()
    assert not deployer.pools.functions.hasRole(ADMIN_ROLE, deployer.address).call()

    with pytest.raises(ContractRevert) as info:
        deployer._send(deployer.registry.functions.grantRole(role_id("SLASHER_ROLE"), deployer.address), "grantRole")
    assert_revert(info.value, "AccessControlUnauthorizedAccount", account=deployer.address, neededRole=ADMIN_ROLE)

    with pytest.raises(ContractRevert) as info:
        deployer._send(deployer.pools.functions.grantRole(role_id("LEDGER_ROLE"), deployer.address), "grantRole")
    assert_revert(info.value, "AccessControlUnauthorizedAccount", account=deployer.address, neededRole=ADMIN_ROLE)

    assert not deployer.registry.functions.hasRole(role_id("SLASHER_ROLE"), deployer.address).call()
