import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from eth_account import Account

from protocol.signing import SigningDomain
from shardcast.origin import Origin
from shardcast.server import ShardServer
from shardcast.store import ShardStore
from shardcast.trust import TrustPolicy

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
TRAINER = Account.from_key(b"\x01" * 32)


def write_step(folder: Path, step: int, payload: bytes, *, subdir: bool = False) -> None:
    staging = folder.parent / f"staging_{step}"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(payload)
    if subdir:
        (staging / "nested").mkdir()
    os.rename(staging, folder / f"step_{step}")


def test_watch_publishes_new_steps_signed_skips_a_bad_one_and_prunes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    store = ShardStore(tmp_path / "store")

    async def scenario() -> None:
        server = ShardServer(store, role="origin")
        origin = Origin(server, account=TRAINER, domain=DOMAIN, pool_id=3, keep=2, shard_size=1024)
        watcher = asyncio.create_task(origin.watch(folder, interval=0.02))
        try:
            write_step(folder, 1, b"one" * 1000)
            write_step(folder, 2, b"two", subdir=True)  # not a flat directory of files: refused, not fatal
            write_step(folder, 3, b"three" * 1000)
            write_step(folder, 4, b"four" * 1000)
            for _ in range(200):
                if store.versions() == [3, 4]:
                    break
                await asyncio.sleep(0.02)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    asyncio.run(scenario())
    assert store.versions() == [3, 4]  # 1 published then pruned (keep=2), 2 refused
    assert "cannot publish" in caplog.text and "step_2" in caplog.text
    policy = TrustPolicy(DOMAIN, TRAINER.address, pool_id=3)
    for step in (3, 4):
        policy.check(store.manifest(step), store.signature(step), step=step)
    assert store.read_shard(4, "model.safetensors", 0) == (b"four" * 1000)[:1024]


def test_an_origin_signs_the_manifest_format_it_is_given(tmp_path: Path) -> None:
    """`--manifest-format 1`: every version it publishes is format 1 (sha256 shards only), signed and served."""
    store = ShardStore(tmp_path / "store")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(os.urandom(5000))

    async def scenario() -> None:
        server = ShardServer(store, role="origin")
        origin = Origin(server, account=TRAINER, domain=DOMAIN, pool_id=3, shard_size=1024, manifest_format=1)
        await origin.publish(checkpoint, 1)

    asyncio.run(scenario())
    manifest = store.manifest(1)
    assert manifest.format_version == 1 and all(s.blake3 is None for f in manifest.files for s in f.shards)
    TrustPolicy(DOMAIN, TRAINER.address, pool_id=3).check(manifest, store.signature(1), step=1)
    with pytest.raises(ValueError, match="manifest_format must be one of"):
        Origin(ShardServer(store, role="origin"), account=TRAINER, domain=DOMAIN, pool_id=3, manifest_format=4)
