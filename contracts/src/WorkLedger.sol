// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {IComputePool} from "./interfaces/IComputePool.sol";
import {INodeRegistry} from "./interfaces/INodeRegistry.sol";
import {IWorkLedger} from "./interfaces/IWorkLedger.sol";
import {BatchMerkle} from "./libraries/BatchMerkle.sol";

/// @title WorkLedger
/// @notice Holds each pool's reward escrow, records submitted work one Merkle root per batch, lets validators
/// invalidate (slash) a batch or refuse (void, no slash) one of its files inside the challenge window, each with the
/// file's Merkle proof, and pays providers for batches that outlived the window.
/// @dev A batch record is two words (the root; count, submittedAt, status, totalUnits, refusedUnits) in one of the
/// node's numbered batch slots, under (pool, node, slot), whatever the batch's count; a record belongs to the node
/// that made it. A node names the slot it submits into, one that is empty or whose batch is settled (claimed or
/// invalidated): writing over a settled batch's words costs 5,000 gas a word, where a fresh word costs 22,100, and
/// the chain holds as many records a node as it has batches in flight, not one per batch ever. A batch of one file
/// is the single-file case: there is no other way to record work. Refused leaves are bits of a bitmap under the
/// batch's root. The provider is not stored: a node's binding in the registry is permanent,
/// so it is looked up. Slashed stake is burned in the registry, never credited here: a pool's escrow holds only what
/// was funded, so no invalidation pays anyone.
contract WorkLedger is IWorkLedger, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    struct Batch {
        bytes32 root; // word 0: the Merkle root of its leaves (BatchMerkle)
        uint32 count; // word 1 from here: leaves, at least 1
        uint40 submittedAt; // seconds
        BatchStatus status; // 8 bits
        uint80 totalUnits; // at most count x maxUnitsPerKey < 2^32 x 2^48
        uint80 refusedUnits; // refused leaves' units, at most totalUnits
    }

    /// @notice Highest reason code (DESIGN section 5): 1 hash mismatch ... 8 file unavailable.
    uint8 public constant MAX_REASON = 8;
    /// @notice The most leaves a batch may hold: a record stores the count in 32 bits (a proof of 32 siblings).
    uint256 public constant MAX_LEAVES = type(uint32).max;
    /// @notice The reason of `invalidateUnavailableBatch`: the batch's leaf list was never made available.
    uint8 public constant FILE_UNAVAILABLE = 8;
    /// @notice `BatchInvalidated.leafIndex` of an invalidation that names no leaf (`invalidateUnavailableBatch`).
    uint256 public constant NO_LEAF = type(uint256).max;

    IComputePool public immutable pools;
    INodeRegistry public immutable registry;
    IERC20 public immutable token;

    mapping(uint256 poolId => uint256) public escrowOf;
    mapping(uint256 poolId => mapping(address node => mapping(uint256 slot => Batch))) private _batches;
    /// @dev Bit `index % 256` of word `index / 256`: leaf `index` of the node's batch `root` was refused. Keyed by the
    /// root, not the slot: a node's second record of one root (which names every file a second time, and which
    /// validators invalidate for that, reason 3) shares its first record's bits; the units a claim leaves out are
    /// each record's own `refusedUnits`.
    mapping(uint256 poolId => mapping(address node => mapping(bytes32 root => mapping(uint256 word => uint256))))
        private _refusedLeaves;

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
    /// @dev Requirements: the caller is a member node, `1 <= count <= MAX_LEAVES`, `0 < totalUnits <= count x
    /// maxUnitsPerKey`, and the caller's slot `slot` is not holding a pending batch. Emits {BatchSubmitted}.
    function submitBatch(uint256 poolId, uint256 slot, bytes32 root, uint256 count, uint256 totalUnits) external {
        if (count == 0 || count > MAX_LEAVES) revert LeafCountOutOfRange(count, MAX_LEAVES);
        (, uint256 maxUnits) = _memberTerms(poolId);
        uint256 cap = count * maxUnits; // < 2^32 x 2^48: no overflow, and it fits totalUnits' 80 bits
        if (totalUnits == 0 || totalUnits > cap) revert UnitsOutOfRange(totalUnits, cap);
        Batch storage batch = _batches[poolId][msg.sender][slot];
        if (batch.status == BatchStatus.Pending) revert SlotInUse(poolId, msg.sender, slot, batch.root);
        batch.root = root;
        // One SSTORE of the record's second word; a struct assignment would write each field with its own
        // read-modify-write. The layout is the struct's, low bits first: count 0-31, submittedAt 32-71, status 72-79,
        // totalUnits 80-159, refusedUnits 160-239 (zero). block.timestamp < 2^40 holds until the year 36812.
        uint256 packed =
            count | (block.timestamp << 32) | (uint256(uint8(BatchStatus.Pending)) << 72) | (totalUnits << 80);
        assembly ("memory-safe") {
            sstore(add(batch.slot, 1), packed)
        }
        emit BatchSubmitted(poolId, root, msg.sender, slot, count, totalUnits);
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: `1 <= reason <= MAX_REASON`, the batch pending, the caller a validator of the pool and
    /// `block.timestamp < submittedAt + challengeWindow`, in that order, then
    /// `leaf.index < count`, a proof of `depth(count)` siblings, and the leaf hashing up to `root`. A refused leaf
    /// may be shown: a refusal is never a shield against a slash. Emits {BatchInvalidated}.
    function invalidateBatch(
        uint256 poolId,
        address node,
        BatchRef calldata ref,
        LeafProof calldata leaf,
        uint8 reason
    ) external nonReentrant {
        (Batch storage batch, uint256 slashAmount) = _provenLeaf(poolId, node, ref, leaf, reason);
        _invalidate(batch, poolId, node, ref.root, slashAmount, leaf.index, leaf.workKey, reason);
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: as {invalidateBatch} without the reason and the proof: the batch pending, the caller a
    /// validator of the pool, `block.timestamp < submittedAt + challengeWindow`, in that order. Emits
    /// {BatchInvalidated} with `leafIndex = NO_LEAF`, `workKey = 0` and `reason = FILE_UNAVAILABLE`.
    function invalidateUnavailableBatch(uint256 poolId, address node, BatchRef calldata ref) external nonReentrant {
        (Batch storage batch, uint256 slashAmount) = _challengeableBatch(poolId, node, ref);
        _invalidate(batch, poolId, node, ref.root, slashAmount, NO_LEAF, bytes32(0), FILE_UNAVAILABLE);
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: as {invalidateBatch}, and the leaf not refused before. The refused units are capped at
    /// what the batch has left, so a leaf that claims more than its batch (a reason-2 fault, for an invalidation)
    /// cannot take the payout below zero. No interaction. Emits {LeafRefused}.
    function refuseLeaf(uint256 poolId, address node, BatchRef calldata ref, LeafProof calldata leaf, uint8 reason)
        external
    {
        (Batch storage batch,) = _provenLeaf(poolId, node, ref, leaf, reason);
        bytes32 root = ref.root;
        _markRefused(_refusedLeaves[poolId][node][root], poolId, node, root, leaf.index);
        uint256 total = batch.totalUnits;
        uint256 already = batch.refusedUnits;
        // unchecked: already <= total, and what is stored is at most total
        unchecked {
            batch.refusedUnits = uint80(leaf.units < total - already ? already + leaf.units : total);
        }
        emit LeafRefused(poolId, root, node, msg.sender, leaf.index, leaf.workKey, leaf.units, reason);
    }

    /// @inheritdoc IWorkLedger
    /// @dev Requirements: `node` was not ejected by an invalidation, every root is its pending batch past its window,
    /// and the escrow covers the payout. Anyone may call: the tokens always go to the node's provider.
    /// Emits {BatchesClaimed}.
    function claimBatches(uint256 poolId, address node, BatchRef[] calldata refs) external nonReentrant {
        uint256 n = refs.length;
        if (n == 0) revert EmptyBatch();
        if (pools.ejectionOf(poolId, node) == IComputePool.Ejection.ByInvalidation) revert NodeEjected(poolId, node);
        (uint64 window, uint256 rewardPerUnit,,) = pools.terms(poolId);
        address provider = registry.providerOf(node);
        mapping(uint256 => Batch) storage batches = _batches[poolId][node];
        uint256 units;
        for (uint256 i; i < n; ++i) {
            (Batch storage batch, BatchStatus status) = _found(batches, poolId, node, refs[i]);
            bytes32 root = refs[i].root;
            if (status != BatchStatus.Pending) revert BatchNotPending(poolId, node, root, status);
            uint64 closesAt = uint64(batch.submittedAt) + window;
            if (block.timestamp < closesAt) revert BatchChallengeWindowOpen(poolId, node, root, closesAt);
            // refusedUnits <= totalUnits (refuseLeaf caps it)
            units += batch.totalUnits - batch.refusedUnits;
            batch.status = BatchStatus.Claimed;
        }
        uint256 amount = units * rewardPerUnit;
        uint256 available = escrowOf[poolId];
        if (amount > available) revert InsufficientEscrow(poolId, amount, available);
        // unchecked: amount <= available
        unchecked {
            escrowOf[poolId] = available - amount;
        }
        emit BatchesClaimed(poolId, provider, node, amount, refs);
        token.safeTransfer(provider, amount);
    }

    /// @inheritdoc IWorkLedger
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
        )
    {
        Batch storage batch = _batches[poolId][node][slot];
        status = batch.status;
        if (status != BatchStatus.None) provider = registry.providerOf(node);
        return (batch.root, provider, batch.count, batch.totalUnits, batch.refusedUnits, batch.submittedAt, status);
    }

    /// @inheritdoc IWorkLedger
    function isLeafRefused(uint256 poolId, address node, bytes32 root, uint256 index) external view returns (bool) {
        return _refusedLeaves[poolId][node][root][index >> 8] & (uint256(1) << (index & 0xff)) != 0;
    }

    /// @dev The caller's provider and the pool's cap on units per key, if the caller is a member of `poolId`.
    function _memberTerms(uint256 poolId) private view returns (address provider, uint256 maxUnits) {
        (provider, maxUnits) = pools.memberTerms(poolId, msg.sender);
        if (provider == address(0)) revert NotPoolMember(poolId, msg.sender);
    }

    /// @dev The pending batch a validator of `poolId` may still judge by `leaf`, and the pool's slash: checks the
    /// reason, then the batch as `_challengeableBatch` does, then that the leaf is inside the tree and that its proof
    /// reaches `root`.
    function _provenLeaf(uint256 poolId, address node, BatchRef calldata ref, LeafProof calldata leaf, uint8 reason)
        private
        view
        returns (Batch storage batch, uint256 slashAmount)
    {
        if (reason == 0 || reason > MAX_REASON) revert InvalidReason(reason);
        (batch, slashAmount) = _challengeableBatch(poolId, node, ref);
        bytes32 root = ref.root;
        uint256 count = batch.count;
        if (leaf.index >= count) revert LeafOutOfRange(root, leaf.index, count);
        uint256 depth = BatchMerkle.depth(count);
        if (leaf.siblings.length != depth) revert ProofLengthMismatch(root, leaf.siblings.length, depth);
        bytes32 computed =
            BatchMerkle.rootOf(BatchMerkle.leafHash(leaf.workKey, leaf.units), leaf.index, leaf.siblings);
        if (computed != root) revert InvalidProof(root, leaf.index, computed);
    }

    /// @dev The pending batch a validator of `poolId` may still judge, and the pool's slash: checks the status, the
    /// caller's role and the open window, in that order.
    function _challengeableBatch(uint256 poolId, address node, BatchRef calldata ref)
        private
        view
        returns (Batch storage batch, uint256 slashAmount)
    {
        BatchStatus status;
        (batch, status) = _found(_batches[poolId][node], poolId, node, ref);
        bytes32 root = ref.root;
        if (status != BatchStatus.Pending) revert BatchNotPending(poolId, node, root, status);
        if (!pools.isValidator(poolId, msg.sender)) revert NotValidator(poolId, msg.sender);
        uint64 window;
        (window,, slashAmount,) = pools.terms(poolId);
        uint64 closesAt = uint64(batch.submittedAt) + window;
        if (block.timestamp >= closesAt) revert BatchChallengeWindowClosed(poolId, node, root, closesAt);
    }

    /// @dev The batch `ref` names and its status: its slot must hold its root (`BatchNotFound` otherwise: never
    /// submitted there, taken out by a reorganisation, or settled and written over by a later batch).
    function _found(mapping(uint256 => Batch) storage batches, uint256 poolId, address node, BatchRef calldata ref)
        private
        view
        returns (Batch storage batch, BatchStatus status)
    {
        batch = batches[ref.slot];
        status = batch.status;
        if (status == BatchStatus.None || batch.root != ref.root) {
            revert BatchNotFound(poolId, node, ref.slot, ref.root);
        }
    }

    /// @dev An invalidation's effects: the batch void, `slashAmount` burned from the node's lock (at most what it
    /// holds), the node ejected by invalidation (which voids its other pending batches in the pool).
    function _invalidate(
        Batch storage batch,
        uint256 poolId,
        address node,
        bytes32 root,
        uint256 slashAmount,
        uint256 leafIndex,
        bytes32 workKey,
        uint8 reason
    ) private {
        batch.status = BatchStatus.Invalidated;
        // Interactions with the registry and pool fixed at construction (trusted code, guarded by nonReentrant).
        uint256 slashed = registry.slash(poolId, node, slashAmount);
        pools.ejectForInvalidation(poolId, node);
        emit BatchInvalidated(poolId, root, node, msg.sender, leafIndex, workKey, reason, slashed);
    }

    /// @dev Sets leaf `index`'s bit in a batch's bitmap of refused leaves, once.
    function _markRefused(
        mapping(uint256 => uint256) storage refused,
        uint256 poolId,
        address node,
        bytes32 root,
        uint256 index
    ) private {
        uint256 bit = uint256(1) << (index & 0xff);
        uint256 word = refused[index >> 8];
        if (word & bit != 0) revert LeafAlreadyRefused(poolId, node, root, index);
        refused[index >> 8] = word | bit;
    }
}
