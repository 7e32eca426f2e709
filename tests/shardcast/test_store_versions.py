"""ShardStore's version life cycle: an origin publishing a directory, a relay mirroring a version shard by shard."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from protocol.signing import SigningDomain
from shardcast import ManifestError, RelayError, ShardPending, VersionExists, VersionNotFound
from shardcast.fileio import page_cache_pressed
from shardcast.manifest import Manifest, build_manifest, encode_manifest
from shardcast.partial import JOURNAL_NAME, PARTIAL_MANIFEST_NAME, PartialCheckpoint
from shardcast.store import SIGNATURE_NAME, ShardStore
from shardcast.trust import TrustPolicy, sign_manifest

KIB = 1024
SHARD = 64 * KIB
POOL = 1
TRAINER: LocalAccount = Account.from_key("0x" + "11" * 32)
DOMAIN = SigningDomain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")


def make_checkpoint(d: Path, seed: int) -> Path:
    rng = random.Random(seed)
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(rng.randbytes(5 * SHARD + 321))
    (d / "config.json").write_bytes(b'{"vocab_size": 256}')
    (d / "empty.txt").write_bytes(b"")
    return d


def sign(manifest: Manifest) -> bytes:
    return sign_manifest(manifest, TRAINER, DOMAIN)


def publish(store: ShardStore, source: Path, step: int) -> Manifest:
    return store.publish_dir(source, pool_id=POOL, step=step, shard_size=SHARD, sign=sign)


def all_shards(m: Manifest) -> list[tuple[str, int]]:
    return [(f.name, s.index) for f in m.files for s in f.shards]


def shard_bytes(source: Path, m: Manifest, file: str, index: int) -> bytes:
    s = m.file(file).shards[index]  # type: ignore[union-attr]
    return (source / file).read_bytes()[s.offset : s.offset + s.size]


def names(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "source", seed=1)


@pytest.fixture
def manifest(source: Path) -> Manifest:
    return build_manifest(source, pool_id=POOL, step=10, shard_size=SHARD)


@pytest.fixture
def store(tmp_path: Path) -> ShardStore:
    return ShardStore(tmp_path / "store")


# ---- publish_dir (the origin) ----


def test_publish_dir_stores_the_version_with_the_trainers_signature(
    tmp_path: Path, store: ShardStore, source: Path, manifest: Manifest
) -> None:
    signed: list[Manifest] = []

    def recording_sign(m: Manifest) -> bytes:
        signed.append(m)
        return sign(m)

    published = store.publish_dir(source, pool_id=POOL, step=10, shard_size=SHARD, sign=recording_sign)
    assert published == manifest and signed == [manifest]
    assert store.versions() == [10] and store.incoming() == []
    assert store.manifest_bytes(10) == encode_manifest(manifest)
    TrustPolicy(DOMAIN, TRAINER.address, pool_id=POOL).check(store.manifest(10), store.signature(10), step=10)
    version = tmp_path / "store" / "v" / "10"
    assert names(version) == names(source) | {PARTIAL_MANIFEST_NAME, SIGNATURE_NAME}
    assert (version / SIGNATURE_NAME).read_bytes() == sign(manifest)
    for file, index in all_shards(manifest):
        assert store.read_shard(10, file, index) == shard_bytes(source, manifest, file, index)
    assert list((tmp_path / "store" / "tmp").iterdir()) == []


def test_publish_dir_again_with_the_same_bytes_is_a_no_op(
    tmp_path: Path, store: ShardStore, source: Path, manifest: Manifest
) -> None:
    publish(store, source, 10)
    calls: list[Manifest] = []

    def recording_sign(m: Manifest) -> bytes:
        calls.append(m)
        return b"\x00" * 65

    again = store.publish_dir(source, pool_id=POOL, step=10, shard_size=SHARD, sign=recording_sign)
    assert again == manifest and calls == []  # not signed again, the stored signature kept
    assert store.signature(10) == sign(manifest) and store.versions() == [10]
    assert list((tmp_path / "store" / "tmp").iterdir()) == []


def test_publish_dir_refuses_other_bytes_at_a_stored_step(tmp_path: Path, store: ShardStore, source: Path) -> None:
    publish(store, source, 10)
    before = store.read_shard(10, "model.safetensors", 0)
    other = make_checkpoint(tmp_path / "other", seed=2)
    with pytest.raises(VersionExists) as e:
        publish(store, other, 10)
    assert e.value.step == 10
    assert store.read_shard(10, "model.safetensors", 0) == before
    assert store.signature(10) == sign(store.manifest(10))
    assert list((tmp_path / "store" / "tmp").iterdir()) == []


@pytest.mark.parametrize("intruder", ["directory", "symlink", "dot-file"])
def test_publish_dir_refuses_anything_but_regular_files(
    tmp_path: Path, store: ShardStore, source: Path, intruder: str
) -> None:
    if intruder == "directory":
        (source / "nested").mkdir()
    elif intruder == "symlink":
        secret = tmp_path / "secret"
        secret.write_bytes(b"not part of the checkpoint")
        os.symlink(secret, source / "link.bin")
    else:
        (source / ".hidden").write_bytes(b"x")
    with pytest.raises(ManifestError):
        publish(store, source, 10)
    assert store.versions() == [] and names(tmp_path / "store" / "v") == set()
    assert list((tmp_path / "store" / "tmp").iterdir()) == []


# ---- begin_version / finish_version / abandon_version (a relay mirroring) ----


def test_an_incoming_version_raises_shard_pending_until_each_shard_is_written(
    tmp_path: Path, store: ShardStore, source: Path, manifest: Manifest
) -> None:
    partial = store.begin_version(manifest, sign(manifest))
    assert store.incoming() == [10] and store.versions() == [] and store.incoming_version(10) is partial
    assert store.manifest(10) == manifest and store.signature(10) == sign(manifest)
    with pytest.raises(ShardPending) as e:
        store.open_shard(10, "model.safetensors", 2)
    assert (e.value.step, e.value.file, e.value.index) == (10, "model.safetensors", 2)
    assert not partial.has("model.safetensors", 2)

    data = shard_bytes(source, manifest, "model.safetensors", 2)
    assert partial.write_shard("model.safetensors", 2, data)
    assert partial.has("model.safetensors", 2)
    opened, offset, size = store.open_shard(10, "model.safetensors", 2)
    with opened:  # served from the partial folder (no memory budget)
        assert opened.name == str(tmp_path / "store" / "v" / "10.partial" / "model.safetensors")
    assert (offset, size) == (2 * SHARD, SHARD)
    assert store.read_shard(10, "model.safetensors", 2) == data
    with pytest.raises(ShardPending):
        store.read_shard(10, "model.safetensors", 3)


def test_begin_version_returns_the_open_partial_and_refuses_another_manifest_or_a_stored_step(
    store: ShardStore, source: Path, manifest: Manifest
) -> None:
    partial = store.begin_version(manifest, sign(manifest))
    assert store.begin_version(manifest, sign(manifest)) is partial
    other = build_manifest(source, pool_id=POOL + 1, step=10, shard_size=SHARD)
    with pytest.raises(VersionExists):
        store.begin_version(other, sign(other))
    assert store.incoming_version(10) is partial

    published = publish(store, source, 11)
    with pytest.raises(VersionExists):
        store.begin_version(published, sign(published))  # even with the very same manifest
    assert store.incoming() == [10]


def test_finish_version_lists_it_and_keeps_the_manifest_and_signature(
    tmp_path: Path, store: ShardStore, source: Path, manifest: Manifest
) -> None:
    partial = store.begin_version(manifest, sign(manifest))
    for file, index in reversed(all_shards(manifest)):
        partial.write_shard(file, index, shard_bytes(source, manifest, file, index))
    store.finish_version(partial)

    assert store.versions() == [10] and store.incoming() == [] and store.incoming_version(10) is None
    version = tmp_path / "store" / "v" / "10"
    assert names(tmp_path / "store" / "v") == {"10"}
    assert names(version) == names(source) | {PARTIAL_MANIFEST_NAME, SIGNATURE_NAME}
    assert JOURNAL_NAME not in names(version)
    assert (version / PARTIAL_MANIFEST_NAME).read_bytes() == encode_manifest(manifest)
    assert (version / SIGNATURE_NAME).read_bytes() == sign(manifest)
    opened, _, _ = store.open_shard(10, "config.json", 0)
    with opened:
        assert opened.name == str(version / "config.json")
    for file, index in all_shards(manifest):
        assert store.read_shard(10, file, index) == shard_bytes(source, manifest, file, index)
    with pytest.raises(VersionExists):
        store.begin_version(manifest, sign(manifest))


def test_abandon_version_closes_it_and_removes_the_partial_dir(
    tmp_path: Path, store: ShardStore, source: Path, manifest: Manifest
) -> None:
    partial = store.begin_version(manifest, sign(manifest))
    partial.write_shard("config.json", 0, (source / "config.json").read_bytes())
    assert (tmp_path / "store" / "v" / "10.partial").is_dir()
    store.abandon_version(10)
    assert store.incoming() == [] and store.versions() == []
    assert not (tmp_path / "store" / "v" / "10.partial").exists()
    assert partial.closed
    with pytest.raises(RelayError, match="finished"):
        partial.write_shard("model.safetensors", 0, shard_bytes(source, manifest, "model.safetensors", 0))
    with pytest.raises(VersionNotFound):
        store.manifest(10)
    with pytest.raises(VersionNotFound):
        store.signature(10)


def test_a_closed_incoming_version_is_reopened_by_begin_version_and_resumes_its_shards(
    store: ShardStore, source: Path, manifest: Manifest
) -> None:
    shards = all_shards(manifest)
    first = store.begin_version(manifest, sign(manifest))
    for file, index in shards[:3]:
        first.write_shard(file, index, shard_bytes(source, manifest, file, index))
    first.close()
    assert first.closed and store.incoming() == [10]

    second = store.begin_version(manifest, sign(manifest))
    assert second is not first and not second.closed and store.incoming_version(10) is second
    assert all(second.has(file, index) for file, index in shards[:3])
    assert second.missing() == shards[3:]
    assert store.read_shard(10, *shards[0]) == shard_bytes(source, manifest, *shards[0])
    for file, index in second.missing():
        second.write_shard(file, index, shard_bytes(source, manifest, file, index))
    store.finish_version(second)
    assert store.versions() == [10]


def test_begin_version_after_a_restart_resumes_the_partial_dir(
    tmp_path: Path, source: Path, manifest: Manifest
) -> None:
    shards = all_shards(manifest)
    before = ShardStore(tmp_path / "store").begin_version(manifest, sign(manifest))
    for file, index in shards[:2]:
        before.write_shard(file, index, shard_bytes(source, manifest, file, index))
    del before  # the relay dies

    store = ShardStore(tmp_path / "store")
    assert store.versions() == [] and store.incoming() == []  # the leftover is neither served nor listed
    resumed = store.begin_version(manifest, sign(manifest))
    assert resumed.missing() == shards[2:]


# ---- a relay's memory window ----

ALWAYS = lambda size: True  # noqa: E731 (hold every shard the budget allows, whatever the page cache's state)


def on_disk(tmp_path: Path, manifest: Manifest, file: str, index: int) -> bytes:
    """The bytes of a shard in the partial folder of step 10, as the disk has them now."""
    s = manifest.file(file).shards[index]  # type: ignore[union-attr]
    return (tmp_path / "store" / "v" / "10.partial" / file).read_bytes()[s.offset : s.offset + s.size]


def test_a_relay_serves_shards_from_memory_and_writes_them_to_disk_only_at_finish(
    tmp_path: Path, source: Path, manifest: Manifest
) -> None:
    """Issue 23: on a machine whose page cache is written slowly (or a disk its clients share), a relay's own
    writes paced its receiving and serving. Shards within the budget are held in memory, served from there once
    verified, and reach the disk when the version is finished; the rest go to disk as before."""
    store = ShardStore(tmp_path / "store", memory_bytes=2 * SHARD, hold=ALWAYS)
    partial = store.begin_version(manifest, sign(manifest))
    shards = all_shards(manifest)  # config.json, then 6 of model.safetensors (empty.txt has none)
    for file, index in shards:
        partial.write_shard(file, index, shard_bytes(source, manifest, file, index))
    # config.json (19 bytes), model.safetensors[0] (64 KiB) and [5] (its 321-byte tail) fit; [1] to [4] do not
    in_memory, to_disk = [shards[0], shards[1], shards[6]], shards[2:6]
    assert partial.held_bytes == store.memory.used == 19 + SHARD + 321
    for file, index in shards:
        assert store.read_shard(10, file, index) == shard_bytes(source, manifest, file, index)  # served, verified
    for file, index in in_memory:
        assert set(on_disk(tmp_path, manifest, file, index)) == {0}  # never written: served from memory
    for file, index in to_disk:
        assert on_disk(tmp_path, manifest, file, index) == shard_bytes(source, manifest, file, index)
    journal = (tmp_path / "store" / "v" / "10.partial" / JOURNAL_NAME).read_text()
    assert journal == "".join(f"{index}\t{file}\n" for file, index in to_disk)  # memory is not durable: not in it

    opened, offset, size = store.open_shard(10, *in_memory[1])  # a reader in flight across the finish
    store.finish_version(partial)
    with opened:
        assert os.pread(opened.fileno(), size, offset) == shard_bytes(source, manifest, *in_memory[1])
    assert store.memory.used == 0 and store.versions() == [10]
    for name in names(source):
        assert (tmp_path / "store" / "v" / "10" / name).read_bytes() == (source / name).read_bytes()


def test_shards_held_in_memory_are_fetched_again_after_a_crash_and_freed_when_abandoned(
    tmp_path: Path, source: Path, manifest: Manifest
) -> None:
    shards = all_shards(manifest)
    relay = ShardStore(tmp_path / "store", memory_bytes=2 * SHARD, hold=ALWAYS)
    partial = relay.begin_version(manifest, sign(manifest))
    for file, index in shards[:4]:
        partial.write_shard(file, index, shard_bytes(source, manifest, file, index))
    assert partial.held_bytes == 19 + SHARD  # config.json and model.safetensors[0]; [1] and [2] went to disk

    # the relay was killed: its memory is gone
    restarted = ShardStore(tmp_path / "store", memory_bytes=2 * SHARD, hold=ALWAYS)
    assert restarted.begin_version(manifest, sign(manifest)).missing() == shards[:2] + shards[4:]

    relay.abandon_version(10)
    assert relay.memory.used == 0 and partial.closed and not partial.has(*shards[0])


def test_write_behind_frees_memory_for_later_shards_while_a_version_arrives(
    tmp_path: Path, source: Path, manifest: Manifest
) -> None:
    shards = all_shards(manifest)[1:]  # model.safetensors only: 6 shards
    store = ShardStore(tmp_path / "store", memory_bytes=2 * SHARD, hold=ALWAYS)
    partial = store.begin_version(manifest, sign(manifest))
    for file, index in shards[:2]:
        partial.write_shard(file, index, shard_bytes(source, manifest, file, index))
    assert partial.write_behind() == 2 * SHARD and store.memory.used == 0
    for file, index in shards[:2]:
        assert on_disk(tmp_path, manifest, file, index) == shard_bytes(source, manifest, file, index)
    journal = (tmp_path / "store" / "v" / "10.partial" / JOURNAL_NAME).read_text()
    assert journal == "".join(f"{index}\t{file}\n" for file, index in shards[:2])
    partial.write_shard(*shards[2], shard_bytes(source, manifest, *shards[2]))  # memory again
    assert partial.held_bytes == SHARD and set(on_disk(tmp_path, manifest, *shards[2])) == {0}
    assert store.read_shard(10, *shards[0]) == shard_bytes(source, manifest, *shards[0])  # now from disk


def test_a_relay_holds_nothing_in_memory_while_its_page_cache_takes_writes_freely(
    tmp_path: Path, source: Path, manifest: Manifest
) -> None:
    asked: list[int] = []
    store = ShardStore(tmp_path / "store", memory_bytes=2 * SHARD, hold=lambda size: asked.append(size) is not None)
    partial = store.begin_version(manifest, sign(manifest))
    for file, index in all_shards(manifest):
        partial.write_shard(file, index, shard_bytes(source, manifest, file, index))
        assert on_disk(tmp_path, manifest, file, index) == shard_bytes(source, manifest, file, index)
    assert partial.held_bytes == 0 and asked == [19, *[SHARD] * 5, 321]  # asked once per shard, at its first write


def write_proc(root: Path, dirty_kib: int, writeback_kib: int, background_bytes: int, ratio: int = 10) -> Path:
    """A /proc/meminfo and /proc/sys/vm as `page_cache_pressed` reads them, under `root`."""
    (root / "vm").mkdir(parents=True)
    (root / "meminfo").write_text(
        "MemTotal:        8000000 kB\nMemFree:          500000 kB\nActive(file):     300000 kB\n"
        f"Inactive(file):   200000 kB\nDirty:            {dirty_kib} kB\nWriteback:        {writeback_kib} kB\n"
    )
    (root / "vm" / "dirty_background_bytes").write_text(f"{background_bytes}\n")
    (root / "vm" / "dirty_background_ratio").write_text(f"{ratio}\n")
    return root


@pytest.mark.parametrize(
    ("dirty_kib", "writeback_kib", "background", "size", "pressed"),
    [
        (60 * 1024, 0, 100 << 20, 16 << 20, False),  # 76 MiB of 100: the page cache takes it at memory speed
        (60 * 1024, 0, 100 << 20, 50 << 20, True),  # 110 MiB: past the background threshold
        (40 * 1024, 40 * 1024, 100 << 20, 32 << 20, True),  # pages being written back count too
        (50 * 1024, 0, 0, 16 << 20, False),  # ratio 10% of 1,000,000 kB free and file pages: 97.7 MiB
        (90 * 1024, 0, 0, 16 << 20, True),
    ],
)
def test_the_page_cache_is_pressed_past_the_kernels_background_threshold(
    tmp_path: Path, dirty_kib: int, writeback_kib: int, background: int, size: int, pressed: bool
) -> None:
    root = write_proc(tmp_path, dirty_kib, writeback_kib, background)
    assert page_cache_pressed(size, root / "meminfo", root / "vm") is pressed


def test_the_page_cache_counts_as_pressed_where_its_figures_cannot_be_read(tmp_path: Path) -> None:
    assert page_cache_pressed(1, tmp_path / "no-meminfo", tmp_path / "no-vm")
    (tmp_path / "meminfo").write_text("MemFree: lots\n")
    assert page_cache_pressed(1, tmp_path / "meminfo", tmp_path)


# ---- prune and reopening ----


def test_prune_counts_incoming_versions_and_leftover_partial_dirs(tmp_path: Path, source: Path) -> None:
    root = tmp_path / "store"
    crashed = ShardStore(root)
    leftover = build_manifest(source, pool_id=POOL, step=3, shard_size=SHARD)
    crashed.begin_version(leftover, sign(leftover)).write_shard("config.json", 0, (source / "config.json").read_bytes())
    del crashed  # the relay dies, leaving v/3.partial behind

    store = ShardStore(root)
    publish(store, source, 1)
    publish(store, make_checkpoint(tmp_path / "src4", seed=4), 4)
    incoming = build_manifest(source, pool_id=POOL, step=6, shard_size=SHARD)
    partial = store.begin_version(incoming, sign(incoming))
    assert names(root / "v") == {"1", "3.partial", "4", "6.partial"}

    assert store.prune(keep_last=2) == [1, 3]
    assert store.versions() == [4] and store.incoming() == [6]
    assert names(root / "v") == {"4", "6.partial"}
    with pytest.raises(VersionNotFound):
        store.manifest(1)

    assert store.prune(keep_last=2) == []
    assert store.prune(keep_last=1) == [4]
    assert store.versions() == [] and store.incoming() == [6] and not partial.closed
    assert names(root / "v") == {"6.partial"}
    assert list((root / "tmp").iterdir()) == []


def test_prune_abandons_an_incoming_version_older_than_the_kept_ones(
    tmp_path: Path, store: ShardStore, source: Path
) -> None:
    old = build_manifest(source, pool_id=POOL, step=2, shard_size=SHARD)
    partial = store.begin_version(old, sign(old))
    publish(store, source, 5)
    assert store.prune(keep_last=1) == [2]
    assert partial.closed and store.incoming() == [] and store.versions() == [5]
    assert not (tmp_path / "store" / "v" / "2.partial").exists()


def test_a_reopened_store_lists_and_serves_its_complete_versions(
    tmp_path: Path, store: ShardStore, source: Path
) -> None:
    published = publish(store, source, 7)
    mirrored = build_manifest(source, pool_id=POOL, step=9, shard_size=SHARD)
    partial = store.begin_version(mirrored, sign(mirrored))
    for file, index in all_shards(mirrored):
        partial.write_shard(file, index, shard_bytes(source, mirrored, file, index))
    store.finish_version(partial)
    pending = build_manifest(source, pool_id=POOL, step=12, shard_size=SHARD)
    store.begin_version(pending, sign(pending))

    reopened = ShardStore(tmp_path / "store")
    assert reopened.versions() == [7, 9] and reopened.incoming() == []
    for step, m in [(7, published), (9, mirrored)]:
        assert reopened.manifest(step) == m
        assert reopened.manifest_bytes(step) == encode_manifest(m)
        assert reopened.signature(step) == sign(m)
        for file, index in all_shards(m):
            assert reopened.read_shard(step, file, index) == shard_bytes(source, m, file, index)
    with pytest.raises(VersionNotFound):
        reopened.manifest(12)


def test_partial_checkpoint_keeps_metadata_only_when_asked(tmp_path: Path, source: Path, manifest: Manifest) -> None:
    with_meta = PartialCheckpoint(tmp_path / "kept", manifest, metadata={".note": b"hello"})
    plain = PartialCheckpoint(tmp_path / "plain", manifest)
    for pc in (with_meta, plain):
        for file, index in all_shards(manifest):
            pc.write_shard(file, index, shard_bytes(source, manifest, file, index))
    assert names(with_meta.finish()) == names(source) | {".note", PARTIAL_MANIFEST_NAME}
    assert (tmp_path / "kept" / ".note").read_bytes() == b"hello"
    assert names(plain.finish()) == names(source)
    for bad in ("plain", JOURNAL_NAME, PARTIAL_MANIFEST_NAME, ".a/b"):
        with pytest.raises(ValueError):
            PartialCheckpoint(tmp_path / "other", manifest, metadata={bad: b""})
