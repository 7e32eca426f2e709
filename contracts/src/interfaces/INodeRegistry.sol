// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";

/// @title INodeRegistry
/// @notice Providers stake collateral and bind the node keys that do work on their behalf.
interface INodeRegistry {
    /// @notice A provider added `amount` to its active stake.
    event Staked(address indexed provider, uint256 amount);
    /// @notice A provider moved `amount` from active to unbonding stake, withdrawable at `releaseAt`.
    event UnstakeRequested(address indexed provider, uint256 amount, uint64 releaseAt);
    /// @notice A provider withdrew its unbonded stake.
    event Withdrawn(address indexed provider, uint256 amount);
    /// @notice `node` now works for `provider`.
    event NodeAdded(address indexed provider, address indexed node);
    /// @notice `node` no longer works for `provider` (the binding itself stays: a node key has one provider for life).
    event NodeRemoved(address indexed provider, address indexed node);
    /// @notice `amount` was taken from the lock of `node` (of `provider`) in `poolId` and burned: it stays in the
    /// registry, counted in `burned`, and nothing can pay it out.
    event Slashed(address indexed provider, address indexed node, uint256 indexed poolId, uint256 amount);
    /// @notice `node`'s membership of `poolId` locks `amount` of `provider`'s active stake.
    event StakeLocked(address indexed provider, address indexed node, uint256 indexed poolId, uint256 amount);
    /// @notice `node` is no longer a member of `poolId`; its lock of `amount` is held until `releaseAt`, when the
    /// challenge window of its last submission there has closed.
    event StakeUnlocked(
        address indexed provider, address indexed node, uint256 indexed poolId, uint256 amount, uint64 releaseAt
    );
    /// @notice The lock of `node` in `poolId` ended; `amount` of `provider`'s stake is free again.
    event StakeReleased(address indexed provider, address indexed node, uint256 indexed poolId, uint256 amount);

    error ZeroAmount();
    error ZeroAddress();
    error UnbondingPeriodZero();
    error AmountTooLarge(uint256 amount, uint256 max);
    /// @dev Active stake minus the request would fall below what pools have locked.
    error InsufficientActiveStake(address provider, uint256 active, uint256 required);
    error NothingToWithdraw(address provider);
    error StillUnbonding(address provider, uint64 releaseAt, uint64 timestamp);
    error InvalidNodeSignature(address node, address recovered);
    error NodeBoundToOtherProvider(address node, address provider);
    error NodeAlreadyActive(address node);
    error NodeNotActive(address node);
    error NotNodeProvider(address node, address caller);
    error NodeInPools(address node, uint32 pools);
    error AlreadyLocked(uint256 poolId, address node);
    error NotLocked(uint256 poolId, address node);
    /// @dev The lock is still a membership, or the challenge window it backs closes at `releaseAt`.
    error LockHeld(uint256 poolId, address node, bool member, uint64 releaseAt);

    /// @notice Moves `amount` tokens from the caller into its active stake.
    function stake(uint256 amount) external;

    /// @notice Starts unbonding `amount` of the caller's active stake; all unbonding stake is released together
    /// `unbondingPeriod` after the latest request.
    function requestUnstake(uint256 amount) external;

    /// @notice Sends the caller all of its unbonding stake once it is released.
    function withdraw() external;

    /// @notice Binds `node` to the caller; `signature` is the node key's EIP-712 `NodeBinding(provider,node)`.
    function addNode(address node, bytes calldata signature) external;

    /// @notice Retires the caller's `node`; it must have left every pool.
    function removeNode(address node) external;

    /// @notice Takes up to `amount` from the stake `node` locks in `poolId` and burns it. Returns what was taken.
    function slash(uint256 poolId, address node, uint256 amount) external returns (uint256 slashed);

    /// @notice Locks `amount` of the provider of `node` for its membership of `poolId` and returns that provider.
    function lockStake(uint256 poolId, address node, uint256 amount) external returns (address provider);

    /// @notice Ends `node`'s membership of `poolId`; its lock is held until `releaseAt`.
    function unlockStake(uint256 poolId, address node, uint64 releaseAt) external;

    /// @notice Frees the lock `node` held in `poolId` once it is no longer a membership and `releaseAt` passed.
    function releaseStake(uint256 poolId, address node) external;

    function token() external view returns (IERC20);
    function unbondingPeriod() external view returns (uint64);
    function stakeOf(address provider) external view returns (uint256 active, uint256 unbonding);
    function lockedOf(address provider) external view returns (uint256);
    function releaseAt(address provider) external view returns (uint64);
    function lockOf(uint256 poolId, address node)
        external
        view
        returns (uint256 amount, uint64 releaseAt, bool member, bool open);
    function burned() external view returns (uint256);
    function providerOf(address node) external view returns (address);
    function isActiveNode(address node) external view returns (bool);
    function nodesOf(address provider) external view returns (address[] memory);
}
