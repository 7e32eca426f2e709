// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {IComputePool} from "./interfaces/IComputePool.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";
import {IWorkLedger} from "./interfaces/IWorkLedger.sol";

/// @title WorkLedger
/// @notice Holds each pool's reward escrow, records submitted work, lets validators invalidate it inside the
/// challenge window, and pays providers for work that outlived the window.
/// @dev A work record fits one storage slot (node, units, submittedAt, status): submitting costs one fresh slot.
/// The provider is not stored: a node's binding in the registry is permanent, so it is looked up.
contract WorkLedger is IWorkLedger, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    struct Work {
        address node; // 160 bits
        uint48 units; // output tokens; 2^48 is far beyond any file size limit
        uint40 submittedAt; // seconds; good for 34,000 years
        WorkStatus status; // 8 bits
    }

    /// @notice Highest reason code (DESIGN section 5): 1 hash mismatch ... 8 file unavailable.
    uint8 public constant MAX_REASON = 8;

    IComputePool public immutable pools;
    INodeRegistry public immutable registry;
    IERC20 public immutable token;

    mapping(uint256 poolId => uint256) public escrowOf;
    mapping(uint256 poolId => mapping(bytes32 workKey => Work)) private _works;

    /// @param pools_ The ComputePool whose members submit and whose validators invalidate.
    /// @param registry_ The NodeRegistry this ledger slashes (it needs SLASHER_ROLE there).
    constructor(IComputePool pools_, INodeRegistry registry_) {
        if (address(pools_) == address(0) || address(registry_) == address(0)) revert ZeroAddress();
        pools = pools_;
        registry = registry_;
        token = registry_.token();
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: the pool exists, `amount > 0`, allowance for this contract. Emits {RewardsFunded}.
    function fundRewards(uint256 poolId, uint256 amount) external nonReentrant {
        if (amount == 0) revert ZeroAmount();
        if (poolId == 0 || poolId > pools.poolCount()) revert PoolNotFound(poolId);
        escrowOf[poolId] += amount;
        emit RewardsFunded(poolId, msg.sender, amount);
        token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: the caller is a member node whose provider is collateralized, the key is new,
    /// `0 < units < 2^48`. Emits {WorkSubmitted}.
    function submitWork(uint256 poolId, bytes32 workKey, uint256 units) external {
        address provider = _memberProvider(poolId);
        _record(_works[poolId], poolId, workKey, units);
        emit WorkSubmitted(poolId, workKey, msg.sender, provider, units);
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: as {submitWork} for every key, equal non-zero lengths. Emits one {WorkBatchSubmitted}:
    /// a per-key event would cost more than the storage budget of a batched key allows.
    function submitWorkBatch(uint256 poolId, bytes32[] calldata workKeys, uint256[] calldata units) external {
        uint256 n = workKeys.length;
        if (n == 0) revert EmptyBatch();
        if (n != units.length) revert LengthMismatch(n, units.length);
        address provider = _memberProvider(poolId);
        mapping(bytes32 => Work) storage works = _works[poolId];
        for (uint256 i; i < n; ++i) {
            _record(works, poolId, workKeys[i], units[i]);
        }
        emit WorkBatchSubmitted(poolId, msg.sender, provider, workKeys, units);
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: the caller validates the pool, the work is pending, `1 <= reason <= MAX_REASON`, and
    /// `block.timestamp < submittedAt + challengeWindow`. Emits {WorkInvalidated}.
    function invalidateWork(uint256 poolId, bytes32 workKey, uint8 reason) external nonReentrant {
        if (reason == 0 || reason > MAX_REASON) revert InvalidReason(reason);
        Work storage work = _pending(poolId, workKey);
        if (!pools.isValidator(poolId, msg.sender)) revert NotValidator(poolId, msg.sender);
        (uint64 window,, uint256 slashAmount) = pools.terms(poolId);
        uint64 closesAt = uint64(work.submittedAt) + window;
        if (block.timestamp >= closesAt) revert ChallengeWindowClosed(poolId, workKey, closesAt);
        work.status = WorkStatus.Invalidated;
        address node = work.node;
        // Interactions with the registry and pool fixed at construction (trusted code, guarded by nonReentrant);
        // the escrow credit needs the slashed amount, which only the registry knows.
        uint256 slashed = registry.slash(registry.providerOf(node), slashAmount, address(this));
        escrowOf[poolId] += slashed;
        pools.eject(poolId, node);
        emit WorkInvalidated(poolId, workKey, msg.sender, reason, slashed);
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: every key is pending, past its window, and belongs to one provider; the escrow covers
    /// the payout. Anyone may call: the tokens always go to the provider. Emits {RewardsClaimed}.
    function claimRewards(uint256 poolId, bytes32[] calldata workKeys) external nonReentrant {
        uint256 n = workKeys.length;
        if (n == 0) revert EmptyBatch();
        (uint64 window, uint256 rewardPerUnit,) = pools.terms(poolId);
        address provider;
        address lastNode;
        uint256 units;
        for (uint256 i; i < n; ++i) {
            Work storage work = _pending(poolId, workKeys[i]);
            uint64 closesAt = uint64(work.submittedAt) + window;
            if (block.timestamp < closesAt) revert ChallengeWindowOpen(poolId, workKeys[i], closesAt);
            address node = work.node;
            if (node != lastNode) {
                address owner = registry.providerOf(node);
                if (provider == address(0)) provider = owner;
                else if (owner != provider) revert MixedProviders(provider, owner);
                lastNode = node;
            }
            units += work.units;
            work.status = WorkStatus.Claimed;
        }
        uint256 amount = units * rewardPerUnit;
        uint256 available = escrowOf[poolId];
        if (amount > available) revert InsufficientEscrow(poolId, amount, available);
        // unchecked: amount <= available
        unchecked {
            escrowOf[poolId] = available - amount;
        }
        emit RewardsClaimed(poolId, provider, amount, n);
        token.safeTransfer(provider, amount);
    }

    /// @inheritdoc IWorkLedger
    function getWork(uint256 poolId, bytes32 workKey)
        external
        view
        returns (address node, address provider, uint256 units, uint64 submittedAt, WorkStatus status)
    {
        Work storage work = _works[poolId][workKey];
        node = work.node;
        provider = node == address(0) ? address(0) : registry.providerOf(node);
        return (node, provider, work.units, work.submittedAt, work.status);
    }

    /// @dev The caller's provider, if the caller is a member of `poolId` and its provider's stake still covers
    /// its locks (a slash may have left it short).
    function _memberProvider(uint256 poolId) private view returns (address provider) {
        provider = pools.memberProvider(poolId, msg.sender);
        if (provider == address(0)) revert NotPoolMember(poolId, msg.sender);
        if (!registry.isCollateralized(provider)) revert ProviderUndercollateralized(provider);
    }

    function _record(mapping(bytes32 => Work) storage works, uint256 poolId, bytes32 workKey, uint256 units) private {
        if (units == 0 || units > type(uint48).max) revert UnitsOutOfRange(units, type(uint48).max);
        Work storage work = works[workKey];
        if (work.status != WorkStatus.None) revert WorkExists(poolId, workKey);
        // One SSTORE of the whole slot; a struct assignment would write it field by field. The layout is the
        // struct's, low bits first: node 0-159, units 160-207, submittedAt 208-247, status 248-255. units < 2^48 was
        // checked above; block.timestamp < 2^40 holds until the year 36812.
        uint256 packed = uint256(uint160(msg.sender)) | (units << 160) | (block.timestamp << 208)
            | (uint256(uint8(WorkStatus.Pending)) << 248);
        assembly ("memory-safe") {
            sstore(work.slot, packed)
        }
    }

    function _pending(uint256 poolId, bytes32 workKey) private view returns (Work storage work) {
        work = _works[poolId][workKey];
        if (work.status == WorkStatus.None) revert WorkNotFound(poolId, workKey);
        if (work.status != WorkStatus.Pending) revert WorkNotPending(poolId, workKey, work.status);
    }
}
