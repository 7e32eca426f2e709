"""A node's batch slots on a real chain: a slot takes a new batch once its batch is settled (claimed; an invalidated
batch's slot never, its node is ejected), a pending one refuses it, every call names a batch by (slot, root) and a
slot that holds another root is `BatchNotFound`; the events carry the slots; the client finds free slots and the
slot of a root."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert, LedgerError
from ledger.merkle import BatchTree
from ledger.types import BatchStatus, Reason
from tests.conftest import TOKEN
from tests.ledger.helpers import assert_revert, events, onboard
from tests.ledger.test_batches import (
    CHALLENGES,
    PROVIDER_A,
    REWARD,
    SLASH,
    STRANGER,
    WINDOW,
    batch,
    funded_pool,
)

LedgerFor = Callable[[int], Ledger]
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"


def member(ledger_for: LedgerFor) -> tuple[Ledger, Ledger, int, Ledger, Ledger]:
    """(owner, validator, pool id, provider, node): a funded pool with one member node and no batch yet."""
    owner, validator, pool_id = funded_pool(ledger_for)
    provider = ledger_for(PROVIDER_A)
    return owner, validator, pool_id, provider, onboard(owner, provider, dev_account(3), pool_id)


def submit(node: Ledger, pool_id: int, tree: BatchTree, slot: int | None = None, total: int | None = None) -> Any:
    return node.submit_batch(pool_id, tree.root, tree.count, tree.total_units if total is None else total, slot=slot)


def pending_record(owner: Ledger, pool_id: int, node: Ledger, slot: int) -> tuple[bytes, int, int, BatchStatus]:
    record = owner.get_slot(pool_id, node.address, slot)
    return record.root, record.total_units, record.refused_units, record.status


# --- reuse of a settled slot ---------------------------------------------------------------------------------


def test_a_claimed_slot_takes_a_new_batch_and_the_old_root_is_then_not_found(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """The new batch's second word is written whole: the old batch's refused units are not carried over (the new
    one is paid its whole total). The old root is gone from the slot for every call that names it; its refused-leaf
    bit, keyed by the root, still reads."""
    owner, validator, pool_id, provider, node = member(ledger_for)
    old, new = batch("old", [100, 200, 300]), batch("new", [7, 8])
    submit(node, pool_id, old)
    validator.refuse_leaf(pool_id, node.address, old.root, old.proof(2), Reason.PROOF_INVALID, slot=0)
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [old.root], slots=[0])
    assert owner.balance_of(provider.address) == 300 * REWARD

    receipt = submit(node, pool_id, new, slot=0)

    ((submitted),) = events(owner.work.events.BatchSubmitted(), receipt)
    assert (submitted["slot"], submitted["root"]) == (0, new.root)
    record = owner.get_slot(pool_id, node.address, 0)
    block_time = owner.w3.eth.get_block(receipt["blockNumber"])["timestamp"]
    assert (record.root, record.count, record.total_units, record.refused_units, record.status) == (
        new.root,
        2,
        15,
        0,
        BatchStatus.PENDING,
    )
    assert record.submitted_at == block_time
    for challenge in sorted(CHALLENGES):
        with pytest.raises(ContractRevert) as info:
            CHALLENGES[challenge](
                validator, pool_id, node.address, old.root, old.proof(0), Reason.HASH_MISMATCH, slot=0
            )
        assert_revert(info.value, "BatchNotFound", poolId=pool_id, node=node.address, slot=0, root=old.root)
    assert owner.is_leaf_refused(pool_id, node.address, old.root, 2)
    assert owner.get_batch(pool_id, node.address, old.root, slot=0).status == BatchStatus.NONE
    chain.increase_time(WINDOW)
    with pytest.raises(ContractRevert) as info:
        owner.claim_batches(pool_id, node.address, [old.root], slots=[0])
    assert_revert(info.value, "BatchNotFound", poolId=pool_id, node=node.address, slot=0, root=old.root)

    owner.claim_batches(pool_id, node.address, [new.root], slots=[0])

    assert owner.balance_of(provider.address) == (300 + 15) * REWARD
    assert owner.get_slot(pool_id, node.address, 0).status == BatchStatus.CLAIMED


def test_a_slot_whose_batch_was_invalidated_is_never_reused_the_node_is_ejected(ledger_for: LedgerFor) -> None:
    """An invalidated batch is settled, so its slot would take a new batch; but the invalidation ejected the node for
    good, so no slot of it ever takes one again in the pool, and the void record stays."""
    owner, validator, pool_id, _, node = member(ledger_for)
    bad, later = batch("bad", [10, 20]), batch("later", [5])
    submit(node, pool_id, bad)
    validator.invalidate_batch(pool_id, node.address, bad.root, bad.proof(1), Reason.BAD_FORMAT, slot=0)

    for slot in (0, 1):
        with pytest.raises(ContractRevert) as info:
            submit(node, pool_id, later, slot=slot)
        assert_revert(info.value, "NotPoolMember", poolId=pool_id, node=node.address)
    with pytest.raises(ContractRevert) as info:
        node.join(pool_id)
    assert_revert(info.value, "EjectedFromPool", poolId=pool_id, node=node.address)
    assert pending_record(owner, pool_id, node, 0) == (bad.root, 30, 0, BatchStatus.INVALIDATED)
    assert owner.get_slot(pool_id, node.address, 1).status == BatchStatus.NONE


def test_a_pending_slot_past_its_window_still_reverts_slot_in_use(chain: LocalChain, ledger_for: LedgerFor) -> None:
    """A batch ripe for its claim but not claimed is still pending: only the claim settles it. A refused leaf leaves
    it pending too."""
    owner, validator, pool_id, _, node = member(ledger_for)
    held, newer = batch("held", [1, 2, 3]), batch("newer", [4])
    submit(node, pool_id, held)
    validator.refuse_leaf(pool_id, node.address, held.root, held.proof(0), Reason.PROOF_INVALID, slot=0)
    chain.increase_time(2 * WINDOW)

    with pytest.raises(ContractRevert) as info:
        submit(node, pool_id, newer, slot=0)

    assert_revert(info.value, "SlotInUse", poolId=pool_id, node=node.address, slot=0, root=held.root)
    assert pending_record(owner, pool_id, node, 0) == (held.root, 6, 1, BatchStatus.PENDING)


# --- one root, two slots --------------------------------------------------------------------------------------


def test_the_same_root_in_two_slots_of_one_node_is_two_records(chain: LocalChain, ledger_for: LedgerFor) -> None:
    """The chain does not refuse a root its node holds in another slot: each slot is its own record, claimed on its
    own terms. It is the validators that keep a file from being paid twice: they condemn the second record as naming
    files the node submitted before (reason 3, `validator.batches`), inside its window."""
    owner, _, pool_id, provider, node = member(ledger_for)
    tree = batch("twice", [10, 20])
    submit(node, pool_id, tree)
    receipt = submit(node, pool_id, tree, total=25)  # the lowest free slot: 1

    ((submitted),) = events(owner.work.events.BatchSubmitted(), receipt)
    assert submitted["slot"] == 1
    assert pending_record(owner, pool_id, node, 0) == (tree.root, 30, 0, BatchStatus.PENDING)
    assert pending_record(owner, pool_id, node, 1) == (tree.root, 25, 0, BatchStatus.PENDING)
    assert owner.slot_of(pool_id, node.address, tree.root) == 1  # the client's lookup: the latest submission
    chain.increase_time(WINDOW)

    receipt = owner.claim_batches(pool_id, node.address, [tree.root, tree.root], slots=[0, 1])

    ((claimed),) = events(owner.work.events.BatchesClaimed(), receipt)
    assert claimed["batches"] == [{"slot": 0, "root": tree.root}, {"slot": 1, "root": tree.root}]
    assert claimed["amount"] == owner.balance_of(provider.address) == (30 + 25) * REWARD


def test_the_second_record_of_a_root_is_invalidated_alone(ledger_for: LedgerFor) -> None:
    """Reason 3 against the record that names the files a second time: that record is void, the first stays as it
    was (the node's ejection is what voids it, at its claim)."""
    owner, validator, pool_id, _, node = member(ledger_for)
    tree = batch("named twice", [10, 20])
    submit(node, pool_id, tree, slot=0)
    submit(node, pool_id, tree, slot=4)

    validator.invalidate_batch(pool_id, node.address, tree.root, tree.proof(0), Reason.WRONG_ASSIGNMENT, slot=4)

    assert pending_record(owner, pool_id, node, 0) == (tree.root, 30, 0, BatchStatus.PENDING)
    assert pending_record(owner, pool_id, node, 4) == (tree.root, 30, 0, BatchStatus.INVALIDATED)
    assert owner.burned() == SLASH


def test_a_root_submitted_again_finds_its_leaves_refused_before_still_refused_and_its_record_pays_them(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """The refused-leaf bitmap is keyed by the node's root, not by its slot: a root submitted again (here into the
    slot its first record was claimed from) reads its earlier refusal through `isLeafRefused`, and that leaf cannot be
    refused in the new record (LeafAlreadyRefused), whose refused units start at zero: a claim pays it in full. In
    practice the validators condemn such a second record whole (reason 3: files named twice) inside its window."""
    owner, validator, pool_id, provider, node = member(ledger_for)
    tree = batch("again", [100, 200])
    submit(node, pool_id, tree)
    validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(1), Reason.PROOF_INVALID, slot=0)
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [tree.root], slots=[0])
    submit(node, pool_id, tree, slot=0)

    with pytest.raises(ContractRevert) as info:
        validator.refuse_leaf(pool_id, node.address, tree.root, tree.proof(1), Reason.PROOF_INVALID, slot=0)

    assert_revert(info.value, "LeafAlreadyRefused", poolId=pool_id, node=node.address, root=tree.root, index=1)
    assert owner.is_leaf_refused(pool_id, node.address, tree.root, 1)
    assert pending_record(owner, pool_id, node, 0) == (tree.root, 300, 0, BatchStatus.PENDING)
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [tree.root], slots=[0])
    assert owner.balance_of(provider.address) == (100 + 300) * REWARD


# --- the events and the view name the slot --------------------------------------------------------------------


def test_batch_submitted_carries_the_slot_and_batches_claimed_the_slot_root_pairs(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    owner, _, pool_id, _, node = member(ledger_for)
    a, b, c, d = (batch(label, [1, 2]) for label in "abcd")
    slots = []
    for tree, slot in ((a, None), (b, None), (c, 5)):
        ((submitted),) = events(owner.work.events.BatchSubmitted(), submit(node, pool_id, tree, slot=slot))
        slots.append((submitted["root"], submitted["slot"]))
    assert slots == [(a.root, 0), (b.root, 1), (c.root, 5)]
    chain.increase_time(WINDOW)

    receipt = ledger_for(STRANGER).claim_batches(pool_id, node.address, [c.root, a.root], slots=[5, 0])

    ((claimed),) = events(owner.work.events.BatchesClaimed(), receipt)
    assert [(ref["slot"], ref["root"]) for ref in claimed["batches"]] == [(5, c.root), (0, a.root)]
    ((submitted),) = events(owner.work.events.BatchSubmitted(), submit(node, pool_id, d))  # slot 0 is free again
    assert (submitted["slot"], submitted["root"]) == (0, d.root)


def test_get_batch_of_a_slot_returns_the_root_it_holds(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id, provider, node = member(ledger_for)
    first, second = batch("first", [3]), batch("second", [4, 5])
    get_batch = owner.work.functions.getBatch
    assert get_batch(pool_id, node.address, 0).call() == [bytes(32), ZERO_ADDRESS, 0, 0, 0, 0, BatchStatus.NONE]

    submit(node, pool_id, first, slot=2)
    at = owner.get_slot(pool_id, node.address, 2).submitted_at

    assert get_batch(pool_id, node.address, 2).call() == [first.root, provider.address, 1, 3, 0, at, 1]
    assert get_batch(pool_id, node.address, 0).call()[0] == bytes(32)
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [first.root], slots=[2])
    submit(node, pool_id, second, slot=2)
    assert get_batch(pool_id, node.address, 2).call()[:3] == [second.root, provider.address, 2]


def test_a_claim_naming_a_slot_that_holds_another_root_reverts_batch_not_found(
    chain: LocalChain, ledger_for: LedgerFor
) -> None:
    """Both roots are the node's pending batches, each in its own slot: swapped, neither is found, and the claim
    reverts whole."""
    owner, _, pool_id, provider, node = member(ledger_for)
    a, b = batch("in slot 0", [10]), batch("in slot 1", [20])
    submit(node, pool_id, a)
    submit(node, pool_id, b)
    chain.increase_time(WINDOW)

    for roots, slots, missing in (([b.root], [0], (0, b.root)), ([a.root, a.root], [0, 1], (1, a.root))):
        with pytest.raises(ContractRevert) as info:
            owner.claim_batches(pool_id, node.address, roots, slots=slots)
        slot, root = missing
        assert_revert(info.value, "BatchNotFound", poolId=pool_id, node=node.address, slot=slot, root=root)
    assert owner.balance_of(provider.address) == 0
    assert [owner.get_slot(pool_id, node.address, s).status for s in (0, 1)] == [BatchStatus.PENDING] * 2

    owner.claim_batches(pool_id, node.address, [a.root, b.root], slots=[0, 1])
    assert owner.balance_of(provider.address) == 30 * REWARD


# --- the client's slot lookups ---------------------------------------------------------------------------------


def test_free_slot_is_the_lowest_slot_not_pending(chain: LocalChain, ledger_for: LedgerFor) -> None:
    owner, _, pool_id, _, node = member(ledger_for)
    trees = [batch(f"free-{i}", [i + 1]) for i in range(4)]
    for tree in trees[:3]:
        submit(node, pool_id, tree)
    assert node.free_slot(pool_id) == owner.free_slot(pool_id, node.address) == 3
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [trees[1].root], slots=[1])

    assert node.free_slot(pool_id) == 1
    ((submitted),) = events(owner.work.events.BatchSubmitted(), submit(node, pool_id, trees[3]))
    assert submitted["slot"] == 1
    assert node.free_slot(pool_id) == 3


def test_the_client_names_a_root_by_the_slot_of_its_latest_submission(chain: LocalChain, ledger_for: LedgerFor) -> None:
    """`slot=None` reads the node's latest BatchSubmitted of the root; a root written over reads NONE, and a root
    never submitted is named in slot 0, where the chain finds another batch."""
    owner, validator, pool_id, provider, node = member(ledger_for)
    old, new, other, absent = (
        batch(label, [units]) for units, label in enumerate(("old", "new", "other", "absent"), 1)
    )
    submit(node, pool_id, old, slot=3)
    assert owner.slot_of(pool_id, node.address, old.root) == 3
    assert owner.get_batch(pool_id, node.address, old.root).slot == 3
    chain.increase_time(WINDOW)
    owner.claim_batches(pool_id, node.address, [old.root])  # found in slot 3
    submit(node, pool_id, new, slot=3)
    submit(node, pool_id, other, slot=0)

    assert owner.get_batch(pool_id, node.address, old.root).status == BatchStatus.NONE
    assert owner.get_batch(pool_id, node.address, new.root).status == BatchStatus.PENDING
    assert owner.slot_of(pool_id, node.address, absent.root) is None
    with pytest.raises(ContractRevert) as info:
        validator.refuse_leaf(pool_id, node.address, absent.root, absent.proof(0), Reason.PROOF_INVALID)
    assert_revert(info.value, "BatchNotFound", poolId=pool_id, node=node.address, slot=0, root=absent.root)
    assert owner.balance_of(provider.address) == REWARD
    assert owner.escrow_of(pool_id) == 100 * TOKEN - REWARD


def test_claim_batches_with_as_many_slots_as_roots_only(ledger_for: LedgerFor) -> None:
    owner, _, pool_id, _, node = member(ledger_for)
    tree = batch("one", [1])
    with pytest.raises(LedgerError, match="2 roots but 1 slots"):
        owner.claim_batches(pool_id, node.address, [tree.root, tree.root], slots=[0])
