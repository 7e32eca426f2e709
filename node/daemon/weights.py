"""The policy a worker holds: the newest checkpoint it fetched through SHARDCAST, loaded, with its manifest hash."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from core import trace
from core.hostmemory import memory_totals
from engine.memory import Gate, ModelFacts, Plan, worker_plan
from engine.model.loading import LoadedModel, load_model
from shardcast.client import fetch_checkpoint
from shardcast.manifest import manifest_hash
from shardcast.sources import SourcePool
from shardcast.trust import TrustPolicy

if TYPE_CHECKING:
    from engine.inference.select import Choice
    from protocol.tasks.problem import TaskSource
    from protocol.tasks.spec import TaskSpec


class Weights:
    """Fetches a step's checkpoint (signature checked against the trainer) and keeps only the one in use.

    `hold` may be called from two tasks (the loop, and a prefetch after an announcement): one fetch runs at a
    time, and a caller that waited for a fetch of the same step gets its result without fetching again.
    """

    def __init__(
        self,
        root: Path,
        sources: SourcePool,
        policy: TrustPolicy,
        *,
        on_load: Callable[[LoadedModel], None] | None = None,
        before_load: Callable[[Path], object] | None = None,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        """`before_load` sees each fetched checkpoint's directory before it loads, and may refuse it by raising (the
        worker's memory check, `engine.memory.Gate`); `on_load` sees each model loaded."""
        self.root, self.sources, self.policy, self.on_load = root, sources, policy, on_load
        self.before_load = before_load
        self.device, self.dtype = device, dtype  # where and in what precision `hold` loads the model
        self.step: int | None = None
        self.loaded: LoadedModel | None = None
        self.manifest_hash = b""
        self._lock = asyncio.Lock()

    async def hold(self, step: int) -> LoadedModel:
        if self.step == step and self.loaded is not None:
            return self.loaded
        async with self._lock:
            if self.step == step and self.loaded is not None:  # fetched by the task that held the lock
                return self.loaded
            return await self._fetch_and_load(step)

    async def _fetch_and_load(self, step: int) -> LoadedModel:
        hashes: list[bytes] = []
        with trace.span("fetch", step=step):
            path = await fetch_checkpoint(
                self.sources, self.policy, self.root, step=step, on_start=lambda m, _: hashes.append(manifest_hash(m))
            )
        sidecar = self.root / f"step_{step}.manifest-hash"  # a checkpoint already on disk was not fetched again
        if hashes:
            sidecar.write_text(hashes[0].hex())
        held_hash = bytes.fromhex(sidecar.read_text().strip())
        if self.before_load is not None:
            await asyncio.to_thread(self.before_load, path)
        with trace.span("load", step=step, into="torch"):
            loaded = await asyncio.to_thread(load_model, path, device=self.device, dtype=getattr(torch, self.dtype))
        if self.on_load is not None:
            self.on_load(loaded)
        # all three at once, with no await between: the loop reads `manifest_hash` right after a `hold` that
        # returned the step already held, while a prefetch of the next step may be loading
        self.loaded, self.step, self.manifest_hash = loaded, step, held_hash
        for old in self.root.glob("step_*"):  # keep only what is in use
            if old.name in (f"step_{step}", f"step_{step}.manifest-hash"):
                continue
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
        return self.loaded


def memory_gate(
    spec: TaskSpec,
    source: TaskSource,
    choice: Choice,
    *,
    batch_size: int,
    file_rows: int,
    prefetch: bool = False,
    budget: int | None = None,
) -> Gate:
    """What each policy passes before it loads (`Weights`' `before_load`, and `prime-node doctor --model`): the
    worker's plan (engine.memory) for generating with `choice`, `batch_size` sequences at once (never more than a
    file's `file_rows`), beside a prefetched policy with `prefetch` (gossip), against what is free on the device, or
    `budget` bytes (`--memory-budget`)."""
    totals = memory_totals()

    def plan(facts: ModelFacts, sequence_tokens: int) -> Plan:
        return worker_plan(
            facts,
            choice,
            batch_size=batch_size,
            file_rows=file_rows,
            sequence_tokens=sequence_tokens,
            totals=totals,
            prefetch=prefetch,
        )

    return Gate(spec, source, plan, budget=budget)
