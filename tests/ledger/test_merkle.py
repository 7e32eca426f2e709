"""ledger.merkle: a batch's tree on its own (every proof verifies, any flipped bit fails, an interior node never
passes as a leaf, odd counts, a batch of one, the encoding pinned) and against WorkLedger on anvil, which accepts
exactly the roots and proofs it builds."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from eth_utils import keccak
from hypothesis import given, settings
from hypothesis import strategies as st
from web3.exceptions import ContractLogicError

from ledger.accounts import dev_account
from ledger.client import Ledger
from ledger.errors import ContractRevert
from ledger.merkle import (
    PADDING,
    BatchTree,
    Leaf,
    LeafProof,
    MerkleError,
    depth,
    leaf_hash,
    node_hash,
    root_of,
    verify,
)
from ledger.tx import revert_from_exception
from ledger.types import Reason
from tests.ledger.helpers import assert_revert, make_pool, onboard

LedgerFor = Callable[[int], Ledger]


def leaves(count: int, seed: str = "leaf") -> list[Leaf]:
    return [Leaf(hashlib.sha256(f"{seed}-{i}".encode()).digest(), 1000 + i) for i in range(count)]


def flipped(data: bytes, bit: int) -> bytes:
    return (int.from_bytes(data, "big") ^ (1 << bit)).to_bytes(len(data), "big")


# --- the tree on its own ------------------------------------------------------------------------------------


def test_the_encoding_is_pinned_by_a_tree_of_three_built_by_hand() -> None:
    a, b, c = leaves(3)
    hashed = [keccak(b"\x00" + leaf.work_key + leaf.units.to_bytes(32, "big")) for leaf in (a, b, c)]
    expected = keccak(
        b"\x01" + keccak(b"\x01" + hashed[0] + hashed[1]) + keccak(b"\x01" + hashed[2] + bytes(32))
    )  # padded with a zero word to four leaves

    tree = BatchTree([a, b, c])

    assert tree.root == expected
    assert tree.proof(2).siblings == (bytes(32), keccak(b"\x01" + hashed[0] + hashed[1]))


@pytest.mark.parametrize(
    ("count", "expected"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (1024, 10), (1025, 11)]
)
def test_depth_is_the_ceiling_of_log2_of_the_count(count: int, expected: int) -> None:
    assert depth(count) == expected
    assert len(BatchTree(leaves(count)).proof(count - 1).siblings) == expected


def test_a_batch_of_one_is_its_leaf_with_an_empty_proof() -> None:
    (leaf,) = leaves(1)
    tree = BatchTree([leaf])
    assert tree.root == leaf_hash(leaf)
    assert tree.proof(0) == LeafProof(0, leaf, ())
    assert verify(tree.root, 1, tree.proof(0))


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 70))
def test_every_leaf_of_any_count_verifies_and_only_at_its_own_index(count: int) -> None:
    tree = BatchTree(leaves(count))
    for index in range(count):
        proof = tree.proof(index)
        assert verify(tree.root, count, proof)
        if count > 1:
            other = (index + 1) % count
            assert not verify(tree.root, count, LeafProof(other, proof.leaf, proof.siblings))
        assert not verify(tree.root, count, LeafProof(index + (1 << depth(count)), proof.leaf, proof.siblings))
        assert not verify(tree.root, count + (1 << depth(count)), proof)  # another count: another proof length


@settings(max_examples=40, deadline=None)
@given(count=st.integers(1, 40), data=st.data())
def test_any_flipped_bit_of_a_proof_fails(count: int, data: st.DataObject) -> None:
    tree = BatchTree(leaves(count))
    index = data.draw(st.integers(0, count - 1))
    proof = tree.proof(index)
    fields = ["work_key", "units", "root"] + (["sibling"] if proof.siblings else [])
    field = data.draw(st.sampled_from(fields))
    bit = data.draw(st.integers(0, 255))
    root = tree.root
    if field == "work_key":
        proof = LeafProof(index, Leaf(flipped(proof.leaf.work_key, bit), proof.leaf.units), proof.siblings)
    elif field == "units":
        proof = LeafProof(index, Leaf(proof.leaf.work_key, proof.leaf.units ^ (1 << bit)), proof.siblings)
    elif field == "root":
        root = flipped(root, bit)
    else:
        level = data.draw(st.integers(0, len(proof.siblings) - 1))
        siblings = list(proof.siblings)
        siblings[level] = flipped(siblings[level], bit)
        proof = LeafProof(index, proof.leaf, tuple(siblings))
    assert not verify(root, count, proof), f"{field} bit {bit} flipped still verifies"


@pytest.mark.parametrize("count", [2, 3, 5, 8, 13])
def test_an_interior_node_never_passes_as_a_leaf(count: int) -> None:
    """The second-preimage attack on a Merkle tree: an interior node's children (left, right) presented as a leaf's
    (work key, units), with the siblings above it. Leaves and nodes hash different prefixes, so the forged leaf's
    hash is not the node's, and its proof is short besides."""
    tree = BatchTree(leaves(count))
    for height in range(1, len(tree.levels)):  # the root included
        for position, node in enumerate(tree.levels[height]):
            left, right = tree.levels[height - 1][2 * position], tree.levels[height - 1][2 * position + 1]
            forged = Leaf(left, int.from_bytes(right, "big"))
            assert node_hash(left, right) == node
            assert leaf_hash(forged) != node
            above = tuple(level[position_at ^ 1] for level, position_at in _path(tree, height, position))
            assert root_of(leaf_hash(forged), position, above) != tree.root
            assert not verify(tree.root, count, LeafProof(position, forged, above))


def _path(tree: BatchTree, height: int, position: int) -> list[tuple[tuple[bytes, ...], int]]:
    """The levels from `height` up to below the root, with the position of the node's ancestor on each."""
    return [(tree.levels[h], position >> (h - height)) for h in range(height, len(tree.levels) - 1)]


def test_padding_is_no_leaf_and_outside_the_count() -> None:
    tree = BatchTree(leaves(5))
    assert tree.levels[0][5:] == (PADDING,) * 3
    assert PADDING not in {leaf_hash(leaf) for leaf in tree.leaves}
    with pytest.raises(MerkleError, match="leaf 5 is outside a batch of 5"):
        tree.proof(5)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: BatchTree([]), "1 to 4294967295 leaves, got 0"),
        (lambda: Leaf(b"\x01" * 31, 1), "32 bytes, got 31"),
        (lambda: Leaf(b"\x01" * 32, -1), "do not fit a uint256"),
        (lambda: Leaf(b"\x01" * 32, 2**256), "do not fit a uint256"),
        (lambda: BatchTree(leaves(3)).proof(-1), "leaf -1 is outside"),
    ],
)
def test_what_cannot_be_built_raises_merkle_error(make: Callable[[], object], message: str) -> None:
    with pytest.raises(MerkleError, match=message):
        make()


# --- against the contract -----------------------------------------------------------------------------------


def simulate_refusal(validator: Ledger, pool_id: int, node: str, root: bytes, proof: LeafProof) -> None:
    """refuseLeaf of the batch in the node's slot 0 as an eth_call: the contract's whole check of the proof, without
    mining (so every leaf can be tried against one batch). Raises ContractRevert when the contract refuses."""
    ref = (0, root)
    call = validator.work.functions.refuseLeaf(pool_id, node, ref, proof.as_tuple(), int(Reason.PROOF_INVALID))
    try:
        call.call({"from": validator.address})
    except ContractLogicError as exc:
        raise revert_from_exception(exc, "refuseLeaf") from exc


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 33])
def test_the_contract_accepts_every_proof_the_module_builds_and_refuses_tampered_ones(
    ledger_for: LedgerFor, count: int
) -> None:
    owner, validator = ledger_for(0), ledger_for(9)
    pool_id = make_pool(owner)
    owner.set_validator(pool_id, validator.address)
    node = onboard(owner, ledger_for(1), dev_account(3), pool_id)
    tree = BatchTree(leaves(count, seed=f"chain-{count}"))
    node.submit_batch(pool_id, tree.root, tree.count, tree.total_units)

    for index in range(count):
        proof = tree.proof(index)
        simulate_refusal(validator, pool_id, node.address, tree.root, proof)  # accepted
        tampered = LeafProof(index, Leaf(proof.leaf.work_key, proof.leaf.units + 1), proof.siblings)
        assert not verify(tree.root, count, tampered)
        with pytest.raises(ContractRevert) as info:
            simulate_refusal(validator, pool_id, node.address, tree.root, tampered)
        computed = root_of(leaf_hash(tampered.leaf), index, tampered.siblings)
        assert_revert(info.value, "InvalidProof", root=tree.root, index=index, computed=computed)
