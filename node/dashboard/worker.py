"""The worker's dashboard source: its journal read on each request, the chain read in a thread every few seconds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from node.daemon.state import WorkerState
from node.dashboard.chain import WorkerChain
from node.dashboard.model import ChainReading, WorkerLive, worker_snapshot

log = logging.getLogger("node.dashboard")

ON_CHAIN_STAGES = ("submitted", "claimed", "invalidated")


class WorkerDashboard:
    """`DashboardSource` of a worker: `state` is the daemon's journal, read on the event loop's thread (where the
    daemon opened it); `chain` is read only by `refresh`, in a worker thread."""

    def __init__(
        self,
        state: WorkerState,
        chain: WorkerChain,
        live: Callable[[], WorkerLive],
        *,
        refresh_seconds: float = 5.0,
    ) -> None:
        self.state, self.chain, self.live = state, chain, live
        self.refresh_seconds = refresh_seconds
        self.reading: ChainReading | None = None
        self.error: str | None = None

    async def refresh(self) -> None:
        while True:
            try:
                keys = [record.work_key for record in self.state.in_stage(*ON_CHAIN_STAGES)]
                self.reading = await asyncio.to_thread(self.chain.read, keys)
                self.error = None
            except Exception as exc:  # an RPC endpoint down: show the last reading, its age, and why
                if self.error is None:
                    log.warning("dashboard: reading the chain failed, showing the last reading: %s", exc)
                self.error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.refresh_seconds)

    async def snapshot(self) -> dict[str, Any]:
        return worker_snapshot(
            node=self.chain.node,
            pool_id=self.chain.pool_id,
            records=self.state.all(),
            reading=self.reading,
            live=self.live(),
            now=time.time(),
            chain_error=self.error,
        )
