import dataclasses
import hashlib
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import pytest

from shardcast import (
    FileHashMismatch,
    IncompleteCheckpoint,
    RelayError,
    ShardHashMismatch,
    TargetExists,
    UnknownShard,
    VersionExists,
    VersionNotFound,
)
from shardcast.manifest import Manifest, build_manifest, encode_manifest
from shardcast.partial import JOURNAL_NAME, PartialCheckpoint
from shardcast.store import ShardStore

KIB = 1024
SHARD = 64 * KIB


def make_checkpoint(d: Path, seed: int) -> Path:
    rng = random.Random(seed)
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(rng.randbytes(2 * 1024 * KIB + 777))
    (d / "tokenizer.json").write_bytes(rng.randbytes(100 * KIB))
    (d / "config.json").write_bytes(b'{"vocab_size": 256}')
    (d / "empty.txt").write_bytes(b"")
    return d


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "source", seed=1)


@pytest.fixture
def manifest(source: Path) -> Manifest:
    return build_manifest(source, pool_id=1, step=10, shard_size=SHARD)


def all_shards(m: Manifest) -> list[tuple[str, int]]:
    return [(f.name, s.index) for f in m.files for s in f.shards]


def shard_bytes(source: Path, m: Manifest, file: str, index: int) -> bytes:
    s = m.file(file).shards[index]  # type: ignore[union-attr]
    return (source / file).read_bytes()[s.offset : s.offset + s.size]


def assert_same_tree(a: Path, b: Path) -> None:
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for p in a.iterdir():
        assert p.read_bytes() == (b / p.name).read_bytes(), p.name


# ---- ShardStore ----


def test_store_round_trip_serves_every_shard(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    store = ShardStore(tmp_path / "store")
    store.put_version(manifest, source)
    assert store.versions() == [10]
    assert len(all_shards(manifest)) > 30
    for file, index in all_shards(manifest):
        assert store.read_shard(10, file, index) == shard_bytes(source, manifest, file, index)
    reopened = ShardStore(tmp_path / "store")  # manifest read back from disk
    assert reopened.manifest(10) == manifest
    assert reopened.manifest_bytes(10) == encode_manifest(manifest)
    opened, offset, size = reopened.open_shard(10, "model.safetensors", 3)
    with opened:
        assert (offset, size) == (3 * SHARD, SHARD)
        assert opened.name == str(tmp_path / "store" / "v" / "10" / "model.safetensors")


def test_store_refuses_a_corrupt_source_and_stores_nothing(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    data = bytearray((source / "model.safetensors").read_bytes())
    data[5 * SHARD + 17] ^= 0xFF
    (source / "model.safetensors").write_bytes(bytes(data))
    store = ShardStore(tmp_path / "store")
    with pytest.raises(ShardHashMismatch) as e:
        store.put_version(manifest, source)
    assert (e.value.file, e.value.index) == ("model.safetensors", 5)
    assert store.versions() == [] and list((tmp_path / "store" / "tmp").iterdir()) == []


def test_store_refuses_a_source_file_longer_than_the_manifest(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    with open(source / "config.json", "ab") as f:
        f.write(b"trailing")
    with pytest.raises(FileHashMismatch):
        ShardStore(tmp_path / "store").put_version(manifest, source)


def test_store_put_is_idempotent_but_refuses_another_manifest(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    store = ShardStore(tmp_path / "store")
    store.put_version(manifest, source)
    store.put_version(manifest, source)
    with pytest.raises(VersionExists):
        store.put_version(dataclasses.replace(manifest, pool_id=2), source)


def test_store_unknown_version_or_shard(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    store = ShardStore(tmp_path / "store")
    store.put_version(manifest, source)
    with pytest.raises(VersionNotFound):
        store.read_shard(11, "config.json", 0)
    with pytest.raises(UnknownShard):
        store.read_shard(10, "config.json", 1)
    with pytest.raises(UnknownShard):
        store.read_shard(10, "../v/10/manifest.json", 0)


def test_store_prune_keeps_the_newest_versions(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "store")
    for step in [3, 1, 20, 7]:
        src = make_checkpoint(tmp_path / f"src{step}", seed=step)
        store.put_version(build_manifest(src, pool_id=1, step=step, shard_size=SHARD), src)
    assert store.versions() == [1, 3, 7, 20]
    assert store.prune(keep_last=2) == [1, 3]
    assert store.versions() == [7, 20]
    assert sorted(p.name for p in (tmp_path / "store" / "v").iterdir()) == ["20", "7"]
    with pytest.raises(VersionNotFound):
        store.manifest(3)
    assert store.read_shard(7, "config.json", 0) == b'{"vocab_size": 256}'
    with pytest.raises(ValueError):
        store.prune(keep_last=0)


def test_store_clears_leftovers_of_a_crashed_copy(tmp_path: Path) -> None:
    (tmp_path / "store" / "tmp" / "10.abc" / "files").mkdir(parents=True)
    store = ShardStore(tmp_path / "store")
    assert store.versions() == [] and list((tmp_path / "store" / "tmp").iterdir()) == []


# ---- PartialCheckpoint ----


def test_assembler_accepts_shards_in_random_order(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    target = tmp_path / "out" / "ckpt"
    pc = PartialCheckpoint(target, manifest)
    order = all_shards(manifest)
    random.Random(3).shuffle(order)
    for n, (file, index) in enumerate(order):
        assert pc.write_shard(file, index, shard_bytes(source, manifest, file, index))
        assert not target.exists()
        assert len(pc.missing()) == len(order) - n - 1
    assert pc.done_bytes == manifest.total_size
    file, index = order[0]
    assert not pc.write_shard(file, index, shard_bytes(source, manifest, file, index))  # already done
    assert pc.finish() == target
    assert_same_tree(target, source)  # no journal or manifest copy left in it
    assert not pc.partial.exists()


def test_assembler_accepts_shards_from_many_threads(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    pc = PartialCheckpoint(tmp_path / "ckpt", manifest)
    order = all_shards(manifest)
    random.Random(4).shuffle(order)

    def fetch(key: tuple[str, int]) -> bool:
        file, index = key
        return pc.write_shard(file, index, shard_bytes(source, manifest, file, index))

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(fetch, order))
    assert_same_tree(pc.finish(), source)


def test_corrupted_shard_is_rejected_and_writes_nothing(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    pc = PartialCheckpoint(tmp_path / "ckpt", manifest)
    good = shard_bytes(source, manifest, "model.safetensors", 4)
    bad = bytes([good[0] ^ 1]) + good[1:]
    with pytest.raises(ShardHashMismatch) as e:
        pc.write_shard("model.safetensors", 4, bad)
    assert (e.value.file, e.value.index) == ("model.safetensors", 4)
    with pytest.raises(ShardHashMismatch):
        pc.write_shard("model.safetensors", 4, good[:-1])  # truncated
    on_disk = (pc.partial / "model.safetensors").read_bytes()[4 * SHARD : 5 * SHARD]
    assert on_disk == bytes(SHARD)
    assert ("model.safetensors", 4) in pc.missing()
    with pytest.raises(UnknownShard):
        pc.write_shard("model.safetensors", 999, good)


def test_resume_after_a_simulated_kill(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    target = tmp_path / "ckpt"
    order = all_shards(manifest)
    random.Random(5).shuffle(order)
    first = PartialCheckpoint(target, manifest)
    for key in order[: len(order) // 2]:
        first.write_shard(*key, shard_bytes(source, manifest, *key))
    del first  # the process dies: no finish, no cleanup
    second = PartialCheckpoint(target, manifest)
    assert sorted(second.missing()) == sorted(order[len(order) // 2 :])
    for key in second.missing():
        second.write_shard(*key, shard_bytes(source, manifest, *key))
    assert_same_tree(second.finish(), source)


def test_resume_after_sigkill_in_another_process(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    target = tmp_path / "ckpt"
    script = f"""
import os, signal
from pathlib import Path
from shardcast.manifest import build_manifest
from shardcast.partial import PartialCheckpoint
src = Path({str(source)!r})
m = build_manifest(src, pool_id=1, step=10, shard_size={SHARD})
pc = PartialCheckpoint(Path({str(target)!r}), m)
for n, (f, s) in enumerate((f, s) for f in m.files for s in f.shards):
    if n == 20:
        os.kill(os.getpid(), signal.SIGKILL)
    pc.write_shard(f.name, s.index, (src / f.name).read_bytes()[s.offset : s.offset + s.size])
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2], check=False)
    assert proc.returncode == -9
    assert not target.exists()
    pc = PartialCheckpoint(target, manifest)
    assert len(pc.missing()) == len(all_shards(manifest)) - 20
    for key in pc.missing():
        pc.write_shard(*key, shard_bytes(source, manifest, *key))
    assert_same_tree(pc.finish(), source)


def test_torn_shard_is_detected_on_resume(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    pc = PartialCheckpoint(tmp_path / "ckpt", manifest)
    for key in all_shards(manifest)[:10]:
        pc.write_shard(*key, shard_bytes(source, manifest, *key))
    del pc
    partial = tmp_path / "ckpt.partial"
    with open(partial / "model.safetensors", "r+b") as f:  # a torn write: the second half of shard 2 never landed
        f.seek(2 * SHARD + SHARD // 2)
        f.write(bytes(SHARD // 2))
    with open(partial / JOURNAL_NAME, "a") as f:
        f.write("3\tmodel.safe")  # and a torn journal line
    resumed = PartialCheckpoint(tmp_path / "ckpt", manifest)
    done = set(all_shards(manifest)) - set(resumed.missing())
    assert done == set(all_shards(manifest)[:10]) - {("model.safetensors", 2)}


def test_partial_of_another_version_is_discarded(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    pc = PartialCheckpoint(tmp_path / "ckpt", manifest)
    pc.write_shard("config.json", 0, (source / "config.json").read_bytes())
    del pc
    newer = PartialCheckpoint(tmp_path / "ckpt", dataclasses.replace(manifest, step=11))
    assert len(newer.missing()) == len(all_shards(manifest))


def test_finish_refuses_missing_shards(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    pc = PartialCheckpoint(tmp_path / "ckpt", manifest)
    for key in all_shards(manifest)[1:]:
        pc.write_shard(*key, shard_bytes(source, manifest, *key))
    with pytest.raises(IncompleteCheckpoint) as e:
        pc.finish()
    assert e.value.missing == [all_shards(manifest)[0]]
    assert not (tmp_path / "ckpt").exists()


def test_finish_refuses_a_wrong_file_hash(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    files = tuple(dataclasses.replace(f, sha256=bytes(32)) if f.name == "tokenizer.json" else f for f in manifest.files)
    lying = dataclasses.replace(manifest, files=files)  # shard hashes right, whole-file hash wrong
    pc = PartialCheckpoint(tmp_path / "ckpt", lying)
    for key in all_shards(lying):
        pc.write_shard(*key, shard_bytes(source, lying, *key))
    with pytest.raises(FileHashMismatch) as e:
        pc.finish()
    assert e.value.file == "tokenizer.json"
    assert not (tmp_path / "ckpt").exists() and pc.partial.exists()


def test_finish_reasks_for_shards_corrupted_after_writing(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    pc = PartialCheckpoint(tmp_path / "ckpt", manifest)
    for key in all_shards(manifest):
        pc.write_shard(*key, shard_bytes(source, manifest, *key))
    with open(pc.partial / "model.safetensors", "r+b") as f:
        f.seek(7 * SHARD)
        f.write(b"rot")
    with pytest.raises(FileHashMismatch):
        pc.finish()
    assert pc.missing() == [("model.safetensors", 7)]
    pc.write_shard("model.safetensors", 7, shard_bytes(source, manifest, "model.safetensors", 7))
    assert_same_tree(pc.finish(), source)


def test_an_existing_target_is_never_overwritten(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(TargetExists):
        PartialCheckpoint(tmp_path / "taken", manifest)
    pc = PartialCheckpoint(tmp_path / "ckpt", manifest)
    for key in all_shards(manifest):
        pc.write_shard(*key, shard_bytes(source, manifest, *key))
    (tmp_path / "ckpt").mkdir()  # appeared meanwhile (an empty dir would be silently replaced by rename)
    with pytest.raises(TargetExists):
        pc.finish()
    assert list((tmp_path / "ckpt").iterdir()) == []
    os.rmdir(tmp_path / "ckpt")
    assert_same_tree(pc.finish(), source)


# ---- streaming writes: write_unverified + commit ----


def test_streamed_shard_is_committed_only_with_the_right_hash(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    partial = PartialCheckpoint(tmp_path / "out", manifest)
    data = shard_bytes(source, manifest, "model.safetensors", 2)
    partial.write_unverified("model.safetensors", 2, 0, [data[:1000], data[1000:5000]])
    partial.write_unverified("model.safetensors", 2, 5000, [data[5000:]])
    for wrong in (blake3.blake3(b"other").digest(), hashlib.sha256(data).digest()):  # format 2 checks BLAKE3
        with pytest.raises(ShardHashMismatch):
            partial.commit("model.safetensors", 2, wrong)
    assert not partial.has("model.safetensors", 2)
    partial.commit("model.safetensors", 2, blake3.blake3(data).digest())
    assert partial.has("model.safetensors", 2)
    with pytest.raises(RelayError, match="already written"):  # a done shard is never overwritten
        partial.write_unverified("model.safetensors", 2, 0, [b"x"])
    with pytest.raises(RelayError, match="do not fit"):
        partial.write_unverified("model.safetensors", 3, SHARD - 1, [b"ab"])
    for file, index in all_shards(manifest):
        if (file, index) != ("model.safetensors", 2):
            partial.write_shard(file, index, shard_bytes(source, manifest, file, index))
    assert_same_tree(partial.finish(verify_files=False), source)


def test_uncommitted_streamed_bytes_are_not_trusted_on_resume(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    partial = PartialCheckpoint(tmp_path / "out", manifest)
    data = shard_bytes(source, manifest, "model.safetensors", 0)
    partial.write_unverified("model.safetensors", 0, 0, [data])  # all bytes in, but the process dies before commit
    partial.close()
    resumed = PartialCheckpoint(tmp_path / "out", manifest)
    assert ("model.safetensors", 0) in resumed.missing()


@pytest.mark.skipif(sys.platform != "linux", reason="fallocate(2)")
def test_a_download_that_cannot_fit_fails_before_its_first_byte(tmp_path: Path, manifest: Manifest) -> None:
    """The partial files are allocated whole when the download starts: past the space a process may write (here a
    file size limit, as a full disk would), the download is refused with the reason, not after hours of shards."""
    total = max(mf.size for mf in manifest.files)
    probe = f"""
import resource, signal, sys
from pathlib import Path
from shardcast import RelayError
from shardcast.manifest import parse_manifest
from shardcast.partial import PartialCheckpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, ({total // 2}, {total // 2}))
manifest = parse_manifest(Path(sys.argv[1]).read_bytes())
try:
    PartialCheckpoint(Path(sys.argv[2]), manifest)
except RelayError as exc:
    print(exc)
    sys.exit(3)
"""
    (tmp_path / "manifest.json").write_bytes(encode_manifest(manifest))
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "manifest.json"), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"cannot hold {total} bytes" in done.stdout and "File too large" in done.stdout
    fits = PartialCheckpoint(tmp_path / "fits", manifest)  # no limit: allocated, not sparse
    for mf in manifest.files:
        assert os.stat(fits.partial / mf.name).st_blocks * 512 >= mf.size
