"""The worker dashboard's data model: pure functions from the journal and a chain reading to one JSON snapshot.

Nothing here reads the chain, a file or a clock: `WorkerDashboard` (node/dashboard/worker.py) gathers the journal
rows (`node.daemon.state`), the cached `ChainReading` (node/dashboard/chain.py) and the daemon's live status, and
`worker_snapshot` turns them into what `GET /api/state` answers. Every token amount is a whole-token decimal
string (`ledger.units.format_amount`): base units of an 18-decimal token do not fit a JavaScript number.

Where a number is an estimate it says so (`estimate: true` or a label): throughput over a recent window, rewards
that are only paid if no validator invalidates the file first, and slash exposure as an upper bound.

Files reach the chain in batches, one Merkle root each: a file's challenge window is its batch's, and an
invalidation of one leaf voids every file of the batch (the slash shows on the leaf shown bad). A slash reaches only
the stake this node locks in this pool (`NodeRegistry.lockOf`), and burns it; the pending work of a node ejected by
an invalidation is void (never paid), while a node its owner ejected is still paid for what it submitted before,
unless invalidated. Either way its lock is held one challenge window after the ejection (or after leaving) before
`releaseStake` frees it. A file a validator refused (`refuseLeaf`, a borderline verdict) is neither paid nor
slashed; the rest of its batch is paid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ledger.events import BatchInvalidated, LeafRefused
from ledger.types import BatchRecord, BatchStatus, PoolConfig, Reason, StakeInfo, StakeLock
from ledger.units import format_amount
from node.daemon.batches import VOID_DETAIL, leaf_name
from node.daemon.state import BATCH_STAGES, STAGES, BatchEntry, FileRecord
from protocol.terms import batch_state, challenge_closes_at

THROUGHPUT_WINDOW = 600.0  # seconds of recent files the throughput estimate averages over
MAX_FILES_SHOWN = 200  # newest files listed; the counts cover every file

# A file's challenge-window state, as the dashboard shows it; the first three are the journal's own stages
# before the file reaches the chain. `void`: pending work of a node ejected by an invalidation, which is never paid.
# `refused`: a validator's refuseLeaf (a borderline file): never paid, never slashed.
FILE_STATES = (
    "written",
    "uploaded",
    "expired",
    "submitted",
    "pending",
    "claimable",
    "claimed",
    "invalidated",
    "refused",
    "void",
)
VOID_REASON = "the node was ejected from the pool by an invalidation: its pending work is never paid"


@dataclass(frozen=True)
class ChainReading:
    """What the chain said at `read_at` (unix seconds, this machine's clock) about the node and its files."""

    read_at: float
    block: int
    chain_time: int  # the latest block's timestamp: challenge windows run on chain time
    pool: PoolConfig
    decimals: int
    provider: str | None  # None: the node is not bound to a provider
    stake: StakeInfo | None  # the provider's
    member: bool
    ejected: bool  # by its owner or by an invalidation: it submits no more
    lock: StakeLock | None  # this node's lock in this pool (`lockOf`); None when not read
    batches: dict[bytes, BatchRecord] = field(default_factory=dict)  # this node's records of the journal's roots
    invalidations: dict[bytes, BatchInvalidated] = field(default_factory=dict)  # of the journal's batches, by root
    refusals: dict[tuple[bytes, int], LeafRefused] = field(default_factory=dict)  # by (root, leaf index)
    voided: bool = False  # ejected by an invalidation: its pending work is never paid (an owner's ejection voids none)


@dataclass(frozen=True)
class WorkerLive:
    """The daemon's own state, read when the snapshot is built."""

    stopping: bool
    held_step: int | None  # the policy step of the weights held; None before the first
    started_at: float  # unix seconds


@dataclass(frozen=True)
class FileState:
    state: str  # one of FILE_STATES
    closes_at: int | None  # when the challenge window closes (chain time), once submitted
    reason: str | None  # an invalidation's reason label and slash, or why a file expired
    slashed: int  # base units slashed by this file's invalidation (0 when unknown or none)


def file_state(
    record: FileRecord,
    batch: BatchRecord | None,
    invalidation: BatchInvalidated | None,
    window: int,
    now: int,
    *,
    voided: bool = False,
    refusal: LeafRefused | None = None,
) -> FileState:
    """Where one file stands: the chain's word on its batch when it has one (an invalidation or a refusal the daemon
    has not looked at yet shows at once), else the journal's.

    `now` is the chain's time; a submitted file is `pending` until its batch's `submitted_at + window`, then
    `claimable`; once the node is `voided` (ejected by an invalidation) its pending work is `void` instead
    (`claimBatches` refuses it), though a validator may still invalidate the batch until its window closes. An
    invalidation of any leaf voids the whole batch; the slash shows on the leaf it proved. A `refused` file is never
    paid, and may still be invalidated (with its batch) in its window.
    """
    if record.stage == "expired" and (record.detail or "").startswith(VOID_DETAIL):
        return FileState("void", None, record.detail, 0)  # the daemon found it void and journaled so
    if record.stage in ("written", "uploaded", "expired"):
        return FileState(record.stage, None, record.detail if record.stage == "expired" else None, 0)
    known = batch is not None and batch.status != BatchStatus.NONE
    closes_at = challenge_closes_at(batch.submitted_at, window) if batch is not None and known else None
    on_chain = BatchStatus.NONE if batch is None else batch.status
    if invalidation is not None or record.stage == "invalidated" or on_chain == BatchStatus.INVALIDATED:
        if invalidation is not None:
            why = f"{Reason.label(invalidation.reason)}; validator {invalidation.validator}"
            shown, key = invalidation.leaf_index, invalidation.work_key
            if shown is None or key is None:  # no leaf list made available: the slash shows on leaf 0
                return FileState("invalidated", closes_at, f"its batch was invalidated: {why}",
                                 invalidation.slashed if record.leaf_index == 0 else 0)  # fmt: skip
            if record.leaf_index == shown:
                return FileState("invalidated", closes_at, why, invalidation.slashed)
            return FileState("invalidated", closes_at, f"its batch was voided by {leaf_name(shown, key)}: {why}", 0)
        return FileState("invalidated", closes_at, record.detail or "reason not read from the chain yet", 0)
    if refusal is not None or record.stage == "refused":
        if refusal is not None:
            return FileState("refused", closes_at, f"{Reason.label(refusal.reason)}; validator {refusal.validator}", 0)
        return FileState("refused", closes_at, record.detail or "reason not read from the chain yet", 0)
    if record.stage == "claimed" or on_chain == BatchStatus.CLAIMED:
        return FileState("claimed", closes_at, None, 0)
    if closes_at is None:  # journaled as submitted, not read from the chain yet
        return FileState("submitted", None, None, 0)
    if voided:
        return FileState("void", closes_at, VOID_REASON, 0)
    assert batch is not None  # closes_at is known
    return FileState(batch_state(batch, window, now), closes_at, None, 0)


def throughput(records: Sequence[FileRecord], *, now: float, since: float, window: float) -> dict[str, Any]:
    """Files per minute and output tokens per second over the last `window` seconds (or since `since`, the
    daemon's start, when that is later): an estimate, from the journal's `created` times and work units."""
    start = max(now - window, since)
    elapsed = now - start
    recent = [r for r in records if r.created >= start]
    units = sum(r.units for r in recent)
    files_per_min = len(recent) / elapsed * 60 if elapsed > 0 else 0.0
    tokens_per_s = units / elapsed if elapsed > 0 else 0.0
    return {
        "estimate": True,
        "window_s": round(elapsed, 1),
        "files": len(recent),
        "units": units,
        "files_per_min": round(files_per_min, 3),
        "tokens_per_s": round(tokens_per_s, 2),
    }


def standing(reading: ChainReading | None) -> str:
    if reading is None:
        return "unknown (chain not read yet)"
    if reading.provider is None:
        return "not registered"
    if reading.ejected:
        return "ejected" if reading.voided else "ejected by its owner"
    return "member" if reading.member else "registered, not a member"


def worker_snapshot(
    *,
    node: str,
    pool_id: int,
    records: Sequence[FileRecord],
    reading: ChainReading | None,
    live: WorkerLive,
    now: float,
    chain_error: str | None = None,
    batches: Sequence[BatchEntry] = (),
) -> dict[str, Any]:
    """The worker view of `GET /api/state`. `records` are the journal's file rows in creation order, `batches` its
    batches."""
    counts = {stage: 0 for stage in STAGES}
    for record in records:
        counts[record.stage] += 1
    batch_counts = {stage: 0 for stage in BATCH_STAGES}
    for batch in batches:
        batch_counts[batch.stage] += 1
    snapshot: dict[str, Any] = {
        "role": "worker",
        "generated_at": now,
        "node": node,
        "pool_id": pool_id,
        "daemon": "stopping" if live.stopping else "running",
        "started_at": live.started_at,
        "standing": standing(reading),
        "step": live.held_step,
        "newest_file_step": max((r.step for r in records), default=None),
        "throughput": throughput(records, now=now, since=live.started_at, window=THROUGHPUT_WINDOW),
        "counts": counts,
        "batch_counts": batch_counts,
        "chain": _chain(reading, chain_error, now),
    }
    if reading is None:
        states = {r.work_key: file_state(r, None, None, 0, 0) for r in records}
        snapshot |= {"provider": None, "pool": None, "stake": None, "lock": None, "tokens": None}
    else:
        window, now_chain = reading.pool.challenge_window, reading.chain_time
        states = {
            r.work_key: file_state(
                r,
                reading.batches.get(r.root) if r.root is not None else None,
                reading.invalidations.get(r.root) if r.root is not None else None,
                window,
                now_chain,
                voided=reading.voided,
                refusal=_refusal(reading, r),
            )
            for r in records
        }
        snapshot |= {
            "provider": reading.provider,
            "pool": _pool(reading),
            "stake": _stake(reading),
            "lock": _lock(reading),
            "tokens": _tokens(records, states, reading),
        }
    shown = list(records)[-MAX_FILES_SHOWN:][::-1]  # newest first
    tokens = reading.decimals if reading is not None else 18
    per_unit = reading.pool.reward_per_unit if reading is not None else None
    snapshot["files_total"] = len(records)
    snapshot["files"] = [_file(r, states[r.work_key], per_unit, tokens) for r in shown]
    return snapshot


def _refusal(reading: ChainReading, record: FileRecord) -> LeafRefused | None:
    if record.root is None or record.leaf_index is None:
        return None
    return reading.refusals.get((record.root, record.leaf_index))


def _chain(reading: ChainReading | None, error: str | None, now: float) -> dict[str, Any]:
    if reading is None:
        return {"block": None, "time": None, "read_at": None, "age_s": None, "error": error}
    return {
        "block": reading.block,
        "time": reading.chain_time,
        "read_at": reading.read_at,
        "age_s": round(now - reading.read_at, 1),
        "error": error,  # the last refresh failed: the numbers are from `read_at`
    }


def _pool(reading: ChainReading) -> dict[str, Any]:
    pool, d = reading.pool, reading.decimals
    return {
        "name": pool.name,
        "challenge_window_s": pool.challenge_window,
        "reward_per_unit": format_amount(pool.reward_per_unit, d, places=18),
        "slash_amount": format_amount(pool.slash_amount, d),
        "min_stake_per_node": format_amount(pool.min_stake_per_node, d),
        "trainer": pool.trainer,
    }


def _stake(reading: ChainReading) -> dict[str, Any] | None:
    stake, d = reading.stake, reading.decimals
    if stake is None:
        return None
    lock = reading.lock
    node_locked = lock.amount if lock is not None and lock.open else 0
    return {
        "active": format_amount(stake.active, d),
        "unbonding": format_amount(stake.unbonding, d),
        "locked": format_amount(stake.locked, d),  # by every lock of the provider's nodes, in every pool
        "free": format_amount(max(0, stake.active - stake.locked), d),
        "node_locked": format_amount(node_locked, d),  # by this node's lock in this pool (held on after leaving)
        "release_at": stake.release_at or None,  # of the unbonding stake
    }


def lock_state(lock: StakeLock | None, now: int) -> str:
    """`member` (locked while a member), `held` (left or ejected: held until `release_at`), `releasable` (the
    window passed: `releaseStake` frees it), or `none` (never joined, or released)."""
    if lock is None or not lock.open:
        return "none"
    if lock.member:
        return "member"
    return "releasable" if lock.releasable(now) else "held"


def _lock(reading: ChainReading) -> dict[str, Any]:
    """This node's lock in this pool: what a slash here can still burn, and when it may be released."""
    lock, d = reading.lock, reading.decimals
    state = lock_state(lock, reading.chain_time)
    held = lock is not None and lock.open
    return {
        "amount": format_amount(lock.amount if lock is not None and held else 0, d),
        "state": state,
        "release_at": lock.release_at if lock is not None and state in ("held", "releasable") else None,
    }


def _tokens(records: Sequence[FileRecord], states: dict[bytes, FileState], reading: ChainReading) -> dict[str, Any]:
    """Earned and at-risk amounts of this node's files in this pool (the journal's files only)."""
    per_unit, d = reading.pool.reward_per_unit, reading.decimals
    sums = {"claimed": 0, "claimable": 0, "pending": 0, "invalidated": 0, "refused": 0, "void": 0}
    pending, void, refused, exposed, slashed = 0, 0, 0, 0, 0
    open_batches: set[bytes] = set()
    for record in records:
        state = states[record.work_key]
        if state.state in sums:
            sums[state.state] += record.units * per_unit
        pending += state.state == "pending"
        void += state.state == "void"
        refused += state.state == "refused"
        # a batch may be invalidated while its window is open, void or refused leaves or not
        open_window = state.closes_at is not None and reading.chain_time < state.closes_at
        if state.state in ("pending", "void", "refused") and open_window:
            exposed += 1
            if record.root is not None:
                open_batches.add(record.root)
        slashed += state.slashed
    lock = reading.lock
    slashable = lock.amount if lock is not None and lock.open else 0
    # each invalidation (one per batch: it voids the batch) burns `slashAmount` from this node's lock in this pool,
    # never more than it holds, and nothing else of the provider's stake (NodeRegistry.slash)
    exposure = min(len(open_batches) * reading.pool.slash_amount, slashable)
    return {
        "claimed": format_amount(sums["claimed"], d),
        "claimable": format_amount(sums["claimable"], d),
        "pending_rewards": format_amount(sums["pending"], d),  # paid only if no validator invalidates first
        "slash_exposure": format_amount(exposure, d),  # upper bound: every batch in its window invalidated
        "pending_files": pending,
        "exposed_files": exposed,  # pending, void and refused files whose challenge window is still open
        "exposed_batches": len(open_batches),  # their batches: each invalidation burns one slash
        "void_rewards": format_amount(sums["void"], d),  # of an ejected node's pending work: never paid
        "void_files": void,
        "refused_rewards": format_amount(sums["refused"], d),  # of borderline files validators refused: never paid
        "refused_files": refused,
        "lost_rewards": format_amount(sums["invalidated"], d),
        "slashed": format_amount(slashed, d),  # burned from this node's lock
    }


def _file(record: FileRecord, state: FileState, per_unit: int | None, decimals: int) -> dict[str, Any]:
    # what it earns, will earn if not invalidated, or earned; never for an expired, invalidated, refused or void file
    paid = state.state not in ("expired", "invalidated", "refused", "void")
    return {
        "work_key": "0x" + record.work_key.hex(),
        "step": record.step,
        "counter": record.counter,
        "units": record.units,
        "stage": record.stage,  # the journal's
        "state": state.state,  # the dashboard's, the chain's word first
        "closes_at": state.closes_at,
        "reason": state.reason,
        "slashed": format_amount(state.slashed, decimals) if state.slashed else None,
        "reward": None if per_unit is None or not paid else format_amount(record.units * per_unit, decimals),
        "batch": "0x" + record.root.hex() if record.root is not None else None,
        "leaf_index": record.leaf_index,
        "tx": record.tx,
        "verdict": record.verdict,
        "created": record.created,
    }
