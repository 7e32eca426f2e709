// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IWorkLedger
/// @notice Reward escrow, submitted work, the challenge window and claims.
interface IWorkLedger {
    enum WorkStatus {
        None,
        Pending,
        Invalidated,
        Claimed
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
    event WorkInvalidated(
        uint256 indexed poolId, bytes32 indexed workKey, address indexed validator, uint8 reason, uint256 slashed
    );
    event RewardsClaimed(uint256 indexed poolId, address indexed provider, uint256 amount, uint256 count);

    error ZeroAmount();
    error ZeroAddress();
    error PoolNotFound(uint256 poolId);
    error NotPoolMember(uint256 poolId, address node);
    error ProviderUndercollateralized(address provider);
    error UnitsOutOfRange(uint256 units, uint256 max);
    error EmptyBatch();
    error LengthMismatch(uint256 workKeys, uint256 units);
    error WorkExists(uint256 poolId, bytes32 workKey);
    error WorkNotFound(uint256 poolId, bytes32 workKey);
    error WorkNotPending(uint256 poolId, bytes32 workKey, WorkStatus status);
    error NotValidator(uint256 poolId, address caller);
    error InvalidReason(uint8 reason);
    error ChallengeWindowClosed(uint256 poolId, bytes32 workKey, uint64 closedAt);
    error ChallengeWindowOpen(uint256 poolId, bytes32 workKey, uint64 closesAt);
    error MixedProviders(address expected, address found);
    error InsufficientEscrow(uint256 poolId, uint256 needed, uint256 available);

    /// @notice Adds `amount` tokens from the caller to `poolId`'s reward escrow.
    function fundRewards(uint256 poolId, uint256 amount) external;

    /// @notice Records the caller node's work `workKey` (sha256 of the rollout file) worth `units`.
    function submitWork(uint256 poolId, bytes32 workKey, uint256 units) external;

    /// @notice `submitWork` for several files in one transaction.
    function submitWorkBatch(uint256 poolId, bytes32[] calldata workKeys, uint256[] calldata units) external;

    /// @notice Marks pending work invalid, slashes its provider into the pool's escrow and ejects its node.
    function invalidateWork(uint256 poolId, bytes32 workKey, uint8 reason) external;

    /// @notice Pays one provider for pending work whose challenge window has passed.
    function claimRewards(uint256 poolId, bytes32[] calldata workKeys) external;

    function escrowOf(uint256 poolId) external view returns (uint256);
    function getWork(uint256 poolId, bytes32 workKey)
        external
        view
        returns (address node, address provider, uint256 units, uint64 submittedAt, WorkStatus status);
}
