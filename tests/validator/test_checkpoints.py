"""The validator's checkpoints: fetched from a real SHARDCAST origin on demand, a few kept (LRU), a pruned step gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from eth_account import Account

from protocol.signing import SigningDomain
from shardcast import DownloadFailed
from shardcast.origin import Origin
from shardcast.server import ShardServer
from shardcast.store import ShardStore
from shardcast.trust import TrustPolicy
from validator.checkpoints import Checkpoints
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
