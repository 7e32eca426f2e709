"""WorkLedger's batch records on a real chain: one Merkle root per batch, a file of it invalidated (the batch void,
the node slashed and ejected) or refused (its units not paid) with its proof inside the window, or the whole batch
invalidated with no proof when its leaf list was never made available, whole batches claimed after the window.
Every revert of a challenge has a test here that a contract without that check would fail."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert
from ledger.merkle import BatchTree, Leaf, LeafProof, leaf_hash, root_of
from ledger.types import BatchStatus, Ejection, Reason
from tests.conftest import TOKEN
from tests.ledger.helpers import assert_revert, events, make_pool, onboard, transact_at

LedgerFor = Callable[[int], Ledger]
OWNER, PROVIDER_A, PROVIDER_B, STRANGER, VALIDATOR = 0, 1, 2, 8, 9
WINDOW = 3600  # helpers.make_pool's default challenge window
REWARD = 10**15  # helpers.make_pool's default reward per unit
SLASH = 50 * TOKEN  # helpers.make_pool's default slash
CAP = 1_000_000  # PoolConfig's default maxUnitsPerKey
MAX_LEAVES = 2**32 - 1
NO_LEAF = 2**256 - 1  # BatchInvalidated's leafIndex when the invalidation shows no leaf


def funded_pool(ledger_for: LedgerFor, escrow_tokens: int = 100, **overrides: Any) -> tuple[Ledger, Ledger, int]:
    """(owner, validator, pool id): a pool with the VALIDATOR account appointed and `escrow_tokens` of rewards."""
    owner, validator = ledger_for(OWNER), ledger_for(VALIDATOR)
    pool_id = make_pool(owner, **overrides)
    owner.set_validator(pool_id, validator.address)
    if escrow_tokens:
        owner.mint(owner.address, escrow_tokens * TOKEN)
        owner.fund_rewards(pool_id, escrow_tokens * TOKEN)
    return owner, validator, pool_id


def batch(label: str, units: list[int]) -> BatchTree:
    return BatchTree([Leaf(hashlib.sha256(f"{label}-{i}".encode()).digest(), u) for i, u in enumerate(units)])


def submitted(node: Ledger, pool_id: int, tree: BatchTree) -> int:
    """Submits `tree` from `node`; returns its submittedAt."""
    node.submit_batch(pool_id, tree.root, tree.count, tree.total_units)
    return node.get_batch(pool_id, node.address, tree.root).submitted_at


def setup(ledger_for: LedgerFor, units: list[int] | None = None, **overrides: Any) -> tuple[Any, ...]:
    """(owner, validator, pool id, provider, node, tree, submittedAt): a funded pool, one member node, one batch of
    five files submitted (by default)."""
    owner, validator, pool_id = funded_pool(ledger_for, **overrides)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    tree = batch("files", units or [100, 200, 300, 400, 500])
    return owner, validator, pool_id, provider, node, tree, submitted(node, pool_id, tree)


# --- submitting -------------------------------------------------------------------------------------------


def test_submit_batch_records_one_pending_record_and_emits_batch_submitted(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    tree = batch("one-record", [CAP, 1, 2, 3, 4, 5, 6])

    receipt = node.submit_batch(pool_id, tree.root, tree.count, tree.total_units)

    assert events(owner.work.events.BatchSubmitted(), receipt) == [
        {
            "poolId": pool_id,
            "root": tree.root,
            "node": node.address,
            "slot": 0,  # the node's first batch: its lowest free slot
            "count": 7,
            "totalUnits": CAP + 21,
        }
    ]  # no provider: the node's binding is permanent, and the record names it
    record = owner.get_slot(pool_id, node.address, 0)
    block_time = owner.w3.eth.get_block(receipt["blockNumber"])["timestamp"]
    assert (record.root, record.provider, record.count, record.total_units, record.refused_units) == (
        tree.root,
        provider.address,
        7,
        CAP + 21,
        0,
    )
    assert (record.submitted_at, record.status) == (block_time, BatchStatus.PENDING)


def test_the_largest_batch_is_stored_exactly(ledger_for: LedgerFor) -> None:
    """The record is packed into one slot by hand: the widest count and units must not spill into their neighbours."""
    owner, _, pool_id = funded_pool(ledger_for, max_units_per_key=2**48 - 1)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    root, total = b"\x77" * 32, MAX_LEAVES * (2**48 - 1)

    node.submit_batch(pool_id, root, MAX_LEAVES, total)

    record = owner.get_batch(pool_id, node.address, root)
    assert (record.provider, record.count, record.total_units, record.refused_units, record.status) == (
        provider.address,
        MAX_LEAVES,
        total,
        0,
        BatchStatus.PENDING,
    )
    assert record.submitted_at == owner.timestamp()


def test_submit_batch_by_non_member_reverts_not_pool_member(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    tree = batch("outsider", [10])
    for sender in (ledger_for(PROVIDER_A), ledger_for(STRANGER)):
        with pytest.raises(ContractRevert) as info:
            sender.submit_batch(pool_id, tree.root, 1, 10)
        assert_revert(info.value, "NotPoolMember", poolId=pool_id, node=sender.address)
        assert owner.get_batch(pool_id, sender.address, tree.root).status == BatchStatus.NONE


def test_submit_into_a_slot_holding_a_pending_batch_reverts_slot_in_use(ledger_for: LedgerFor) -> None:
    """The error names the batch the slot holds, not the one refused; the pending record is untouched, whether the
    new batch has another root or the same one."""
    owner, _, pool_id, _, node, tree, submitted_at = setup(ledger_for)
    for root in (batch("newer", [1, 2]).root, tree.root):
        with pytest.raises(ContractRevert) as info:
            node.submit_batch(pool_id, root, 2, 3, slot=0)
        assert_revert(info.value, "SlotInUse", poolId=pool_id, node=node.address, slot=0, root=tree.root)
    record = owner.get_slot(pool_id, node.address, 0)
    assert (record.root, record.count, record.total_units, record.submitted_at, record.status) == (
        tree.root,
        tree.count,
        tree.total_units,
        submitted_at,
        BatchStatus.PENDING,
    )


def test_the_same_root_from_another_node_is_its_own_record(ledger_for: LedgerFor) -> None:
    owner, _, pool_id, _, node, tree, _ = setup(ledger_for)
    other = onboard(owner, ledger_for(PROVIDER_B), dev_account(4), pool_id)

    other.submit_batch(pool_id, tree.root, tree.count, 7)  # no member can block another's root

    assert owner.get_batch(pool_id, node.address, tree.root).total_units == tree.total_units
    assert owner.get_batch(pool_id, other.address, tree.root).total_units == 7


@pytest.mark.parametrize("count", [0, MAX_LEAVES + 1, 2**256 - 1])
def test_leaf_count_out_of_range_reverts(ledger_for: LedgerFor, count: int) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    with pytest.raises(ContractRevert) as info:
        node.submit_batch(pool_id, b"\x01" * 32, count, 10)
    assert_revert(info.value, "LeafCountOutOfRange", count=count, max=MAX_LEAVES)


@pytest.mark.parametrize(("count", "units"), [(1, 0), (1, CAP + 1), (32, 32 * CAP + 1), (3, 2**256 - 1)])
def test_total_units_over_count_times_the_cap_reverts_units_out_of_range(
    ledger_for: LedgerFor, count: int, units: int
) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    with pytest.raises(ContractRevert) as info:
        node.submit_batch(pool_id, b"\x02" * 32, count, units)
    assert_revert(info.value, "UnitsOutOfRange", units=units, max=count * CAP)
    assert owner.get_batch(pool_id, node.address, b"\x02" * 32).status == BatchStatus.NONE


def test_total_units_at_count_times_the_cap_are_accepted(ledger_for: LedgerFor) -> None:
    owner, _, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    node.submit_batch(pool_id, b"\x03" * 32, 32, 32 * CAP)
    assert owner.get_batch(pool_id, node.address, b"\x03" * 32).total_units == 32 * CAP


# --- invalidating a batch by one of its files ----------------------------------------------------------------


def test_invalidate_batch_voids_it_burns_the_slash_and_ejects_the_node(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id, provider, node, tree, _ = setup(ledger_for)
    proof = tree.proof(3)

    receipt = validator.invalidate_batch(pool_id, node.address, tree.root, proof, Reason.BAD_FORMAT)

    assert events(owner.work.events.BatchInvalidated(), receipt) == [
        {
            "poolId": pool_id,
            "root": tree.root,
            "node": node.address,
            "validator": validator.address,
            "leafIndex": 3,
            "workKey": proof.leaf.work_key,
            "reason": 2,
            "slashed": SLASH,
        }
    ]
    assert events(owner.registry.events.Slashed(), receipt) == [
        {"provider": provider.address, "node": node.address, "poolId": pool_id, "amount": SLASH}
    ]
    assert events(owner.pools.events.NodeEjected(), receipt) == [
        {"poolId": pool_id, "node": node.address, "by": owner.work.address, "kind": Ejection.BY_INVALIDATION}
    ]
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED
    assert owner.burned() == SLASH
    assert owner.lock_of(pool_id, node.address).amount == 100 * TOKEN - SLASH
    assert owner.escrow_of(pool_id) == 100 * TOKEN


def test_a_batch_of_one_is_challenged_with_an_empty_proof(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for, units=[42])
    assert tree.root == leaf_hash(tree.leaves[0])

    validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(0), Reason.HASH_MISMATCH)

    assert tree.proof(0).siblings == ()
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED


def test_nothing_in_an_invalidated_batch_is_paid(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, validator, pool_id, provider, node, tree, _ = setup(ledger_for)
    validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(0), Reason.PROOF_INVALID)
    chain.increase_time(WINDOW)

    with pytest.raises(ContractRevert) as info:
        owner.claim_batches(pool_id, node.address, [tree.root])

    assert_revert(info.value, "NodeEjected", poolId=pool_id, node=node.address)
    assert owner.balance_of(provider.address) == 0
    assert owner.escrow_of(pool_id) == 100 * TOKEN


def test_invalidating_a_refused_leaf_voids_the_batch(ledger_for: LedgerFor) -> None:
    """A refusal is no shield: a validator that finds the refused file clearly bad still slashes."""
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(1), Reason.PROOF_INVALID)

    validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(1), Reason.PROOF_INVALID)

    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED
    assert owner.burned() == SLASH


def test_a_leaf_whose_units_are_not_its_files_is_a_reason_2_invalidation(ledger_for: LedgerFor) -> None:
    """The leaf binds the units the worker claimed; the validator judges them against the file (off chain) and the
    contract records the verdict against the leaf the proof names."""
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for, units=[100, 999_999, 300])
    receipt = validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(1), Reason.BAD_FORMAT)
    ((invalidated),) = events(owner.work.events.BatchInvalidated(), receipt)
    assert (invalidated["leafIndex"], invalidated["reason"]) == (1, 2)


# --- invalidating a batch whose leaf list was never made available ---------------------------------------------


def test_invalidate_unavailable_batch_voids_it_burns_the_slash_and_ejects_the_node(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """No leaf to prove: the event names none (leafIndex NO_LEAF, workKey 0) and reason 8; the effects are those of
    an invalidation with a proof, the node's other batches voided too."""
    owner, validator, pool_id, provider, node, tree, _ = setup(ledger_for)
    other = batch("other", [7, 8])
    submitted(node, pool_id, other)

    receipt = validator.invalidate_unavailable_batch(pool_id, node.address, tree.root)

    assert events(owner.work.events.BatchInvalidated(), receipt) == [
        {
            "poolId": pool_id,
            "root": tree.root,
            "node": node.address,
            "validator": validator.address,
            "leafIndex": NO_LEAF,
            "workKey": bytes(32),
            "reason": Reason.FILE_UNAVAILABLE,
            "slashed": SLASH,
        }
    ]
    assert events(owner.registry.events.Slashed(), receipt) == [
        {"provider": provider.address, "node": node.address, "poolId": pool_id, "amount": SLASH}
    ]
    assert events(owner.pools.events.NodeEjected(), receipt) == [
        {"poolId": pool_id, "node": node.address, "by": owner.work.address, "kind": Ejection.BY_INVALIDATION}
    ]
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED
    # its other batch still reads PENDING: the ejection by invalidation is what voids it, at its claim
    assert owner.get_batch(pool_id, node.address, other.root).status == BatchStatus.PENDING
    assert owner.burned() == SLASH
    assert owner.lock_of(pool_id, node.address).amount == 100 * TOKEN - SLASH
    assert not owner.is_member(pool_id, node.address)
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:
        owner.claim_batches(pool_id, node.address, [other.root])
    assert_revert(info.value, "NodeEjected", poolId=pool_id, node=node.address)
    assert owner.balance_of(provider.address) == 0
    assert owner.escrow_of(pool_id) == 100 * TOKEN


def test_a_batch_with_a_refused_leaf_can_still_be_invalidated_as_unavailable(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(1), Reason.PROOF_INVALID)

    validator.invalidate_unavailable_batch(pool_id, node.address, tree.root)

    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.INVALIDATED
    assert owner.burned() == SLASH


# --- each revert of a challenge ------------------------------------------------------------------------------

Challenge = Callable[..., Any]  # (validator, pool, node, root, proof, reason, *, slot=None): the client's call
CHALLENGES: dict[str, Challenge] = {
    "invalidate": lambda v, pool, node, root, proof, reason, slot=None: v.invalidate_batch(
        pool, node, root, proof, reason, slot=slot
    ),
    "refuse": lambda v, pool, node, root, proof, reason, slot=None: v.refuse_leaf(
        pool, node, root, proof, reason, slot=slot
    ),
    # no leaf, no proof, no reason (8 always): only the batch's checks apply
    "unavailable": lambda v, pool, node, root, proof, reason, slot=None: v.invalidate_unavailable_batch(
        pool, node, root, slot=slot
    ),
}
both = pytest.mark.parametrize("challenge", ["invalidate", "refuse"])  # the challenges with a leaf and its proof
every = pytest.mark.parametrize("challenge", sorted(CHALLENGES))


def challenge_call(sender: Ledger, challenge: str, pool_id: int, node: str, tree: BatchTree, index: int) -> Any:
    """The bound contract function of `challenge` of leaf `index` (reason 4) of the batch in slot 0, for
    `transact_at`."""
    functions = sender.work.functions
    ref = (0, tree.root)
    if challenge == "unavailable":
        return functions.invalidateUnavailableBatch(pool_id, node, ref)
    function = functions.invalidateBatch if challenge == "invalidate" else functions.refuseLeaf
    return function(pool_id, node, ref, tree.proof(index).as_tuple(), int(Reason.STALE_STEP))


def assert_untouched(owner: Ledger, pool_id: int, node: Ledger, tree: BatchTree) -> None:
    record = owner.get_batch(pool_id, node.address, tree.root)
    assert (record.status, record.refused_units) == (BatchStatus.PENDING, 0)
    assert owner.burned() == 0
    assert owner.is_member(pool_id, node.address)


@both
@pytest.mark.parametrize("field", ["sibling", "work_key", "units", "index"])
def test_a_wrong_proof_reverts_invalid_proof(ledger_for: LedgerFor, challenge: str, field: str) -> None:
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    proof = tree.proof(2)
    leaf, siblings, index = proof.leaf, list(proof.siblings), proof.index
    if field == "sibling":
        siblings[1] = bytes(31) + b"\x01"
    elif field == "work_key":
        leaf = Leaf(tree.leaves[3].work_key, leaf.units)
    elif field == "units":
        leaf = Leaf(leaf.work_key, leaf.units + 1)
    else:
        index = 3  # leaf 2's proof at leaf 3's position
    wrong = LeafProof(index, leaf, tuple(siblings))

    with pytest.raises(ContractRevert) as info:
        CHALLENGES[challenge](validator, pool_id, node.address, tree.root, wrong, Reason.PROOF_INVALID)

    computed = root_of(leaf_hash(leaf), index, siblings)
    assert_revert(info.value, "InvalidProof", root=tree.root, index=index, computed=computed)
    assert_untouched(owner, pool_id, node, tree)


@both
def test_a_leaf_outside_the_tree_reverts_leaf_out_of_range(ledger_for: LedgerFor, challenge: str) -> None:
    """Five leaves make a tree of eight positions; a proof only reads the index's low three bits, so leaf 1's proof
    at index 9 would hash to the root: without the range check a leaf could be challenged under a second index."""
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    proof = tree.proof(1)
    aliased = LeafProof(1 + 8, proof.leaf, proof.siblings)
    assert root_of(leaf_hash(aliased.leaf), aliased.index, aliased.siblings) == tree.root

    for index, siblings in ((aliased.index, aliased.siblings), (5, proof.siblings)):  # 5: a padding position
        with pytest.raises(ContractRevert) as info:
            CHALLENGES[challenge](
                validator, pool_id, node.address, tree.root, LeafProof(index, proof.leaf, siblings), Reason.BAD_FORMAT
            )
        assert_revert(info.value, "LeafOutOfRange", root=tree.root, index=index, count=5)
    assert_untouched(owner, pool_id, node, tree)


@both
@pytest.mark.parametrize("change", ["shorter", "longer"])
def test_a_proof_of_the_wrong_length_reverts_proof_length_mismatch(
    ledger_for: LedgerFor, challenge: str, change: str
) -> None:
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    proof = tree.proof(4)
    siblings = proof.siblings[:-1] if change == "shorter" else (*proof.siblings, bytes(32))

    with pytest.raises(ContractRevert) as info:
        CHALLENGES[challenge](
            validator, pool_id, node.address, tree.root, LeafProof(4, proof.leaf, siblings), Reason.BAD_FORMAT
        )

    assert_revert(info.value, "ProofLengthMismatch", root=tree.root, length=len(siblings), expected=3)
    assert_untouched(owner, pool_id, node, tree)


def test_a_second_refusal_of_the_same_leaf_reverts_leaf_already_refused(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(4), Reason.PROOF_INVALID)

    with pytest.raises(ContractRevert) as info:
        validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(4), Reason.REWARD_MISMATCH)

    assert_revert(info.value, "LeafAlreadyRefused", poolId=pool_id, node=node.address, root=tree.root, index=4)
    assert owner.get_batch(pool_id, node.address, tree.root).refused_units == 500  # taken out once


@pytest.mark.parametrize("first", ["invalidate", "unavailable"])
@pytest.mark.parametrize("then", sorted(CHALLENGES))
def test_a_challenge_of_an_invalidated_batch_reverts_batch_not_pending(
    ledger_for: LedgerFor, first: str, then: str
) -> None:
    """One slash per batch, as one per work record: any leaf of a void batch, the shown one included, however it was
    invalidated."""
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    CHALLENGES[first](validator, pool_id, node.address, tree.root, tree.proof(0), Reason.HASH_MISMATCH)

    for index in (0, 2):
        with pytest.raises(ContractRevert) as info:
            CHALLENGES[then](validator, pool_id, node.address, tree.root, tree.proof(index), Reason.HASH_MISMATCH)
        assert_revert(
            info.value,
            "BatchNotPending",
            poolId=pool_id,
            node=node.address,
            root=tree.root,
            status=BatchStatus.INVALIDATED,
        )
    assert owner.burned() == SLASH


@every
def test_a_challenge_at_the_windows_end_reverts_batch_challenge_window_closed(
    chain: LocalChain, ledger_for: LedgerFor, challenge: str
) -> None:
    owner, validator, pool_id, _, node, tree, submitted_at = setup(ledger_for)
    call = challenge_call(validator, challenge, pool_id, node.address, tree, 2)

    with pytest.raises(ContractRevert) as info:
        transact_at(chain, validator, call, submitted_at + WINDOW)

    closed_at = submitted_at + WINDOW
    assert_revert(
        info.value, "BatchChallengeWindowClosed", poolId=pool_id, node=node.address, root=tree.root, closedAt=closed_at
    )
    assert_untouched(owner, pool_id, node, tree)


@every
def test_a_challenge_at_the_last_second_of_the_window_succeeds(
    chain: LocalChain, ledger_for: LedgerFor, challenge: str
) -> None:
    owner, validator, pool_id, _, node, tree, submitted_at = setup(ledger_for)
    call = challenge_call(validator, challenge, pool_id, node.address, tree, 2)

    transact_at(chain, validator, call, submitted_at + WINDOW - 1)

    record = owner.get_batch(pool_id, node.address, tree.root)
    expected = (BatchStatus.PENDING, 300) if challenge == "refuse" else (BatchStatus.INVALIDATED, 0)
    assert (record.status, record.refused_units) == expected


@every
def test_a_challenge_by_a_non_validator_reverts_not_validator(ledger_for: LedgerFor, challenge: str) -> None:
    owner, validator, pool_id, provider, node, tree, _ = setup(ledger_for)
    owner.set_validator(pool_id, validator.address, allowed=False)  # a dismissed validator
    for caller in (owner, provider, node, ledger_for(STRANGER), validator):
        with pytest.raises(ContractRevert) as info:
            CHALLENGES[challenge](caller, pool_id, node.address, tree.root, tree.proof(0), Reason.HASH_MISMATCH)
        assert_revert(info.value, "NotValidator", poolId=pool_id, caller=caller.address)
    assert_untouched(owner, pool_id, node, tree)


@both
@pytest.mark.parametrize("reason", [0, 9, 255])
def test_a_challenge_with_an_unknown_reason_reverts_invalid_reason(
    ledger_for: LedgerFor, challenge: str, reason: int
) -> None:
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    with pytest.raises(ContractRevert) as info:
        CHALLENGES[challenge](validator, pool_id, node.address, tree.root, tree.proof(0), reason)
    assert_revert(info.value, "InvalidReason", reason=reason)
    assert_untouched(owner, pool_id, node, tree)


@every
def test_a_challenge_of_an_unknown_batch_reverts_batch_not_found(ledger_for: LedgerFor, challenge: str) -> None:
    """A root the node never submitted (the client names slot 0 for it, the slot holding the node's batch), a root
    another node submitted, and a submitted root named in an empty slot."""
    owner, validator, pool_id, _, node, tree, _ = setup(ledger_for)
    other = batch("never-submitted", [1, 2, 3])
    cases = ((node.address, other.root, other.proof(0), 0), (owner.address, tree.root, tree.proof(0), 0))
    for who, root, proof, slot in (*cases, (node.address, tree.root, tree.proof(0), 1)):
        with pytest.raises(ContractRevert) as info:
            CHALLENGES[challenge](validator, pool_id, who, root, proof, Reason.HASH_MISMATCH, slot=slot)
        assert_revert(info.value, "BatchNotFound", poolId=pool_id, node=who, slot=slot, root=root)
    assert_untouched(owner, pool_id, node, tree)


@every
def test_a_challenge_of_a_claimed_batch_reverts_batch_not_pending(
    chain: LocalChain, ledger_for: LedgerFor, challenge: str
) -> None:
    """The status is checked before the window: a settled batch says so, not that its window closed."""
    owner, validator, pool_id, provider, node, tree, _ = setup(ledger_for)
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [tree.root])

    with pytest.raises(ContractRevert) as info:
        CHALLENGES[challenge](validator, pool_id, node.address, tree.root, tree.proof(0), Reason.HASH_MISMATCH)

    assert_revert(
        info.value, "BatchNotPending", poolId=pool_id, node=node.address, root=tree.root, status=BatchStatus.CLAIMED
    )
    assert owner.burned() == 0
    assert owner.balance_of(provider.address) == tree.total_units * REWARD


# --- refusing one file ---------------------------------------------------------------------------------------


def test_a_refused_leaf_is_taken_out_of_the_payout_and_nothing_else_moves(ledger_for: LedgerFor) -> None:
    owner, validator, pool_id, provider, node, tree, _ = setup(ledger_for)
    proof = tree.proof(2)

    receipt = validator.refuse_leaf(pool_id, node.address, tree.root, proof, Reason.PROOF_INVALID)

    assert events(owner.work.events.LeafRefused(), receipt) == [
        {
            "poolId": pool_id,
            "root": tree.root,
            "node": node.address,
            "validator": validator.address,
            "leafIndex": 2,
            "workKey": proof.leaf.work_key,
            "units": 300,
            "reason": 7,
        }
    ]
    for moved in (owner.registry.events.Slashed(), owner.pools.events.NodeEjected()):
        assert events(moved, receipt) == []
    record = owner.get_batch(pool_id, node.address, tree.root)
    assert (record.status, record.refused_units, record.payable_units) == (BatchStatus.PENDING, 300, 1200)
    assert [owner.is_leaf_refused(pool_id, node.address, tree.root, i) for i in range(5)] == [0, 0, 1, 0, 0]
    assert owner.is_member(pool_id, node.address)
    assert owner.stake_of(provider.address).active == 100 * TOKEN


def test_refused_leaves_far_apart_are_kept_apart(ledger_for: LedgerFor) -> None:
    """The bitmap spans words: leaves 0, 255, 256 and 299 of a batch of 300."""
    owner, validator, pool_id = funded_pool(ledger_for)
    node = onboard(owner, ledger_for(PROVIDER_A), dev_account(3), pool_id)
    tree = batch("wide", [1] * 300)
    submitted(node, pool_id, tree)

    for index in (0, 255, 256, 299):
        validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(index), Reason.PROOF_INVALID)

    refused = [i for i in range(300) if owner.is_leaf_refused(pool_id, node.address, tree.root, i)]
    assert refused == [0, 255, 256, 299]
    assert owner.get_batch(pool_id, node.address, tree.root).refused_units == 4


# --- claiming whole batches ----------------------------------------------------------------------------------


def test_claim_pays_each_batch_its_total_less_its_refused_leaves(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, validator, pool_id, provider, node, first, _ = setup(ledger_for)
    second = batch("second", [1000, 2000, 3000])
    submitted(node, pool_id, second)
    validator.refuse_leaf(pool_id, node.address, first.root, first.proof(0), Reason.PROOF_INVALID)
    validator.refuse_leaf(pool_id, node.address, first.root, first.proof(4), Reason.PROOF_INVALID)
    validator.refuse_leaf(pool_id, node.address, second.root, second.proof(1), Reason.PROOF_INVALID)
    chain.increase_time(WINDOW)

    receipt = ledger_for(STRANGER).claim_batches(pool_id, node.address, [first.root, second.root])  # anyone may

    amount = ((1500 - 600) + (6000 - 2000)) * REWARD
    assert events(owner.work.events.BatchesClaimed(), receipt) == [
        {
            "poolId": pool_id,
            "provider": provider.address,
            "node": node.address,
            "amount": amount,
            "batches": [{"slot": 0, "root": first.root}, {"slot": 1, "root": second.root}],
        }
    ]
    assert owner.balance_of(provider.address) == amount
    assert owner.escrow_of(pool_id) + amount == 100 * TOKEN
    for tree in (first, second):
        assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.CLAIMED


def test_a_leaf_claiming_more_than_its_batch_cannot_take_the_payout_below_zero(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """A batch whose leaves add up to more than its declared total (a reason-2 fault): refusing its largest leaf
    takes out at most what the batch has, so a claim never exceeds the batch's units, nor underflows."""
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    node = onboard(owner, provider, dev_account(3), pool_id)
    tree = batch("inflated", [10, 2**255, 30])
    node.submit_batch(pool_id, tree.root, tree.count, 50)

    validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(0), Reason.BAD_FORMAT)
    validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(1), Reason.BAD_FORMAT)

    assert owner.get_batch(pool_id, node.address, tree.root).refused_units == 50
    chain.increase_time(WINDOW)
    receipt = owner.claim_batches(pool_id, node.address, [tree.root])
    ((claimed),) = events(owner.work.events.BatchesClaimed(), receipt)
    assert claimed["amount"] == 0
    assert owner.escrow_of(pool_id) == 100 * TOKEN


def test_claim_before_the_windows_end_reverts_batch_challenge_window_open(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, _, pool_id, provider, node, tree, submitted_at = setup(ledger_for)
    call = owner.work.functions.claimBatches(pool_id, node.address, [(0, tree.root)])

    with pytest.raises(ContractRevert) as info:
        transact_at(chain, owner, call, submitted_at + WINDOW - 1)
    assert_revert(
        info.value,
        "BatchChallengeWindowOpen",
        poolId=pool_id,
        node=node.address,
        root=tree.root,
        closesAt=submitted_at + WINDOW,
    )

    transact_at(chain, owner, call, submitted_at + WINDOW)  # the window's end: claimable
    assert owner.balance_of(provider.address) == tree.total_units * REWARD


def test_claim_twice_reverts_batch_not_pending(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id, provider, node, tree, _ = setup(ledger_for)
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [tree.root])

    with pytest.raises(ContractRevert) as info:
        owner.claim_batches(pool_id, node.address, [tree.root])
    assert_revert(
        info.value, "BatchNotPending", poolId=pool_id, node=node.address, root=tree.root, status=BatchStatus.CLAIMED
    )
    assert owner.balance_of(provider.address) == tree.total_units * REWARD


def test_a_root_repeated_in_one_claim_is_paid_once(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id, provider, node, tree, _ = setup(ledger_for)
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:
        owner.claim_batches(pool_id, node.address, [tree.root, tree.root])
    assert_revert(
        info.value, "BatchNotPending", poolId=pool_id, node=node.address, root=tree.root, status=BatchStatus.CLAIMED
    )
    assert owner.balance_of(provider.address) == 0


def test_claim_of_an_unknown_batch_or_none_reverts(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id, _, node, tree, _ = setup(ledger_for)
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:
        owner.claim_batches(pool_id, node.address, [])
    assert_revert(info.value, "EmptyBatch")
    unknown = b"\x09" * 32
    with pytest.raises(ContractRevert) as info:
        owner.claim_batches(pool_id, node.address, [tree.root, unknown])
    assert_revert(info.value, "BatchNotFound", poolId=pool_id, node=node.address, slot=0, root=unknown)
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.PENDING  # the claim reverted whole


def test_claim_beyond_the_escrow_reverts_insufficient_escrow(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id, provider, node, tree, _ = setup(ledger_for, escrow_tokens=1)
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:
        owner.claim_batches(pool_id, node.address, [tree.root])
    assert_revert(info.value, "InsufficientEscrow", poolId=pool_id, needed=1500 * REWARD, available=TOKEN)
    assert owner.get_batch(pool_id, node.address, tree.root).status == BatchStatus.PENDING
    assert owner.balance_of(provider.address) == 0


def test_an_owners_ejection_leaves_the_nodes_batches_claimable(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id, provider, node, tree, _ = setup(ledger_for)
    owner.eject(pool_id, node.address)
    chain.increase_time(WINDOW)

    owner.claim_batches(pool_id, node.address, [tree.root])

    assert owner.balance_of(provider.address) == tree.total_units * REWARD
