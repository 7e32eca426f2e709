"""The validator's dashboard source (`prime-validate run --dashboard-port P`; the page is node/dashboard's).

Everything but the chain head comes from the daemon's store (`validator.store`), read on the event loop's thread
where the daemon opened it: verdicts, rejections by reason, the invalidations this validator sent, the backlog
(rows with something left to do) and the cursor. The chain head is read in a thread every few seconds, so the
page can say how far behind the cursor is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ledger.types import Reason
from validator.store import ValidatorStore, WorkRow
from validator.verdict import Outcome

log = logging.getLogger("validator.dashboard")

MAX_FILES_SHOWN = 100  # newest submissions listed; the counts cover every one


class ValidatorDashboard:
    """`node.dashboard.DashboardSource` of a validator daemon."""

    def __init__(
        self,
        store: ValidatorStore,
        *,
        validator: str,
        cursor: Callable[[], int],
        head: Callable[[], int],
        stopping: Callable[[], bool],
        refresh_seconds: float = 5.0,
    ) -> None:
        self.store, self.validator, self.cursor, self.head, self.stopping = store, validator, cursor, head, stopping
        self.refresh_seconds = refresh_seconds
        self.started_at = time.time()
        self.head_block: int | None = None

    async def refresh(self) -> None:
        """Keeps the chain head fresh; `head` is a blocking RPC call, made in a thread."""
        failing = False
        while True:
            try:
                self.head_block = await asyncio.to_thread(self.head)
                failing = False
            except Exception as exc:  # the RPC endpoint down: the page shows the last head it knew
                if not failing:
                    log.warning("dashboard: reading the chain head failed: %s", exc)
                failing = True
            await asyncio.sleep(self.refresh_seconds)

    async def snapshot(self) -> dict[str, Any]:
        return validator_snapshot(
            validator=self.validator,
            pool_id=self.store.pool_id,
            counts=self.store.counts(),
            verdicts=self.store.verdict_counts(),
            invalidations_sent=self.store.invalidations_sent(),
            refusals_sent=self.store.refusals_sent(),
            backlog=self.store.open_count(),
            cursor_block=self.cursor(),
            head_block=self.head_block,
            rows=self.store.newest(MAX_FILES_SHOWN),
            stopping=self.stopping(),
            started_at=self.started_at,
            now=time.time(),
        )


def validator_snapshot(
    *,
    validator: str,
    pool_id: int,
    counts: dict[str, int],
    verdicts: Sequence[tuple[bool, int | None, int]],
    invalidations_sent: int,
    refusals_sent: int,
    backlog: int,
    cursor_block: int,
    head_block: int | None,
    rows: Sequence[WorkRow],
    stopping: bool,
    started_at: float,
    now: float,
) -> dict[str, Any]:
    """The validator view of `GET /api/state`. `verdicts` are (accepted, reason, files) groups."""
    accepted = sum(n for ok, _, n in verdicts if ok)
    by_reason: dict[str, int] = {}
    for ok, reason, n in verdicts:
        if not ok:
            label = Reason.label(reason) if reason is not None else "no reason recorded"
            by_reason[label] = by_reason.get(label, 0) + n
    rejected = sum(by_reason.values())
    # the cursor is the next block to read: everything up to head has been read when cursor == head + 1
    behind = None if head_block is None else max(0, head_block + 1 - cursor_block)
    return {
        "role": "validator",
        "generated_at": now,
        "validator": validator,
        "pool_id": pool_id,
        "daemon": "stopping" if stopping else "running",
        "started_at": started_at,
        "cursor_block": cursor_block,
        "head_block": head_block,
        "blocks_behind": behind,
        "backlog": backlog,
        "counts": counts,
        "seen": sum(counts.values()),
        "verified": accepted + rejected,  # files with a verdict (a file unavailable within the grace is rejected)
        "accepted": accepted,
        "rejected": rejected,
        "rejections_by_reason": [
            {"reason": label, "count": n} for label, n in sorted(by_reason.items(), key=lambda item: -item[1])
        ],
        "invalidations_sent": invalidations_sent,
        "refusals_sent": refusals_sent,  # refuseLeaf of borderline rejections: not paid, not slashed
        "files": [_file(row) for row in rows],
    }


def _file(row: WorkRow) -> dict[str, Any]:
    return {
        "work_key": "0x" + row.work_key.hex(),
        "node": row.node,
        "units": row.units,
        "block": row.block,
        "submitted_at": row.submitted_at,
        "stage": row.stage,
        "accepted": row.accepted,
        "reason": row.reason,
        "reason_label": Reason.label(row.reason) if row.reason is not None else None,
        "check": row.check,
        "detail": row.detail,
        "tx": row.tx_hash,
        "note": row.note,
        "borderline": row.outcome is Outcome.BORDERLINE,
        "last_error": row.last_error,
        "attempts": row.attempts,
    }
