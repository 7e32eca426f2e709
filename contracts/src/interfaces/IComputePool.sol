// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IComputePool
/// @notice Training pools: their terms, validators and member nodes.
interface IComputePool {
    /// @notice A pool's terms, fixed at creation.
    /// @param name Human-readable name.
    /// @param modelHash Hash identifying the base model the pool trains.
    /// @param specURI Where the pool spec (task, sampling, bootstrap peers, coordinator URL) lives.
    /// @param trainer Address that signs checkpoint manifests.
    /// @param minStakePerNode Active stake each member node locks; more than 0. A slash in this pool reaches only it.
    /// @param challengeWindow Seconds during which submitted work may be invalidated; at least the deployment's
    /// `minChallengeWindow`, at most the unbonding period.
    /// @param rewardPerUnit Tokens paid per work unit (output token) of accepted work.
    /// @param slashAmount Tokens burned from the node's lock per invalidated work; at most `minStakePerNode`.
    /// @param maxNodes Member limit; 0 means unlimited.
    /// @param maxUnitsPerKey Most units one work key may claim, so one key cannot drain the escrow; `0 < x < 2^48`.
    struct PoolConfig {
        string name;
        bytes32 modelHash;
        string specURI;
        address trainer;
        uint256 minStakePerNode;
        uint64 challengeWindow;
        uint256 rewardPerUnit;
        uint256 slashAmount;
        uint32 maxNodes;
        uint64 maxUnitsPerKey;
    }

    event PoolCreated(uint256 indexed poolId, address indexed owner, string name, address trainer);
    event ValidatorSet(uint256 indexed poolId, address indexed validator, bool allowed);
    event NodeJoined(uint256 indexed poolId, address indexed node, address indexed provider);
    event NodeLeft(uint256 indexed poolId, address indexed node);
    /// @notice How a node left a pool for good. `ByOwner` stops new work only: what the node submitted before stays
    /// claimable after its window unless a validator invalidates it. `ByInvalidation` (an invalidation of any of its
    /// work, which also upgrades an owner's ejection) voids all of its pending work in the pool.
    enum Ejection {
        None,
        ByOwner,
        ByInvalidation
    }

    /// @notice `by` ejected `node` from `poolId`; `kind` is the node's ejection after this call.
    event NodeEjected(uint256 indexed poolId, address indexed node, address indexed by, Ejection kind);

    error PoolNotFound(uint256 poolId);
    error NotPoolOwner(uint256 poolId, address caller);
    error NotAllowedToEject(uint256 poolId, address caller);
    error ZeroAddress();
    error MinChallengeWindowOutOfRange(uint64 minChallengeWindow, uint64 unbondingPeriod);
    error MinStakeOutOfRange(uint256 minStakePerNode, uint256 max);
    error SlashAmountOutOfRange(uint256 slashAmount, uint256 minStakePerNode);
    error ChallengeWindowTooShort(uint64 challengeWindow, uint64 minChallengeWindow);
    error ChallengeWindowTooLong(uint64 challengeWindow, uint64 unbondingPeriod);
    error MaxUnitsPerKeyOutOfRange(uint64 maxUnitsPerKey, uint64 max);
    error AlreadyMember(uint256 poolId, address node);
    error NotMember(uint256 poolId, address node);
    error EjectedFromPool(uint256 poolId, address node);
    error PoolFull(uint256 poolId, uint32 maxNodes);

    /// @notice Creates a pool owned by the caller and returns its id (ids start at 1).
    function createPool(PoolConfig calldata config) external returns (uint256 poolId);

    /// @notice Appoints (`allowed`) or dismisses a validator of `poolId`.
    function setValidator(uint256 poolId, address validator, bool allowed) external;

    /// @notice The calling node joins `poolId`, locking `minStakePerNode` of its provider's stake.
    function join(uint256 poolId) external;

    /// @notice The calling node leaves `poolId`; its lock is held one challenge window longer (`releaseStake`).
    function leave(uint256 poolId) external;

    /// @notice The pool's owner removes `node` from `poolId` for good: no new work, no rejoining. Its work submitted
    /// before stays claimable after its window (a validator may still invalidate it inside the window).
    function eject(uint256 poolId, address node) external;

    /// @notice The WorkLedger, on an invalidation of `node`'s work, removes `node` from `poolId` for good and voids
    /// all of its pending work there (an owner's ejection of the node becomes this one).
    function ejectForInvalidation(uint256 poolId, address node) external;

    function poolCount() external view returns (uint256);
    function minChallengeWindow() external view returns (uint64);
    function getPool(uint256 poolId) external view returns (PoolConfig memory config, address owner);
    function terms(uint256 poolId)
        external
        view
        returns (uint64 challengeWindow, uint256 rewardPerUnit, uint256 slashAmount, uint64 maxUnitsPerKey);
    /// @notice The provider of member `node` (zero when it is not a member) and the pool's cap on units per key.
    function memberTerms(uint256 poolId, address node) external view returns (address provider, uint64 maxUnitsPerKey);
    function isMember(uint256 poolId, address node) external view returns (bool);
    function memberProvider(uint256 poolId, address node) external view returns (address);
    /// @notice Whether `node` was ejected from `poolId`, by its owner or by an invalidation.
    function isEjected(uint256 poolId, address node) external view returns (bool);
    /// @notice How `node` was ejected from `poolId` (`None` when it was not).
    function ejectionOf(uint256 poolId, address node) external view returns (Ejection);
    function isValidator(uint256 poolId, address validator) external view returns (bool);
    function members(uint256 poolId) external view returns (address[] memory);
}
