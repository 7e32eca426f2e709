// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {EnumerableSet} from "@openzeppelin/contracts/utils/structs/EnumerableSet.sol";
import {IComputePool} from "./interfaces/IComputePool.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";

/// @title ComputePool
/// @notice Anyone may create a pool; its owner appoints validators; registered nodes with enough stake join.
/// @dev A membership records the node's provider so that the WorkLedger learns both in one call.
contract ComputePool is IComputePool, AccessControl {
    using EnumerableSet for EnumerableSet.AddressSet;

    /// @notice May eject members: the WorkLedger, when it invalidates their work.
    bytes32 public constant LEDGER_ROLE = keccak256("LEDGER_ROLE");

    struct Pool {
        PoolConfig config;
        address owner;
    }

    struct Membership {
        address provider; // zero when not a member
        bool ejected; // an ejected node cannot rejoin the pool
    }

    INodeRegistry public immutable registry;

    uint256 public poolCount;
    mapping(uint256 poolId => Pool) private _pools;
    mapping(uint256 poolId => mapping(address node => Membership)) private _memberships;
    mapping(uint256 poolId => EnumerableSet.AddressSet) private _members;
    mapping(uint256 poolId => mapping(address validator => bool)) private _validators;

    /// @param registry_ The NodeRegistry whose stake backs memberships.
    constructor(INodeRegistry registry_) {
        if (address(registry_) == address(0)) revert ZeroAddress();
        registry = registry_;
        _grantRole(DEFAULT_ADMIN_ROLE, msg.sender);
    }

    modifier onlyPoolOwner(uint256 poolId) {
        address owner = _existing(poolId).owner;
        if (msg.sender != owner) revert NotPoolOwner(poolId, msg.sender);
        _;
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: `trainer` set, `0 < challengeWindow <= registry.unbondingPeriod()`. Emits {PoolCreated}.
    function createPool(PoolConfig calldata config) external returns (uint256 poolId) {
        if (config.trainer == address(0)) revert ZeroAddress();
        if (config.challengeWindow == 0) revert ChallengeWindowZero();
        uint64 unbonding = registry.unbondingPeriod();
        if (config.challengeWindow > unbonding) revert ChallengeWindowTooLong(config.challengeWindow, unbonding);
        poolId = ++poolCount;
        Pool storage pool = _pools[poolId];
        pool.config = config;
        pool.owner = msg.sender;
        emit PoolCreated(poolId, msg.sender, config.name, config.trainer);
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: caller owns the pool. Emits {ValidatorSet}.
    function setValidator(uint256 poolId, address validator, bool allowed) external onlyPoolOwner(poolId) {
        if (validator == address(0)) revert ZeroAddress();
        _validators[poolId][validator] = allowed;
        emit ValidatorSet(poolId, validator, allowed);
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: the caller is an active node, not a member, not ejected, the pool is not full, and its
    /// provider's active stake covers all of its locks plus this one. Emits {NodeJoined}.
    function join(uint256 poolId) external {
        Pool storage pool = _existing(poolId);
        Membership storage m = _memberships[poolId][msg.sender];
        if (m.ejected) revert EjectedFromPool(poolId, msg.sender);
        if (m.provider != address(0)) revert AlreadyMember(poolId, msg.sender);
        uint32 maxNodes = pool.config.maxNodes;
        if (maxNodes != 0 && _members[poolId].length() >= maxNodes) revert PoolFull(poolId, maxNodes);
        _members[poolId].add(msg.sender);
        // the registry is trusted code fixed at construction and makes no calls back; it reverts when the node
        // is not active or its provider's stake does not cover the lock
        address provider = registry.lockStake(msg.sender, pool.config.minStakePerNode);
        m.provider = provider;
        emit NodeJoined(poolId, msg.sender, provider);
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: the caller is a member. Emits {NodeLeft}.
    function leave(uint256 poolId) external {
        Pool storage pool = _existing(poolId);
        if (_memberships[poolId][msg.sender].provider == address(0)) revert NotMember(poolId, msg.sender);
        _removeMember(poolId, msg.sender);
        emit NodeLeft(poolId, msg.sender);
        registry.unlockStake(msg.sender, pool.config.minStakePerNode);
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: caller owns the pool or has LEDGER_ROLE. A non-member is banned from joining.
    /// Emits {NodeEjected}.
    function eject(uint256 poolId, address node) external {
        Pool storage pool = _existing(poolId);
        if (msg.sender != pool.owner && !hasRole(LEDGER_ROLE, msg.sender)) revert NotAllowedToEject(poolId, msg.sender);
        Membership storage m = _memberships[poolId][node];
        bool wasMember = m.provider != address(0);
        if (wasMember) _removeMember(poolId, node);
        m.ejected = true;
        emit NodeEjected(poolId, node, msg.sender);
        if (wasMember) registry.unlockStake(node, pool.config.minStakePerNode);
    }

    /// @inheritdoc IComputePool
    function getPool(uint256 poolId) external view returns (PoolConfig memory config, address owner) {
        Pool storage pool = _existing(poolId);
        return (pool.config, pool.owner);
    }

    /// @inheritdoc IComputePool
    /// @dev The three terms the WorkLedger needs, without copying the pool's strings.
    function terms(uint256 poolId)
        external
        view
        returns (uint64 challengeWindow, uint256 rewardPerUnit, uint256 slashAmount)
    {
        PoolConfig storage c = _existing(poolId).config;
        return (c.challengeWindow, c.rewardPerUnit, c.slashAmount);
    }

    /// @inheritdoc IComputePool
    function isMember(uint256 poolId, address node) external view returns (bool) {
        return _memberships[poolId][node].provider != address(0);
    }

    /// @inheritdoc IComputePool
    /// @dev Zero when `node` is not a member of `poolId`.
    function memberProvider(uint256 poolId, address node) external view returns (address) {
        return _memberships[poolId][node].provider;
    }

    /// @inheritdoc IComputePool
    function isEjected(uint256 poolId, address node) external view returns (bool) {
        return _memberships[poolId][node].ejected;
    }

    /// @inheritdoc IComputePool
    function isValidator(uint256 poolId, address validator) external view returns (bool) {
        return _validators[poolId][validator];
    }

    /// @inheritdoc IComputePool
    function members(uint256 poolId) external view returns (address[] memory) {
        return _members[poolId].values();
    }

    function _removeMember(uint256 poolId, address node) private {
        _memberships[poolId][node].provider = address(0);
        _members[poolId].remove(node);
    }

    function _existing(uint256 poolId) private view returns (Pool storage pool) {
        pool = _pools[poolId];
        if (pool.owner == address(0)) revert PoolNotFound(poolId);
    }
}
