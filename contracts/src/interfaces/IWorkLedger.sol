// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IWorkLedger
/// @notice Reward escrow, submitted work, the challenge window and claims.
interface IWorkLedger {
    /// @dev Appended only: a status keeps its number. `Refused`: a validator voided it without a slash (neither
    /// slashed nor paid); it may still be invalidated inside its window.
    enum WorkStatus {
        None,
        Pending,
        Invalidated,
        Claimed,
        Refused
    }

    event RewardsFunded(uint256 indexed poolId, address indexed funder, uint256 amount);
    event WorkSubmitted(
        uint256 indexed poolId, bytes32 indexed workKey, address indexed node, address provider, uint256 units
    );
    /// @notice Several works recorded by one `submitWorkBatch` call: one event instead of one per key, as
    /// ERC-1155's TransferBatch does; readers treat each (workKeys[i], units[i]) as a `WorkSubmitted`.
    event WorkBatchSubmitted(
        uint256 indexed poolId, address indexed node, address provider, bytes32[] workKeys, uint256[] units
    );
    /// @notice `validator` invalidated `node`'s work `workKey`; `slashed` tokens of its lock in the pool were burned.
    event WorkInvalidated(
        uint256 indexed poolId,
        bytes32 indexed workKey,
        address indexed node,
        address validator,
        uint8 reason,
        uint256 slashed
    );
    /// @notice `validator` refused `node`'s work `workKey` for `reason` without a slash: it will not be paid.
    event WorkRefused(
        uint256 indexed poolId, bytes32 indexed workKey, address indexed node, address validator, uint8 reason
    );
    /// @notice `provider` was paid `amount` for `count` works of `node`.
    event RewardsClaimed(
        uint256 indexed poolId, address indexed provider, address indexed node, uint256 amount, uint256 count
    );

    error ZeroAmount();
    error ZeroAddress();
    error PoolNotFound(uint256 poolId);
    error NotPoolMember(uint256 poolId, address node);
    error UnitsOutOfRange(uint256 units, uint256 max);
    error EmptyBatch();
    error LengthMismatch(uint256 workKeys, uint256 units);
    error WorkExists(uint256 poolId, address node, bytes32 workKey);
    error WorkNotFound(uint256 poolId, address node, bytes32 workKey);
    error WorkNotPending(uint256 poolId, address node, bytes32 workKey, WorkStatus status);
    /// @dev The node was ejected from the pool by an invalidation: its pending work is void. (An owner's ejection
    /// voids nothing.)
    error NodeEjected(uint256 poolId, address node);
    error NotValidator(uint256 poolId, address caller);
    error InvalidReason(uint8 reason);
    error ChallengeWindowClosed(uint256 poolId, address node, bytes32 workKey, uint64 closedAt);
    error ChallengeWindowOpen(uint256 poolId, address node, bytes32 workKey, uint64 closesAt);
    error InsufficientEscrow(uint256 poolId, uint256 needed, uint256 available);

    /// @notice Adds `amount` tokens from the caller to `poolId`'s reward escrow.
    function fundRewards(uint256 poolId, uint256 amount) external;

    /// @notice Records the caller node's work `workKey` (sha256 of the rollout file) worth `units`, at most the pool's
    /// `maxUnitsPerKey`. The record belongs to the caller: another node submitting the same key makes its own.
    function submitWork(uint256 poolId, bytes32 workKey, uint256 units) external;

    /// @notice `submitWork` for several files in one transaction.
    function submitWorkBatch(uint256 poolId, bytes32[] calldata workKeys, uint256[] calldata units) external;

    /// @notice Marks `node`'s pending (or refused) work invalid, burns `slashAmount` of the node's lock in the pool
    /// (never more than that lock holds) and ejects the node by invalidation, which voids its other pending work there.
    function invalidateWork(uint256 poolId, address node, bytes32 workKey, uint8 reason) external;

    /// @notice Marks `node`'s pending work refused: not paid, not slashed, the node not ejected. For a file a
    /// validator will not let anyone train on but cannot show clearly bad (a borderline verdict). A refused work may
    /// still be invalidated inside its window, by any validator of the pool, if it is later found clearly bad.
    function refuseWork(uint256 poolId, address node, bytes32 workKey, uint8 reason) external;

    /// @notice Pays `node`'s provider for `node`'s pending work whose challenge window has passed, unless `node` was
    /// ejected by an invalidation. A node its owner ejected is still paid for the work it submitted before.
    function claimRewards(uint256 poolId, address node, bytes32[] calldata workKeys) external;

    function escrowOf(uint256 poolId) external view returns (uint256);
    /// @notice The record of `node`'s work `workKey`: keys are per node, so no member can block or claim another's.
    function getWork(uint256 poolId, address node, bytes32 workKey)
        external
        view
        returns (address provider, uint256 units, uint64 submittedAt, WorkStatus status);
}
