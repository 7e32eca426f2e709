"""The worker's dashboard source: its journal read on each request, the chain read in a thread every few seconds.

`worker_dashboard(ledger)` serves it over a running `WorkerDaemon`; `prime-node start` hands it to the daemon, which
never imports the dashboard (imports point node.daemon <- node.dashboard).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from node.daemon.state import WorkerState
from node.dashboard.chain import WorkerChain
from node.dashboard.model import ChainReading, WorkerLive, worker_snapshot
from node.dashboard.server import serve_dashboard

if TYPE_CHECKING:
    from aiohttp import web

    from ledger.client import Ledger
    from node.daemon.worker import ServeDashboard, WorkerDaemon

log = logging.getLogger("node.dashboard")

ON_CHAIN_STAGES = ("submitted", "claimed", "invalidated", "void")  # of batches: those the chain may hold


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
                batches = self.state.batches_in_stage(*ON_CHAIN_STAGES)
                self.reading = await asyncio.to_thread(self.chain.read, batches)
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
            batches=self.state.all_batches(),
            reading=self.reading,
            live=self.live(),
            now=time.time(),
            chain_error=self.error,
        )


def worker_dashboard(ledger: Ledger) -> ServeDashboard:
    """The worker's page over a running daemon, reading the chain with `ledger` (the pool's contracts): its journal,
    the chain's word on each file's batch, stake and tokens, and the step it holds."""

    async def serve(daemon: WorkerDaemon, host: str, port: int) -> tuple[web.AppRunner, str]:
        def live() -> WorkerLive:
            step, started = daemon.held_step, daemon.started_at
            return WorkerLive(stopping=daemon.stopping.is_set(), held_step=step, started_at=started)

        chain = WorkerChain(ledger, daemon.pool_id, daemon.node)
        return await serve_dashboard(WorkerDashboard(daemon.state, chain, live), host, port)

    return serve
