"""Typed views of what the contracts return."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class BatchStatus(IntEnum):
    """Mirrors `IWorkLedger.BatchStatus`: a batch is paid whole (less its refused leaves) or not at all."""

    NONE = 0
    PENDING = 1  # refused leaves included: they only take their units out of the payout
    INVALIDATED = 2  # one leaf shown bad: the whole batch void, the node slashed and ejected by invalidation
    CLAIMED = 3


class Ejection(IntEnum):
    """Mirrors `IComputePool.Ejection`: how a node left a pool for good."""

    NONE = 0
    BY_OWNER = 1  # no new work; what it submitted before is still paid after its window unless invalidated
    BY_INVALIDATION = 2  # all of its pending work in the pool is void


class Reason(IntEnum):
    """Why a validator rejected a file (DESIGN section 5); the uint8 passed to `invalidateBatch` and `refuseLeaf`."""

    HASH_MISMATCH = 1
    BAD_FORMAT = 2
    WRONG_ASSIGNMENT = 3
    STALE_STEP = 4
    INVALID_SAMPLING = 5
    REWARD_MISMATCH = 6
    PROOF_INVALID = 7
    FILE_UNAVAILABLE = 8

    @classmethod
    def label(cls, code: int) -> str:
        """`proof_invalid (7)`; a code no validator should send reads `unknown (N)`."""
        name = cls(code).name.lower() if code in cls._value2member_map_ else "unknown"
        return f"{name} ({code})"


@dataclass(frozen=True)
class PoolConfig:
    """`IComputePool.PoolConfig`; amounts in base units, `challenge_window` in seconds."""

    name: str
    model_hash: bytes
    spec_uri: str
    trainer: str
    min_stake_per_node: int
    challenge_window: int
    reward_per_unit: int
    slash_amount: int
    max_nodes: int = 0
    max_units_per_key: int = 1_000_000  # a rollout file's output tokens; the contract allows up to 2^48 - 1

    def as_tuple(self) -> tuple[object, ...]:
        return (
            self.name,
            self.model_hash,
            self.spec_uri,
            self.trainer,
            self.min_stake_per_node,
            self.challenge_window,
            self.reward_per_unit,
            self.slash_amount,
            self.max_nodes,
            self.max_units_per_key,
        )


@dataclass(frozen=True)
class PoolInfo:
    pool_id: int
    owner: str
    config: PoolConfig


@dataclass(frozen=True)
class StakeInfo:
    active: int
    unbonding: int
    locked: int
    release_at: int  # block timestamp when `unbonding` may be withdrawn; 0 when nothing unbonds


@dataclass(frozen=True)
class StakeLock:
    """What `node`'s membership of `pool_id` locks (`NodeRegistry.lockOf`)."""

    pool_id: int
    node: str
    amount: int  # what a slash in this pool can still take
    release_at: int  # when a lock that is no longer a membership may be released; 0 while a member
    member: bool
    open: bool  # False: no lock (never joined, or released)

    def releasable(self, now: int) -> bool:
        return self.open and not self.member and now >= self.release_at


@dataclass(frozen=True)
class BatchRecord:
    """`node`'s batch `root` in `pool_id`, held in the node's batch slot `slot` (`WorkLedger.getBatch`); status NONE,
    with zeros, when the slot does not hold it; `provider` is the zero address when it has none."""

    pool_id: int
    root: bytes
    node: str
    provider: str
    count: int
    total_units: int
    refused_units: int  # what refused leaves took out of the payout, at most total_units
    submitted_at: int
    status: BatchStatus
    slot: int = 0

    @property
    def payable_units(self) -> int:
        """What a claim of the pending batch pays for: its total less its refused leaves' units. The record's own
        figure, whatever its status: an invalidated or claimed batch pays nothing more."""
        return self.total_units - self.refused_units
