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
/// @notice Holds providers' stake and the node keys bound to them.
/// @dev Stake moves active -> unbonding -> withdrawn. Unbonding takes `unbondingPeriod`, which every pool's
/// challenge window is at most, so stake that backed a submission is still here when a validator slashes it.
/// Pools lock `minStakePerNode` of active stake per membership; unstaking below the locked amount reverts.
contract NodeRegistry is INodeRegistry, AccessControl, EIP712, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;
    using EnumerableSet for EnumerableSet.AddressSet;

    /// @notice May take stake: the WorkLedger, on invalidated work.
    bytes32 public constant SLASHER_ROLE = keccak256("SLASHER_ROLE");
    /// @notice May lock and unlock stake for memberships: the ComputePool.
    bytes32 public constant POOL_ROLE = keccak256("POOL_ROLE");
    /// @notice EIP-712 type the node key signs to accept a provider.
    bytes32 public constant NODE_BINDING_TYPEHASH = keccak256("NodeBinding(address provider,address node)");

    struct Provider {
        uint128 active;
        uint128 locked; // sum of minStakePerNode over the provider's node memberships
        uint128 unbonding;
        uint64 releaseAt; // when `unbonding` may be withdrawn
    }

    struct Node {
        address provider; // set on the first binding and never changed
        bool active;
        uint32 pools; // memberships, so a node in a pool cannot be removed
    }

    IERC20 public immutable token;
    uint64 public immutable unbondingPeriod;

    mapping(address provider => Provider) private _providers;
    mapping(address node => Node) private _nodes;
    mapping(address provider => EnumerableSet.AddressSet) private _nodesOf;

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
    /// @dev Requirements: caller has SLASHER_ROLE. Takes at most what the provider has. Emits {Slashed}.
    function slash(address provider, uint256 amount, address beneficiary)
        external
        onlyRole(SLASHER_ROLE)
        nonReentrant
        returns (uint256 slashed)
    {
        if (beneficiary == address(0)) revert ZeroAddress();
        Provider storage p = _providers[provider];
        uint256 fromActive = amount < p.active ? amount : p.active;
        uint256 rest = amount - fromActive;
        uint256 fromUnbonding = rest < p.unbonding ? rest : p.unbonding;
        // unchecked: each part is at most the balance it is taken from
        unchecked {
            p.active -= uint128(fromActive);
            p.unbonding -= uint128(fromUnbonding);
        }
        if (fromUnbonding != 0 && p.unbonding == 0) p.releaseAt = 0;
        slashed = fromActive + fromUnbonding;
        if (slashed == 0) return 0;
        emit Slashed(provider, slashed, fromUnbonding, beneficiary);
        token.safeTransfer(beneficiary, slashed);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: caller has POOL_ROLE, `node` is active, its provider's active stake covers every lock
    /// including this one. Emits {StakeLocked}.
    function lockStake(address node, uint256 amount) external onlyRole(POOL_ROLE) returns (address provider) {
        Node storage n = _nodes[node];
        if (!n.active) revert NodeNotActive(node);
        provider = n.provider;
        Provider storage p = _providers[provider];
        uint256 required = uint256(p.locked) + amount;
        if (p.active < required) revert InsufficientActiveStake(provider, p.active, required);
        // unchecked: required <= active < 2^128, and a node cannot be in 2^32 pools
        unchecked {
            p.locked = uint128(required);
            n.pools += 1;
        }
        emit StakeLocked(provider, node, amount);
    }

    /// @inheritdoc INodeRegistry
    /// @dev Requirements: caller has POOL_ROLE and locked exactly `amount` for `node` before. Emits {StakeUnlocked}.
    function unlockStake(address node, uint256 amount) external onlyRole(POOL_ROLE) {
        Node storage n = _nodes[node];
        Provider storage p = _providers[n.provider];
        // checked: an unlock without its lock is a caller bug and must revert, not wrap
        p.locked -= uint128(amount);
        n.pools -= 1;
        emit StakeUnlocked(n.provider, node, amount);
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
    /// @dev False after a slash left less active stake than the provider's memberships lock.
    function isCollateralized(address provider) external view returns (bool) {
        Provider storage p = _providers[provider];
        return p.active >= p.locked;
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
