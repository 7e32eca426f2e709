// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {EnumerableSet} from "@openzeppelin/contracts/utils/structs/EnumerableSet.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";

/// @title NodeRegistry
/// @notice Holds providers' stake and the node keys bound to them, and the stake each node locks in each pool.
/// @dev Stake moves active -> unbonding -> withdrawn. A pool membership locks part of the provider's active stake
/// (`lockStake`); unstaking below the locked total reverts. A slash reaches only the lock of the pool the invalid
/// work was submitted to, and the slashed tokens stay in this contract for good (`burned`): no function pays them
/// out, so no pool owner, validator or member can recover them. A lock outlives the membership: leaving or being
/// ejected holds it until one challenge window later, which is when the last submission it backs closes.
contract NodeRegistry is INodeRegistry, AccessControl, EIP712, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;
    using EnumerableSet for EnumerableSet.AddressSet;

    /// @notice May slash locks: the WorkLedger, on invalidated work.
    bytes32 public constant SLASHER_ROLE = keccak256("SLASHER_ROLE");
    /// @notice May lock and unlock stake for memberships: the ComputePool.
    bytes32 public constant POOL_ROLE = keccak256("POOL_ROLE");
    /// @notice EIP-712 type the node key signs to accept a provider.
    bytes32 public constant NODE_BINDING_TYPEHASH = keccak256("NodeBinding(address provider,address node)");

    struct Provider {
        uint128 active; // includes `locked`
        uint128 locked; // sum of the amounts of the provider's nodes' open locks
        uint128 unbonding;
        uint64 releaseAt; // when `unbonding` may be withdrawn
    }

    struct Node {
        address provider; // set on the first binding and never changed
        bool active;
        uint32 pools; // open locks (memberships, and locks still held after one), so a node in a pool cannot be removed
    }

    /// @dev One storage slot. Open from `lockStake` until `releaseStake` (or an unlock after `releaseAt`).
    struct Lock {
        uint128 amount; // what a slash in this pool can still take
        uint64 releaseAt; // when a lock that is no longer a membership may be released
        bool member; // the node is a member of the pool now
        bool open;
    }

    IERC20 public immutable token;
    uint64 public immutable unbondingPeriod;

    mapping(address provider => Provider) private _providers;
    mapping(address node => Node) private _nodes;
    mapping(address provider => EnumerableSet.AddressSet) private _nodesOf;
    mapping(uint256 poolId => mapping(address node => Lock)) private _locks;

    /// @notice Tokens taken by slashes. They stay in this contract and no function transfers them.
    uint256 public burned;

    /// @param token_ The ERC20 staked (and, in the WorkLedger, paid as reward).
    /// @param unbondingPeriod_ Seconds between an unstake request and its withdrawal; bounds every challenge window.
    constructor(IERC20 token_, uint64 unbondingPeriod_) EIP712("PrimeNode", "1") {
        if (address(token_) == address(0)) revert ZeroAddress();
        if (unbondingPeriod_ == 0) revert UnbondingPeriodZero();
        token = token_;
        unbondingPeriod = unbondingPeriod_;
        _grantRole(DEFAULT_ADMIN_ROLE, msg.sender);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: `amount > 0`, allowance for this contract. Emits {Staked}.
    function stake(uint256 amount) external nonReentrant {
        if (amount == 0) revert ZeroAmount();
        Provider storage p = _providers[msg.sender];
        uint256 active = uint256(p.active) + amount;
        if (active > type(uint128).max) revert AmountTooLarge(amount, type(uint128).max - p.active);
        p.active = uint128(active);
        emit Staked(msg.sender, amount);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: `amount > 0`, active stake after the request still covers the locked stake.
    /// Emits {UnstakeRequested}.
    function requestUnstake(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        Provider storage p = _providers[msg.sender];
        uint256 required = uint256(p.locked) + amount;
        if (p.active < required) revert InsufficientActiveStake(msg.sender, p.active, required);
        uint64 release = uint64(block.timestamp) + unbondingPeriod;
        // unchecked: amount <= active - locked <= active
        unchecked {
            p.active -= uint128(amount);
        }
        p.unbonding += uint128(amount);
        p.releaseAt = release;
        emit UnstakeRequested(msg.sender, amount, release);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: unbonding stake exists and `block.timestamp >= releaseAt`. Emits {Withdrawn}.
    function withdraw() external nonReentrant {
        Provider storage p = _providers[msg.sender];
        uint256 amount = p.unbonding;
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        if (block.timestamp < p.releaseAt) revert StillUnbonding(msg.sender, p.releaseAt, uint64(block.timestamp));
        p.unbonding = 0;
        p.releaseAt = 0;
        emit Withdrawn(msg.sender, amount);
        token.safeTransfer(msg.sender, amount);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: `node` signed the binding for this chain and contract; it is not bound to another
    /// provider and not already active. Emits {NodeAdded}.
    function addNode(address node, bytes calldata signature) external {
        if (node == address(0)) revert ZeroAddress();
        Node storage n = _nodes[node];
        if (n.provider != address(0) && n.provider != msg.sender) revert NodeBoundToOtherProvider(node, n.provider);
        if (n.active) revert NodeAlreadyActive(node);
        bytes32 digest = _hashTypedDataV4(keccak256(abi.encode(NODE_BINDING_TYPEHASH, msg.sender, node)));
        (address recovered, ECDSA.RecoverError err,) = ECDSA.tryRecover(digest, signature);
        if (err != ECDSA.RecoverError.NoError || recovered != node) revert InvalidNodeSignature(node, recovered);
        n.provider = msg.sender;
        n.active = true;
        _nodesOf[msg.sender].add(node);
        emit NodeAdded(msg.sender, node);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: caller is the node's provider, the node is active and in no pool. Emits {NodeRemoved}.
    function removeNode(address node) external {
        Node storage n = _nodes[node];
        if (n.provider != msg.sender) revert NotNodeProvider(node, msg.sender);
        if (!n.active) revert NodeNotActive(node);
        if (n.pools != 0) revert NodeInPools(node, n.pools);
        n.active = false;
        _nodesOf[msg.sender].remove(node);
        emit NodeRemoved(msg.sender, node);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: caller has SLASHER_ROLE. Takes at most what the node's lock in `poolId` still holds, from
    /// the provider's active (and locked) stake; never free stake, unbonding stake or another pool's lock.
    /// Emits {Slashed}.
    function slash(uint256 poolId, address node, uint256 amount)
        external
        onlyRole(SLASHER_ROLE)
        returns (uint256 slashed)
    {
        Lock storage lock = _locks[poolId][node];
        uint256 held = lock.amount;
        slashed = amount < held ? amount : held;
        if (slashed == 0) return 0;
        address provider = _nodes[node].provider;
        Provider storage p = _providers[provider];
        // unchecked: slashed <= lock.amount <= p.locked <= p.active, and burned counts tokens this contract holds
        unchecked {
            lock.amount = uint128(held - slashed);
            p.locked -= uint128(slashed);
            p.active -= uint128(slashed);
            burned += slashed;
        }
        emit Slashed(provider, node, poolId, slashed);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: caller has POOL_ROLE, `node` is active and not a member of `poolId`, and its provider's
    /// active stake covers every lock including this one. A lock still held from an earlier membership is reused
    /// and topped up to `amount`. Emits {StakeLocked}.
    function lockStake(uint256 poolId, address node, uint256 amount)
        external
        onlyRole(POOL_ROLE)
        returns (address provider)
    {
        Node storage n = _nodes[node];
        if (!n.active) revert NodeNotActive(node);
        Lock storage lock = _locks[poolId][node];
        if (lock.member) revert AlreadyLocked(poolId, node);
        if (amount > type(uint128).max) revert AmountTooLarge(amount, type(uint128).max);
        provider = n.provider;
        Provider storage p = _providers[provider];
        uint256 added = amount > lock.amount ? amount - lock.amount : 0;
        uint256 required = uint256(p.locked) + added;
        if (p.active < required) revert InsufficientActiveStake(provider, p.active, required);
        if (!lock.open) {
            // unchecked: a node cannot be in 2^32 pools
            unchecked {
                n.pools += 1;
            }
        }
        // unchecked: required <= active < 2^128, and `added` was checked against it
        unchecked {
            p.locked = uint128(required);
            lock.amount += uint128(added);
        }
        lock.member = true;
        lock.open = true;
        lock.releaseAt = 0;
        emit StakeLocked(provider, node, poolId, lock.amount);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: caller has POOL_ROLE and `node` is a member of `poolId`. The lock is held until
    /// `releaseAt` (released at once when that has passed). Emits {StakeUnlocked}.
    function unlockStake(uint256 poolId, address node, uint64 releaseAt_) external onlyRole(POOL_ROLE) {
        Lock storage lock = _locks[poolId][node];
        if (!lock.member) revert NotLocked(poolId, node);
        lock.member = false;
        lock.releaseAt = releaseAt_;
        emit StakeUnlocked(_nodes[node].provider, node, poolId, lock.amount, releaseAt_);
        if (block.timestamp >= releaseAt_) _release(poolId, node, lock);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Anyone may call: the stake stays the provider's, it only stops being locked. Requirements: the lock is
    /// open, no longer a membership, and `releaseAt` has passed. Emits {StakeReleased}.
    function releaseStake(uint256 poolId, address node) external {
        Lock storage lock = _locks[poolId][node];
        if (!lock.open) revert NotLocked(poolId, node);
        if (lock.member || block.timestamp < lock.releaseAt) revert LockHeld(poolId, node, lock.member, lock.releaseAt);
        _release(poolId, node, lock);
    }

    function _release(uint256 poolId, address node, Lock storage lock) private {
        Node storage n = _nodes[node];
        uint128 amount = lock.amount;
        // checked: a release without its lock is a bug and must revert, not wrap
        _providers[n.provider].locked -= amount;
        n.pools -= 1;
        delete _locks[poolId][node];
        emit StakeReleased(n.provider, node, poolId, amount);
    }

    /// @inheritdoc INodeRegistry
    function stakeOf(address provider) external view returns (uint256 active, uint256 unbonding) {
        Provider storage p = _providers[provider];
        return (p.active, p.unbonding);
    }

    /// @inheritdoc INodeRegistry
    function lockedOf(address provider) external view returns (uint256) {
        return _providers[provider].locked;
    }

    /// @inheritdoc INodeRegistry
    function releaseAt(address provider) external view returns (uint64) {
        return _providers[provider].releaseAt;
    }

    /// @inheritdoc INodeRegistry
    function lockOf(uint256 poolId, address node)
        external
        view
        returns (uint256 amount, uint64 releaseAt_, bool member, bool open)
    {
        Lock storage lock = _locks[poolId][node];
        return (lock.amount, lock.releaseAt, lock.member, lock.open);
    }

    /// @inheritdoc INodeRegistry
    /// @dev The binding is permanent, so work submitted by a later-removed node still pays its provider.
    function providerOf(address node) external view returns (address) {
        return _nodes[node].provider;
    }

    /// @inheritdoc INodeRegistry
    function isActiveNode(address node) external view returns (bool) {
        return _nodes[node].active;
    }

    /// @inheritdoc INodeRegistry
    function nodesOf(address provider) external view returns (address[] memory) {
        return _nodesOf[provider].values();
    }

    /// @notice The EIP-712 domain separator node keys sign `NodeBinding` under.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }
}
