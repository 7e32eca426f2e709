"""A worker's policy (`node.daemon.weights.Weights`) moves to the next step by its delta when it holds the step before:
the origin sends the delta, not the checkpoint, and the model loaded is the trainer's, weight for weight."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import torch
from eth_account import Account
from safetensors.torch import load_file, save_file

from engine.model.tiny import init_model
from node.daemon.weights import Weights
from protocol.signing import SigningDomain
from shardcast.delta import DeltaPolicy
from shardcast.server import ShardServer
from shardcast.sources import SourcePool
from shardcast.store import ShardStore
from shardcast.trust import TrustPolicy, sign_manifest

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
TRAINER = Account.from_key(b"\x01" * 32)


def next_step(first: Path, out: Path) -> Path:
    """`first` with one weight in 50 moved, in bfloat16: a small step of a bfloat16 pool."""
    shutil.copytree(first, out)
    weights = out / "model.safetensors"
    tensors = load_file(str(weights))
    generator = torch.Generator().manual_seed(1)
    moved = {}
    for name, tensor in tensors.items():
        tensor = tensor.to(torch.bfloat16)
        mask = torch.rand(tensor.shape, generator=generator) < 0.02
        moved[name] = torch.where(mask, tensor * 1.5 + 0.01, tensor).contiguous()
    save_file(moved, str(weights))
    return out


def test_a_worker_holding_the_step_before_loads_the_next_from_its_delta(tmp_path: Path) -> None:
    first = init_model(tmp_path / "first", seed=0)
    tensors = load_file(str(first / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(first / "model.safetensors"))
    second = next_step(first, tmp_path / "second")
    store = ShardStore(tmp_path / "origin")
    for step, folder in ((1, first), (2, second)):
        store.publish_dir(
            folder, pool_id=7, step=step, shard_size=64 * 1024, delta=DeltaPolicy(min_bytes=0),
            sign=lambda m: sign_manifest(m, TRAINER, DOMAIN),
        )  # fmt: skip
    manifest = store.manifest(2)
    assert manifest.delta is not None and manifest.delta_size < manifest.checkpoint_size / 5

    async def scenario() -> tuple[float, float]:
        server = ShardServer(store, role="origin")
        url = f"http://127.0.0.1:{await server.start('127.0.0.1', 0)}"
        try:
            weights = Weights(
                tmp_path / "worker", SourcePool([url]), TrustPolicy(DOMAIN, TRAINER.address, 7), dtype="bfloat16"
            )
            await weights.hold(1)
            before = _sent(server)
            loaded = await weights.hold(2)
            want = load_file(str(second / "model.safetensors"))
            for name, tensor in loaded.model.state_dict().items():
                if name in want:
                    assert torch.equal(tensor, want[name]), name
            return before, _sent(server)
        finally:
            await server.stop()

    before, after = asyncio.run(scenario())
    weights_bytes = (second / "model.safetensors").stat().st_size
    assert after - before < weights_bytes / 5  # the delta and the files without one, not the weights again
    assert sorted(p.name for p in (tmp_path / "worker").iterdir()) == ["step_2", "step_2.manifest-hash"]


def _sent(server: ShardServer) -> float:
    text = server.metrics.render()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("shardcast_bytes_sent_total"))
