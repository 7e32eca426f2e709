"""The pool's terms: what every role of a pool must agree on, built one way, and the rules that read them.

A worker, a validator and the trainer each judge the same file. Where they disagree on a fact (how many steps a
file may lag, when work is claimable, how large a file may be), an honest worker is slashed or a file is paid for
and never trained on. So those facts live here, as one frozen `PoolTerms` per pool, and the rules over them are
pure functions that every role calls instead of restating:

- `step_window` (and `PoolTerms.window`): the policy steps a file may come from, [current - async_level, current];
- `batch_state` (and `PoolTerms.state_of`): a batch pending, claimable, void, invalidated or claimed (the contract's
  rules);
- `DEFAULT_MAX_FILE_BYTES`: the file-size limit a pool has when its spec says nothing;
- `AssignmentTiming` (and `PoolTerms.timing`): how long a signed assignment lives, judged by the issue time the
  trainer signs and the chain's block time, with clock slack both ways: when a worker refuses one as off its clock,
  when it stops submitting its file, and when a validator may call that file stale (reason 4).

The terms come from two places, both fixed by the pool: its ComputePool record on chain (trainer, challenge window,
units cap) and the pool spec its `specURI` names (async level, file-size limit, group shape, task, how many
validators check each key, and the assignments' lifetime and clock slack). A pool without
a spec URI has the defaults below, and its nodes are told where its parts are by flags; a spec URI that cannot be
read is an error, never a reason to fall back on the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.errors import NodeError
from ledger.types import BatchRecord, BatchStatus, PoolInfo

DEFAULT_ASYNC_LEVEL = 2  # files from policy steps >= current - 2 count (DESIGN section 8)
# The widest window any role takes: the origin serves async_level + 2 checkpoint versions, so 64 is already 66 full
# checkpoints on the trainer's disk; a spec saying more is refused as it loads, by every role alike.
MAX_ASYNC_LEVEL = 64
DEFAULT_MAX_FILE_BYTES = 64 << 20  # larger uploads are refused unread (reason 2)
MIN_FILE_BYTES = 1024  # no pool refuses less than this (a rollout file of one row is larger)
MAX_FILE_BYTES = 1 << 30  # no pool accepts more than this per upload
DEFAULT_PROMPTS_PER_TASK = 8  # prompts of one assignment
MAX_PROMPTS_PER_TASK = 4096
DEFAULT_GROUP_SIZE = 8  # samples per prompt
MIN_GROUP_SIZE = 2  # GRPO's advantages need two completions of a problem to compare
MAX_GROUP_SIZE = 1024
DEFAULT_REPLICATION = 1  # validators that check each work key (validator.sharing splits the pool's keys among them)
MAX_REPLICATION = 16
# A generous bound on one policy step of a pool whose spec says nothing: the trainer uses a file while its step is
# in the window, that is for up to async_level + 1 steps after its assignment was issued, so an assignment lives
# that many of these (3 h at the default async level). A pool whose steps take longer sets assignment_lifetime.
DEFAULT_STEP_SECONDS = 3600
MAX_ASSIGNMENT_LIFETIME = 30 * 24 * 3600
# Seconds the clocks of a pool's roles (the trainer's, a worker's, the chain's block times) may disagree, either way:
# the skew a signed request may have (DESIGN section 5).
DEFAULT_CLOCK_SLACK = 300
MAX_CLOCK_SLACK = 3600


class TermsMismatch(NodeError):
    """A role's own setting contradicts the pool's terms; `key` names the setting, the message both values."""

    def __init__(self, key: str, own: object, pool: object, where: str) -> None:
        super().__init__(f"{key} is {own!r}, but {where} says {pool!r}: the pool's terms bind every role")
        self.key, self.own, self.pool = key, own, pool


@dataclass(frozen=True)
class StepWindow:
    """The policy steps whose files count: [oldest, current]."""

    oldest: int
    current: int

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.oldest <= step <= self.current

    def __str__(self) -> str:
        return f"[{self.oldest}, {self.current}]"


def step_window(current: int, async_level: int, *, earliest: int | None = None) -> StepWindow:
    """Files from steps current - async_level .. current count (DESIGN section 8).

    `earliest` is the oldest step that may have been current when a file was submitted, where clocks leave that
    uncertain (a validator judging a backlog): the window then reaches back from it instead."""
    if async_level < 0:
        raise ValueError(f"async_level must be at least 0, got {async_level}")
    start = current if earliest is None else min(earliest, current)
    return StepWindow(start - async_level, current)


def default_assignment_lifetime(async_level: int) -> int:
    """Seconds an assignment lives when the pool's spec says nothing: async_level + 1 steps of DEFAULT_STEP_SECONDS,
    the longest the trainer may still train on its file."""
    return (async_level + 1) * DEFAULT_STEP_SECONDS


@dataclass(frozen=True)
class AssignmentTiming:
    """How long a signed assignment lives: its file must be on chain within `lifetime` seconds of the issue time the
    trainer signed (`protocol.signing.Assignment.issued_at`), and the pool's clocks may disagree by `clock_slack`
    seconds either way. The three rules below leave 2 x clock_slack between the worker's own deadline and the
    validator's, for the worker's clock and the time a transaction takes to be mined."""

    lifetime: int
    clock_slack: int

    def __post_init__(self) -> None:
        if not 0 <= self.clock_slack <= MAX_CLOCK_SLACK:
            raise ValueError(f"clock_slack must be in [0, {MAX_CLOCK_SLACK}] seconds, got {self.clock_slack}")
        if not 2 * self.clock_slack < self.lifetime <= MAX_ASSIGNMENT_LIFETIME:
            raise ValueError(
                f"assignment_lifetime must be in ({2 * self.clock_slack}, {MAX_ASSIGNMENT_LIFETIME}] seconds (more "
                f"than twice the clock slack, {self.clock_slack} s), got {self.lifetime}"
            )

    def off_clock(self, issued_at: int, now: float) -> bool:
        """Whether an assignment the trainer stamped `issued_at` is too far from the receiver's clock `now` to be
        taken: a worker refuses it (the coordinator's fault), and generates nothing for it."""
        return abs(now - issued_at) > self.clock_slack

    def submit_by(self, issued_at: int) -> int:
        """The last time, by the worker's own clock, at which it sends a submission of the assignment's file."""
        return issued_at + self.lifetime - self.clock_slack

    def stale_after(self, issued_at: int) -> int:
        """The chain time after which a submission of the assignment's file is stale (reason 4, slashable): a block
        stamped later than this landed more than the lifetime and the clock slack after the signed issue time."""
        return issued_at + self.lifetime + self.clock_slack


def assignment_timing(async_level: int, lifetime: int | None, clock_slack: int) -> AssignmentTiming:
    """A pool's AssignmentTiming: `lifetime` seconds (None: default_assignment_lifetime of its async level)."""
    return AssignmentTiming(default_assignment_lifetime(async_level) if lifetime is None else lifetime, clock_slack)


DEFAULT_TIMING = assignment_timing(DEFAULT_ASYNC_LEVEL, None, DEFAULT_CLOCK_SLACK)  # a pool with no spec


def challenge_closes_at(submitted_at: int, challenge_window: int) -> int:
    """Chain time from which work submitted at `submitted_at` may be claimed and no longer invalidated."""
    return submitted_at + challenge_window


def batch_state(batch: BatchRecord, challenge_window: int, now: int, *, voided: bool = False) -> str:
    """'pending' while validators may still invalidate it, then 'claimable'; else 'invalidated', 'claimed' or 'none';
    'void' once its node was ejected by an invalidation (`claimBatches` refuses every batch of such a node; an owner's
    ejection voids nothing: its batches are still claimable).

    The contract's rules (WorkLedger): `invalidateBatch` and `refuseLeaf` need `now < submittedAt + window`,
    `claimBatches` needs `now >= submittedAt + window`. A refused leaf leaves its batch pending: only its units are
    not paid.
    """
    if batch.status == BatchStatus.PENDING:
        if voided:
            return "void"
        return "claimable" if now >= challenge_closes_at(batch.submitted_at, challenge_window) else "pending"
    return batch.status.name.lower()


@dataclass(frozen=True)
class PoolTerms:
    """One pool's terms, from its chain record and its spec (see the module docstring)."""

    pool_id: int
    trainer: str  # the pool's trainer: it signs checkpoints, assignments and receipts
    challenge_window: int  # seconds a submission may be invalidated
    max_units_per_key: int
    spec_uri: str = ""  # "" when the pool has none: the defaults hold
    async_level: int = DEFAULT_ASYNC_LEVEL
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    prompts_per_task: int = DEFAULT_PROMPTS_PER_TASK
    group_size: int = DEFAULT_GROUP_SIZE
    replication: int = DEFAULT_REPLICATION  # validators that check each work key; only the first may slash at once
    task_path: Path | None = None  # the spec's task (its cached copy when remote); None without a spec
    task_hash: bytes | None = None  # that task spec's canonical hash, which assignments sign
    # seconds after its signed issue time by which an assignment's file must be on chain (None: from the async level,
    # default_assignment_lifetime), and the clock slack both ways (AssignmentTiming)
    assignment_lifetime: int | None = None
    clock_slack: int = DEFAULT_CLOCK_SLACK

    def __post_init__(self) -> None:
        if not 0 <= self.async_level <= MAX_ASYNC_LEVEL:
            raise ValueError(f"async_level must be in [0, {MAX_ASYNC_LEVEL}], got {self.async_level}")
        if not MIN_FILE_BYTES <= self.max_file_bytes <= MAX_FILE_BYTES:
            raise ValueError(
                f"max_file_bytes must be in [{MIN_FILE_BYTES}, {MAX_FILE_BYTES}], got {self.max_file_bytes}"
            )
        if not 1 <= self.replication <= MAX_REPLICATION:
            raise ValueError(f"replication must be in [1, {MAX_REPLICATION}], got {self.replication}")
        assignment_timing(self.async_level, self.assignment_lifetime, self.clock_slack)  # raises on bad values

    @property
    def timing(self) -> AssignmentTiming:
        """The assignments' lifetime and clock slack, as every role applies them."""
        return assignment_timing(self.async_level, self.assignment_lifetime, self.clock_slack)

    @property
    def source(self) -> str:
        """Where the spec-borne terms come from, for messages."""
        return f"pool {self.pool_id}'s spec {self.spec_uri}" if self.spec_uri else f"pool {self.pool_id} (no spec)"

    def window(self, current: int, *, earliest: int | None = None) -> StepWindow:
        return step_window(current, self.async_level, earliest=earliest)

    def state_of(self, batch: BatchRecord, now: int, *, voided: bool = False) -> str:
        return batch_state(batch, self.challenge_window, now, voided=voided)

    @classmethod
    def of_chain(cls, info: PoolInfo, **spec_terms: object) -> PoolTerms:
        """The terms of the pool `info` describes, with the spec-borne ones given (none: the pool has no spec;
        `protocol.pool_spec.read_terms` reads them)."""
        c = info.config
        chain = (info.pool_id, c.trainer, c.challenge_window, c.max_units_per_key)
        return cls(*chain, **spec_terms)  # type: ignore[arg-type]

    def require(self, key: str, own: object, term: str) -> None:
        """Raises TermsMismatch when a role's setting `own` (named `key` where the role reads it) is not the
        pool's `term`."""
        pool = getattr(self, term)
        if own != pool:
            raise TermsMismatch(key, own, pool, self.source)
