"""A batch's Merkle tree, built exactly as `contracts/src/libraries/BatchMerkle.sol` checks it.

One leaf per rollout file, in the order the worker lists them; the root, the leaf count and the total units are
what `WorkLedger.submitBatch` records, and a validator challenges one file with its `LeafProof`:

    leaf = keccak256(0x00 || work_key || units as uint256)    node = keccak256(0x01 || left || right)

The tree is positional and complete: the leaves are padded with zero words up to the next power of two, a leaf's
index is its path from the root, and every proof of a tree of n leaves is ceil(log2(n)) siblings long, leaf level
first. The distinct prefixes keep an interior node from passing as a leaf (docs/contracts.md says why each choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from eth_utils import keccak

from ledger.errors import LedgerError

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
PADDING = bytes(32)  # the value of a leaf position past the count; no leaf's hash (that needs keccak256 to give 0)
MAX_LEAVES = 2**32 - 1  # WorkLedger.MAX_LEAVES: a record stores the count in 32 bits
UINT256 = 2**256


class MerkleError(LedgerError):
    """A batch or a proof that cannot be built: no leaves, too many, a leaf index outside the tree, a bad field."""


@dataclass(frozen=True)
class Leaf:
    """One file of a batch: its work key (sha256 of the file's bytes) and its units (output tokens)."""

    work_key: bytes
    units: int

    def __post_init__(self) -> None:
        if len(self.work_key) != 32:
            raise MerkleError(f"a work key is 32 bytes, got {len(self.work_key)}")
        if not 0 <= self.units < UINT256:
            raise MerkleError(f"units {self.units} do not fit a uint256")


@dataclass(frozen=True)
class LeafProof:
    """`IWorkLedger.LeafProof`: leaf `index` of a batch and the siblings from it up to the root, leaf level first."""

    index: int
    leaf: Leaf
    siblings: tuple[bytes, ...]

    def as_tuple(self) -> tuple[int, bytes, int, list[bytes]]:
        """The struct as web3 passes it to `invalidateBatch` and `refuseLeaf`."""
        return (self.index, self.leaf.work_key, self.leaf.units, list(self.siblings))


def leaf_hash(leaf: Leaf) -> bytes:
    return keccak(LEAF_PREFIX + leaf.work_key + leaf.units.to_bytes(32, "big"))


def node_hash(left: bytes, right: bytes) -> bytes:
    return keccak(NODE_PREFIX + left + right)


def depth(count: int) -> int:
    """Siblings in every proof of a tree of `count` leaves: ceil(log2(count)), 0 for one leaf."""
    if count < 1:
        raise MerkleError(f"a batch holds at least one leaf, got {count}")
    return (count - 1).bit_length()


def root_of(leaf_digest: bytes, index: int, siblings: Sequence[bytes]) -> bytes:
    """What `BatchMerkle.rootOf` computes: the root a leaf's hash at `index` and its siblings hash up to."""
    node = leaf_digest
    for sibling in siblings:
        node = node_hash(node, sibling) if index & 1 == 0 else node_hash(sibling, node)
        index >>= 1
    return node


def verify(root: bytes, count: int, proof: LeafProof) -> bool:
    """Whether `WorkLedger` accepts `proof` against a batch of `count` leaves with `root`: the index inside the
    tree, exactly `depth(count)` siblings, and the leaf hashing up to the root."""
    if not 0 <= proof.index < count or len(proof.siblings) != depth(count):
        return False
    return root_of(leaf_hash(proof.leaf), proof.index, proof.siblings) == root


class BatchTree:
    """The tree of a batch's leaves, in their order; `levels[0]` are the padded leaf hashes, `levels[-1]` the root."""

    def __init__(self, leaves: Sequence[Leaf]) -> None:
        if not 1 <= len(leaves) <= MAX_LEAVES:
            raise MerkleError(f"a batch holds 1 to {MAX_LEAVES} leaves, got {len(leaves)}")
        self.leaves = tuple(leaves)

    @property
    def count(self) -> int:
        return len(self.leaves)

    @property
    def total_units(self) -> int:
        return sum(leaf.units for leaf in self.leaves)

    @cached_property
    def levels(self) -> tuple[tuple[bytes, ...], ...]:
        width = 1 << depth(self.count)
        level = [leaf_hash(leaf) for leaf in self.leaves] + [PADDING] * (width - self.count)
        levels = [tuple(level)]
        while len(level) > 1:
            level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
            levels.append(tuple(level))
        return tuple(levels)

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def proof(self, index: int) -> LeafProof:
        """Leaf `index`'s proof, as `invalidateBatch` and `refuseLeaf` take it."""
        if not 0 <= index < self.count:
            raise MerkleError(f"leaf {index} is outside a batch of {self.count}")
        siblings = tuple(level[(index >> height) ^ 1] for height, level in enumerate(self.levels[:-1]))
        return LeafProof(index, self.leaves[index], siblings)
