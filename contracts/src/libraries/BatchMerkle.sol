// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";

/// @title BatchMerkle
/// @notice The Merkle tree of a batch of work: one leaf per rollout file, in the order the worker lists them.
/// @dev Positional, not sorted pairs: a leaf's index is the path from the root (bit i of the index says whether the
/// node is the right child at height i), so a proof names exactly one leaf and a challenge can be recorded against
/// that index. The tree is complete: `count` leaves are padded with zero words up to the next power of two, so every
/// proof of a tree is `depth(count)` siblings long. Leaves and interior nodes hash distinct prefixes (RFC 6962):
///   leaf = keccak256(0x00 || workKey || uint256(units))       (65 bytes)
///   node = keccak256(0x01 || left || right)                   (65 bytes)
/// so no interior node is ever a leaf's hash (that would take a keccak256 collision), besides the proof's length
/// being fixed by the count. A padding word (zero) is no leaf's hash either. The off-chain twin is `ledger/merkle.py`.
library BatchMerkle {
    /// @notice Siblings from a leaf to the root in a tree of `count` leaves: ceil(log2(count)), 0 for one leaf.
    function depth(uint256 count) internal pure returns (uint256) {
        return count <= 1 ? 0 : Math.log2(count - 1) + 1;
    }

    /// @notice The hash a leaf binding `workKey` (sha256 of the file) and its `units` has in the tree.
    function leafHash(bytes32 workKey, uint256 units) internal pure returns (bytes32 hash) {
        // 0x00 || workKey || units in the memory past the free pointer, which is left where it is
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore8(m, 0x00)
            mstore(add(m, 1), workKey)
            mstore(add(m, 33), units)
            hash := keccak256(m, 65)
        }
    }

    /// @notice The hash of an interior node whose children are `left` and `right`.
    function nodeHash(bytes32 left, bytes32 right) internal pure returns (bytes32 hash) {
        assembly ("memory-safe") {
            let m := mload(0x40)
            mstore8(m, 0x01)
            mstore(add(m, 1), left)
            mstore(add(m, 33), right)
            hash := keccak256(m, 65)
        }
    }

    /// @notice The root that `leaf` at `index` and its `siblings` (leaf level first) hash up to.
    /// @dev The caller checks `index < count` and `siblings.length == depth(count)`: then every bit of the index is
    /// consumed and the path is the leaf's own.
    function rootOf(bytes32 leaf, uint256 index, bytes32[] calldata siblings) internal pure returns (bytes32 node) {
        node = leaf;
        uint256 n = siblings.length;
        for (uint256 i; i < n; ++i) {
            node = index & 1 == 0 ? nodeHash(node, siblings[i]) : nodeHash(siblings[i], node);
            index >>= 1;
        }
    }
}
