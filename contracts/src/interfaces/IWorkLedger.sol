// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IWorkLedger
/// @notice Reward escrow, submitted work (one Merkle root per batch), the challenge window and claims.
interface IWorkLedger {
    /// @notice A batch record's status. `Pending` until invalidated (the whole batch void) or claimed; a refused
    /// leaf leaves its batch pending and only takes its units out of the payout.
    enum BatchStatus {
        None,
        Pending,
        Invalidated,
        Claimed
    }

    /// @notice A batch as its node's slot `slot` holds it: the slot and the batch's Merkle `root`. Every call that
    /// names a batch names both: a slot is reused once its batch is settled, so the root says which batch is meant.
    struct BatchRef {
        uint256 slot;
        bytes32 root;
    }

    /// @notice One leaf of a batch and its Merkle proof (`BatchMerkle`): the file's `workKey` and `units` at
    /// position `index`, and the `siblings` from the leaf up to the root, leaf level first.
    struct LeafProof {
        uint256 index;
        bytes32 workKey;
        uint256 units;
        bytes32[] siblings;
    }

    event RewardsFunded(uint256 indexed poolId, address indexed funder, uint256 amount);
    /// @notice `node` committed a batch of `count` files worth `totalUnits` under the Merkle root `root`, in its
    /// batch slot `slot`.
    /// @dev No `provider`: a node's binding is permanent, so a reader that needs it asks
    /// `NodeRegistry.providerOf(node)` once per node (or `getBatch`); 32 bytes less data cost every batch 256 gas.
    event BatchSubmitted(
        uint256 indexed poolId,
        bytes32 indexed root,
        address indexed node,
        uint256 slot,
        uint256 count,
        uint256 totalUnits
    );
    /// @notice `validator` showed leaf `leafIndex` (file `workKey`) of `node`'s batch `root` bad: the batch is void,
    /// `slashed` tokens of the node's lock in the pool were burned and the node was ejected.
    /// @dev An invalidation that names no leaf, `invalidateUnavailableBatch` (the batch's leaf list was never made
    /// available), has `leafIndex = type(uint256).max` (`WorkLedger.NO_LEAF`: no batch holds that many leaves),
    /// `workKey = 0` and `reason = 8` (file unavailable). Its effects are every other invalidation's.
    event BatchInvalidated(
        uint256 indexed poolId,
        bytes32 indexed root,
        address indexed node,
        address validator,
        uint256 leafIndex,
        bytes32 workKey,
        uint8 reason,
        uint256 slashed
    );
    /// @notice `validator` refused leaf `leafIndex` (file `workKey`, `units`) of `node`'s batch `root` without a
    /// slash: those units are not paid; the rest of the batch is.
    event LeafRefused(
        uint256 indexed poolId,
        bytes32 indexed root,
        address indexed node,
        address validator,
        uint256 leafIndex,
        bytes32 workKey,
        uint256 units,
        uint8 reason
    );
    /// @notice `provider` was paid `amount` for `node`'s batches `batches`.
    event BatchesClaimed(
        uint256 indexed poolId, address indexed provider, address indexed node, uint256 amount, BatchRef[] batches
    );
    error ZeroAmount();
    error ZeroAddress();
    error PoolNotFound(uint256 poolId);
    error NotPoolMember(uint256 poolId, address node);
    error UnitsOutOfRange(uint256 units, uint256 max);
    error EmptyBatch();
    /// @dev The node was ejected from the pool by an invalidation: its pending work is void. (An owner's ejection
    /// voids nothing.)
    error NodeEjected(uint256 poolId, address node);
    error NotValidator(uint256 poolId, address caller);
    error InvalidReason(uint8 reason);
    error InsufficientEscrow(uint256 poolId, uint256 needed, uint256 available);
    /// @dev A batch holds 1 to `max` leaves.
    error LeafCountOutOfRange(uint256 count, uint256 max);
    /// @dev The node's slot `slot` holds its pending batch `root`: a slot takes a new batch once its batch is settled.
    error SlotInUse(uint256 poolId, address node, uint256 slot, bytes32 root);
    /// @dev The node's slot `slot` does not hold the batch `root` (never submitted there, or written over since).
    error BatchNotFound(uint256 poolId, address node, uint256 slot, bytes32 root);
    error BatchNotPending(uint256 poolId, address node, bytes32 root, BatchStatus status);
    error BatchChallengeWindowClosed(uint256 poolId, address node, bytes32 root, uint64 closedAt);
    error BatchChallengeWindowOpen(uint256 poolId, address node, bytes32 root, uint64 closesAt);
    /// @dev A challenge named leaf `index` of a batch of `count` leaves.
    error LeafOutOfRange(bytes32 root, uint256 index, uint256 count);
    /// @dev A proof of a leaf in a batch of n leaves has exactly ceil(log2(n)) siblings.
    error ProofLengthMismatch(bytes32 root, uint256 length, uint256 expected);
    /// @dev The leaf and its siblings hash to `computed`, not to the batch's `root`.
    error InvalidProof(bytes32 root, uint256 index, bytes32 computed);
    /// @dev Leaf `index` of the batch was refused before: a leaf is refused at most once.
    error LeafAlreadyRefused(uint256 poolId, address node, bytes32 root, uint256 index);

    /// @notice Adds `amount` tokens from the caller to `poolId`'s reward escrow.
    function fundRewards(uint256 poolId, uint256 amount) external;

    /// @notice Records the caller node's batch in its batch slot `slot`: the Merkle root `root` of its `count` files
    /// (`BatchMerkle`), worth `totalUnits` in all, at most `count` x the pool's `maxUnitsPerKey`. One record for the
    /// whole batch; a batch of one is the single-file case. The slot must be empty or hold a settled batch (claimed
    /// or invalidated), which the new one replaces. The record belongs to the caller: another node committing the
    /// same root makes its own, and no member can block or claim another's.
    function submitBatch(uint256 poolId, uint256 slot, bytes32 root, uint256 count, uint256 totalUnits) external;

    /// @notice Shows, with its Merkle proof, that one file of `node`'s pending batch `ref` is bad: voids the whole
    /// batch, burns `slashAmount` of the node's lock in the pool (never more than it holds) and ejects the node by
    /// invalidation, which voids its other pending batches there. A refused leaf may be the one shown.
    function invalidateBatch(uint256 poolId, address node, BatchRef calldata ref, LeafProof calldata leaf, uint8 reason)
        external;

    /// @notice Invalidates `node`'s pending batch `ref` whose leaf list was never made available (reason 8, file
    /// unavailable): a validator that cannot get the list after the grace period has no leaf to prove. The effects
    /// are `invalidateBatch`'s: the batch void, the slash burned, the node ejected by invalidation. Emits
    /// `BatchInvalidated` with no leaf (`leafIndex = type(uint256).max`, `workKey = 0`).
    function invalidateUnavailableBatch(uint256 poolId, address node, BatchRef calldata ref) external;

    /// @notice Refuses, with its Merkle proof, one file of `node`'s pending batch `ref` without a slash: its units
    /// are taken out of the batch's payout, the rest of the batch is paid, and the node stays a member. Once a leaf.
    function refuseLeaf(uint256 poolId, address node, BatchRef calldata ref, LeafProof calldata leaf, uint8 reason)
        external;

    /// @notice Pays `node`'s provider for `node`'s pending batches `refs` whose challenge window has passed: each
    /// batch's total units less its refused leaves' units, unless `node` was ejected by an invalidation.
    function claimBatches(uint256 poolId, address node, BatchRef[] calldata refs) external;

    /// @notice The record in `node`'s batch slot `slot`: its batch's root and record (status `None` when the slot was
    /// never used).
    function getBatch(uint256 poolId, address node, uint256 slot)
        external
        view
        returns (
            bytes32 root,
            address provider,
            uint256 count,
            uint256 totalUnits,
            uint256 refusedUnits,
            uint64 submittedAt,
            BatchStatus status
        );

    /// @notice Whether leaf `index` of `node`'s batch `root` was refused.
    function isLeafRefused(uint256 poolId, address node, bytes32 root, uint256 index) external view returns (bool);

    function escrowOf(uint256 poolId) external view returns (uint256);
}
