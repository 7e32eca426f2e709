"""The validator's checkpoints: fetched from a real SHARDCAST origin on demand, a few kept (LRU), a pruned step gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from eth_account import Account

from core.hostmemory import MIB
from engine.memory import MemoryShortfall
from protocol.signing import SigningDomain
from protocol.tasks.problem import TaskSource
from protocol.tasks.spec import TaskSpec
from shardcast import DownloadFailed
from shardcast.origin import Origin
from shardcast.server import ShardServer
from shardcast.store import ShardStore
from shardcast.trust import TrustPolicy
from validator.checkpoints import Checkpoints, memory_gate
from validator.config import ValidatorConfig
from validator.errors import CheckpointGone

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
TRAINER = Account.from_key(b"\x21" * 32)
POOL = 2
DEAD_SOURCE = "http://127.0.0.1:9"  # the discard port: nothing listens


def test_steps_are_fetched_on_demand_kept_lru_and_a_pruned_one_is_gone(
    tmp_path: Path, model_dirs: dict[str, Path]
) -> None:
    async def scenario() -> None:
        server = ShardServer(ShardStore(tmp_path / "origin"), role="origin")
        url = f"http://127.0.0.1:{await server.start('127.0.0.1', 0)}"
        origin = Origin(server, account=TRAINER, domain=DOMAIN, pool_id=POOL, keep=2)
        policy = TrustPolicy(DOMAIN, TRAINER.address, POOL)
        try:
            await origin.publish(model_dirs["m0"], 1)
            await origin.publish(model_dirs["m0_step"], 2)
            held = Checkpoints(tmp_path / "held", [url], policy, keep=1)
            first = await held.get(1)
            assert await held.get(1) is first  # held: not fetched or loaded again
            await held.get(2)
            assert held.steps == [2] and not (tmp_path / "held" / "step_1").exists()  # the least recently used left

            await origin.publish(model_dirs["m1"], 3)  # keep=2: step 1 is pruned at the origin
            with pytest.raises(CheckpointGone, match="step 1 is no longer offered"):
                await held.get(1)
            unsure = Checkpoints(tmp_path / "unsure", [url, DEAD_SOURCE], policy, keep=1)
            with pytest.raises(DownloadFailed):  # a source did not answer: it may still hold step 1
                await unsure.get(1)
            assert (await unsure.get(3)).path == tmp_path / "unsure" / "step_3"
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_a_checkpoint_that_does_not_fit_is_fetched_but_never_loaded(
    tmp_path: Path, model_dirs: dict[str, Path], task_spec: TaskSpec, task_source: TaskSource
) -> None:
    config = ValidatorConfig()  # float32, 3 checkpoints kept, prefill batches of 8
    small = memory_gate(task_spec, task_source, config, budget=64 * MIB)

    async def scenario() -> str:
        server = ShardServer(ShardStore(tmp_path / "origin"), role="origin")
        url = f"http://127.0.0.1:{await server.start('127.0.0.1', 0)}"
        origin = Origin(server, account=TRAINER, domain=DOMAIN, pool_id=POOL, keep=2)
        policy = TrustPolicy(DOMAIN, TRAINER.address, POOL)
        try:
            await origin.publish(model_dirs["m0"], 1)
            held = Checkpoints(tmp_path / "held", [url], policy, keep=config.checkpoints_kept, before_load=small.check)
            with pytest.raises(MemoryShortfall) as refused:
                await held.get(1)
            assert held.steps == [] and held.path_of(1).is_dir()  # fetched, verified, not loaded
            roomy = memory_gate(task_spec, task_source, config)  # what is free here holds the tiny model
            loaded = Checkpoints(tmp_path / "held", [url], policy, keep=1, before_load=roomy.check)
            assert (await loaded.get(1)).path == held.path_of(1) and roomy.fits is not None and roomy.fits[0].ok
            return str(refused.value)
        finally:
            await server.stop()

    line = asyncio.run(scenario())
    assert line.startswith(f"the model in {tmp_path / 'held' / 'step_1'} (1M parameters) needs ")
    assert " of RAM to validate in float32 here (weights of 3 steps 14 MiB + KV cache " in line
    assert "+ recheck 9 MiB + engine 256 MiB) and 64 MiB is free (--memory-budget): lower prefill_batch_size" in line
    assert line.endswith(
        "(now 8) or checkpoints_kept (now 3), use another device (--device), or work for a bfloat16 pool (half the "
        "weights)"
    )
