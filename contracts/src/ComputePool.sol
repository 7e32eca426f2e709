// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {EnumerableSet} from "@openzeppelin/contracts/utils/structs/EnumerableSet.sol";
import {IComputePool} from "./interfaces/IComputePool.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";

/// @title ComputePool
/// @notice Anyone may create a pool; its owner appoints validators; registered nodes with enough stake join.
/// @dev A membership records the node's provider so that the WorkLedger learns both, and the pool's cap on units
/// per key, in one call. Pool terms are fixed at creation: a member's risk cannot change after it joins.
contract ComputePool is IComputePool, AccessControl {
    using EnumerableSet for EnumerableSet.AddressSet;

    /// @notice May eject members by invalidation (`ejectForInvalidation`): the WorkLedger, when it invalidates work.
    bytes32 public constant LEDGER_ROLE = keccak256("LEDGER_ROLE");
    /// @notice The largest `maxUnitsPerKey`: a batch record stores count (< 2^32) x this in 80 bits.
    uint64 public constant MAX_UNITS = type(uint48).max;

    struct Pool {
        PoolConfig config;
        address owner;
    }

    /// @dev One storage slot, read whole by `memberTerms` on every submission.
    struct Membership {
        address provider; // zero when not a member
        Ejection ejection; // an ejected node (either kind) cannot rejoin the pool
        uint48 maxUnitsPerKey; // the pool's, copied at join (terms never change): a submission reads one slot
    }

    INodeRegistry public immutable registry;
    /// @notice The shortest challenge window a pool may have: long enough for a validator to check a file.
    uint64 public immutable minChallengeWindow;

    uint256 public poolCount;
    mapping(uint256 poolId => Pool) private _pools;
    mapping(uint256 poolId => mapping(address node => Membership)) private _memberships;
    mapping(uint256 poolId => EnumerableSet.AddressSet) private _members;
    mapping(uint256 poolId => mapping(address validator => bool)) private _validators;

    /// @param registry_ The NodeRegistry whose stake backs memberships.
    /// @param minChallengeWindow_ Deployment-wide lower bound of every pool's challenge window, in seconds.
    constructor(INodeRegistry registry_, uint64 minChallengeWindow_) {
        if (address(registry_) == address(0)) revert ZeroAddress();
        uint64 unbonding = registry_.unbondingPeriod();
        if (minChallengeWindow_ == 0 || minChallengeWindow_ > unbonding) {
            revert MinChallengeWindowOutOfRange(minChallengeWindow_, unbonding);
        }
        registry = registry_;
        minChallengeWindow = minChallengeWindow_;
        _grantRole(DEFAULT_ADMIN_ROLE, msg.sender);
    }

    modifier onlyPoolOwner(uint256 poolId) {
        address owner = _existing(poolId).owner;
        if (msg.sender != owner) revert NotPoolOwner(poolId, msg.sender);
        _;
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: `trainer` set; `0 < minStakePerNode < 2^128`; `0 < slashAmount <= minStakePerNode`;
    /// `minChallengeWindow <= challengeWindow <= registry.unbondingPeriod()`; `0 < maxUnitsPerKey < 2^48`.
    /// Emits {PoolCreated}.
    function createPool(PoolConfig calldata config) external returns (uint256 poolId) {
        if (config.trainer == address(0)) revert ZeroAddress();
        uint256 minStake = config.minStakePerNode;
        if (minStake == 0 || minStake > type(uint128).max) revert MinStakeOutOfRange(minStake, type(uint128).max);
        if (config.slashAmount == 0 || config.slashAmount > minStake) {
            revert SlashAmountOutOfRange(config.slashAmount, minStake);
        }
        if (config.challengeWindow < minChallengeWindow) {
            revert ChallengeWindowTooShort(config.challengeWindow, minChallengeWindow);
        }
        uint64 unbonding = registry.unbondingPeriod();
        if (config.challengeWindow > unbonding) revert ChallengeWindowTooLong(config.challengeWindow, unbonding);
        if (config.maxUnitsPerKey == 0 || config.maxUnitsPerKey > MAX_UNITS) {
            revert MaxUnitsPerKeyOutOfRange(config.maxUnitsPerKey, MAX_UNITS);
        }
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
        if (m.ejection != Ejection.None) revert EjectedFromPool(poolId, msg.sender);
        if (m.provider != address(0)) revert AlreadyMember(poolId, msg.sender);
        uint32 maxNodes = pool.config.maxNodes;
        if (maxNodes != 0 && _members[poolId].length() >= maxNodes) revert PoolFull(poolId, maxNodes);
        _members[poolId].add(msg.sender);
        // the registry is trusted code fixed at construction and makes no calls back; it reverts when the node
        // is not active or its provider's stake does not cover the lock
        address provider = registry.lockStake(poolId, msg.sender, pool.config.minStakePerNode);
        m.provider = provider;
        m.maxUnitsPerKey = uint48(pool.config.maxUnitsPerKey); // < 2^48 (createPool)
        emit NodeJoined(poolId, msg.sender, provider);
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: the caller is a member. Its lock is held one challenge window longer, until its last
    /// submission's window has closed. Emits {NodeLeft}.
    function leave(uint256 poolId) external {
        Pool storage pool = _existing(poolId);
        if (_memberships[poolId][msg.sender].provider == address(0)) revert NotMember(poolId, msg.sender);
        _removeMember(poolId, msg.sender);
        emit NodeLeft(poolId, msg.sender);
        registry.unlockStake(poolId, msg.sender, _lockEnd(pool));
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: caller owns the pool. A non-member is banned from joining. The node's pending work is not
    /// voided: it is paid after its window unless invalidated, and its lock is held one challenge window longer so
    /// that the work stays slashable until then. An ejection by invalidation is never turned back into this one.
    /// Emits {NodeEjected}.
    function eject(uint256 poolId, address node) external {
        Pool storage pool = _existing(poolId);
        if (msg.sender != pool.owner) revert NotAllowedToEject(poolId, msg.sender);
        _eject(pool, poolId, node, Ejection.ByOwner);
    }

    /// @inheritdoc IComputePool
    /// @dev Requirements: caller has LEDGER_ROLE. As {eject}, but the node's pending work is void (WorkLedger
    /// refuses its claims), also when its owner ejected it before. Emits {NodeEjected}.
    function ejectForInvalidation(uint256 poolId, address node) external onlyRole(LEDGER_ROLE) {
        _eject(_existing(poolId), poolId, node, Ejection.ByInvalidation);
    }

    /// @inheritdoc IComputePool
    function getPool(uint256 poolId) external view returns (PoolConfig memory config, address owner) {
        Pool storage pool = _existing(poolId);
        return (pool.config, pool.owner);
    }

    /// @inheritdoc IComputePool
    /// @dev The terms the WorkLedger needs, without copying the pool's strings.
    function terms(uint256 poolId)
        external
        view
        returns (uint64 challengeWindow, uint256 rewardPerUnit, uint256 slashAmount, uint64 maxUnitsPerKey)
    {
        PoolConfig storage c = _existing(poolId).config;
        return (c.challengeWindow, c.rewardPerUnit, c.slashAmount, c.maxUnitsPerKey);
    }

    /// @inheritdoc IComputePool
    /// @dev One storage read: the membership holds the pool's cap since its join.
    function memberTerms(uint256 poolId, address node) external view returns (address provider, uint64 maxUnitsPerKey) {
        Membership storage m = _memberships[poolId][node];
        provider = m.provider;
        if (provider != address(0)) maxUnitsPerKey = m.maxUnitsPerKey;
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
        return _memberships[poolId][node].ejection != Ejection.None;
    }

    /// @inheritdoc IComputePool
    function ejectionOf(uint256 poolId, address node) external view returns (Ejection) {
        return _memberships[poolId][node].ejection;
    }

    /// @inheritdoc IComputePool
    function isValidator(uint256 poolId, address validator) external view returns (bool) {
        return _validators[poolId][validator];
    }

    /// @inheritdoc IComputePool
    function members(uint256 poolId) external view returns (address[] memory) {
        return _members[poolId].values();
    }

    /// @dev Records the stronger of the node's ejections (`ByInvalidation` > `ByOwner`), then releases its lock one
    /// challenge window from now if it was a member: its last submission's window closes no later than that.
    function _eject(Pool storage pool, uint256 poolId, address node, Ejection kind) private {
        Membership storage m = _memberships[poolId][node];
        bool wasMember = m.provider != address(0);
        if (wasMember) _removeMember(poolId, node);
        if (uint8(kind) > uint8(m.ejection)) m.ejection = kind;
        emit NodeEjected(poolId, node, msg.sender, m.ejection);
        // the registry is trusted code fixed at construction and makes no calls back
        if (wasMember) registry.unlockStake(poolId, node, _lockEnd(pool));
    }

    function _removeMember(uint256 poolId, address node) private {
        _memberships[poolId][node].provider = address(0);
        _members[poolId].remove(node);
    }

    /// @dev When a lock that stops being a membership now may be released: a submission made up to now closes then.
    function _lockEnd(Pool storage pool) private view returns (uint64) {
        return uint64(block.timestamp) + pool.config.challengeWindow;
    }

    function _existing(uint256 poolId) private view returns (Pool storage pool) {
        pool = _pools[poolId];
        if (pool.owner == address(0)) revert PoolNotFound(poolId);
    }
}
