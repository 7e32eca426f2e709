"""The checkpoints a validator holds: a few recent steps, loaded, fetched through SHARDCAST on demand (LRU).

A file is verified with the checkpoint of the step its rows claim. Fetching goes through the pool's sources
(origin and relays) with the trainer's signature checked (`shardcast.client.fetch_checkpoint`). When a step
cannot be fetched, it matters why: if every source answered and none offers the step, the trainer has pruned it
and files of that step can never be verified here (`CheckpointGone`: not the worker's fault, never slashed);
anything else (a source down, a bad shard) is worth another try later.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from core import trace
from engine.memory import Gate, ModelFacts, Plan, validator_plan
from engine.model.loading import LoadedModel, load_model
from shardcast import DownloadFailed, SourceError
from shardcast.client import STEP_DIR_PREFIX, Source, fetch_checkpoint, list_versions, new_session
from shardcast.manifest import Manifest, manifest_hash
from shardcast.trust import TrustPolicy
from validator.errors import CheckpointGone

if TYPE_CHECKING:
    from protocol.tasks.problem import TaskSource
    from protocol.tasks.spec import TaskSpec
    from validator.config import ValidatorConfig

log = logging.getLogger(__name__)


class Checkpoints:
    """Up to `keep` checkpoints loaded in memory (on `device`, in `dtype`), the least recently used dropped first."""

    def __init__(
        self,
        root: Path,
        sources: Sequence[str],
        policy: TrustPolicy,
        *,
        keep: int,
        device: str = "cpu",
        dtype: str = "float32",
        before_load: Callable[[Path], object] | None = None,
    ) -> None:
        """`before_load` sees each checkpoint's directory before it loads, and may refuse it by raising (the memory
        check, `memory_gate`)."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.root, self.sources, self.policy, self.keep = root, list(sources), policy, keep
        self.before_load = before_load
        self.device, self.dtype = device, getattr(torch, dtype)
        self._loaded: OrderedDict[int, LoadedModel] = OrderedDict()

    @property
    def steps(self) -> list[int]:
        """The steps held, least recently used first."""
        return list(self._loaded)

    async def get(self, step: int) -> LoadedModel:
        """The checkpoint of `step`; raises `CheckpointGone`, or `RelayError` when a later try may succeed."""
        if step in self._loaded:
            self._loaded.move_to_end(step)
            return self._loaded[step]
        path = self.path_of(step)
        if not path.is_dir():  # fetch_checkpoint publishes a step's directory only after every byte verified
            sidecar = self._manifest_file(step)

            def remember(manifest: Manifest, _done: int) -> None:  # kept with a rejection's evidence
                sidecar.parent.mkdir(parents=True, exist_ok=True)
                sidecar.write_text(manifest_hash(manifest).hex())

            try:
                with trace.span("fetch", step=step):
                    path = await fetch_checkpoint(self.sources, self.policy, self.root, step=step, on_start=remember)
            except DownloadFailed:
                if await self._gone(step):
                    raise CheckpointGone(step, self.sources) from None
                raise
            log.info("fetched the checkpoint of step %d", step)
        if self.before_load is not None:
            await asyncio.to_thread(self.before_load, path)
        with trace.span("load", step=step):
            self._loaded[step] = await asyncio.to_thread(load_model, path, device=self.device, dtype=self.dtype)
        while len(self._loaded) > self.keep:
            old, _ = self._loaded.popitem(last=False)
            shutil.rmtree(self.path_of(old), ignore_errors=True)
            self._manifest_file(old).unlink(missing_ok=True)
        return self._loaded[step]

    def path_of(self, step: int) -> Path:
        """Where the checkpoint of `step` is (or would be) on disk."""
        return self.root / f"{STEP_DIR_PREFIX}{step}"

    def manifest_hash(self, step: int) -> bytes | None:
        """The hash of the trainer-signed manifest the step was fetched by; None when not recorded."""
        try:
            return bytes.fromhex(self._manifest_file(step).read_text().strip())
        except (OSError, ValueError):
            return None

    def _manifest_file(self, step: int) -> Path:
        return self.root / f"{STEP_DIR_PREFIX}{step}.manifest-hash"

    async def _gone(self, step: int) -> bool:
        """Whether every source answered its version list and none lists `step`."""
        async with new_session() as session:
            listings = await asyncio.gather(
                *(list_versions(session, Source(url)) for url in self.sources), return_exceptions=True
            )
        for url, listing in zip(self.sources, listings, strict=True):
            if isinstance(listing, SourceError):
                log.warning("cannot tell whether step %d is gone: %s", step, listing)
                return False
            if isinstance(listing, BaseException):
                raise listing
            if step in listing.steps:
                log.warning("%s lists step %d but could not deliver it", url, step)
                return False
        return True


def memory_gate(spec: TaskSpec, source: TaskSource, config: ValidatorConfig, *, budget: int | None = None) -> Gate:
    """What each checkpoint passes before it loads: the validator's plan (engine.memory: `checkpoints_kept` steps in
    the pool's precision, a prefill batch of `prefill_batch_size` rows, the float64 recheck) against what is free on
    its device; `budget` replaces what is free (`--memory-budget`)."""
    memory, _, index = config.device.partition(":")

    def plan(facts: ModelFacts, sequence_tokens: int) -> Plan:
        return validator_plan(
            facts,
            dtype=config.dtype,
            device="cuda" if memory == "cuda" else "cpu",
            prefill_batch_size=config.prefill_batch_size,
            checkpoints_kept=config.checkpoints_kept,
            sequence_tokens=sequence_tokens,
            max_tokens=spec.sampling.max_tokens,
        )

    return Gate(spec, source, plan, budget=budget, device_index=int(index or 0))
