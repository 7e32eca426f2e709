"""The version store of an origin or relay: checkpoint versions on disk, each verified before it is served.

`ShardStore` keeps versions under `root/v/<step>/` (`manifest.json` plus `files/<name>`). A version is
copied into `root/tmp/` first, every shard checked against the manifest while copying, fsynced, and renamed
into place, so `versions()` never lists a half-written one. Shards are verified on write only: after that
the store trusts its own disk and serves bytes without re-hashing them (clients verify every shard anyway).
One process owns a root; leftovers in `root/tmp/` from a crash are removed when the store is opened.

A relay mirrors a version as a `PartialCheckpoint` (`shardcast.partial`, the client's partial download); the file
I/O under both is `shardcast.fileio`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from shardcast import (
    FileHashMismatch,
    ManifestError,
    RelayError,
    ShardPending,
    UnknownShard,
    VersionExists,
    VersionNotFound,
    trace,
)
from shardcast.delta import DeltaPolicy, DeltaStats, encode_delta
from shardcast.fileio import MemoryBudget, fsync_path, page_cache_pressed, write_durably
from shardcast.manifest import (
    DELTA_FORMAT,
    DELTA_SUFFIX,
    FORMAT_VERSION,
    DeltaInfo,
    Manifest,
    ManifestFile,
    build_manifest,
    check_name,
    delta_name,
    encode_manifest,
    manifest_hash,
    parse_manifest,
)
from shardcast.partial import PARTIAL_MANIFEST_NAME, PartialCheckpoint, check_shard

SIGNATURE_NAME = ".shardcast-signature"

Signer = Callable[[Manifest], bytes]
RELAY_MEMORY_MIB = 1024  # a relay's default memory window (`ShardStore(memory_bytes=...)`, `prime-node relay`)


def _copy_verified(src: Path, dst: Path, mf: ManifestFile) -> None:
    """Copy shard by shard, refusing any shard, size or whole-file hash that differs from the manifest."""
    whole = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for shard in mf.shards:
            data = fin.read(shard.size)
            check_shard(mf.name, shard, data)
            whole.update(data)
            fout.write(data)
        if fin.read(1):
            raise FileHashMismatch(mf.name, f"{mf.size} bytes", f"more than {mf.size} bytes")
        fout.flush()
        os.fsync(fout.fileno())
    if whole.digest() != mf.sha256:
        raise FileHashMismatch(mf.name, mf.sha256.hex(), whole.hexdigest())


class ShardStore:
    """The versions an origin or relay serves, each verified against its manifest before it is served.

    Layout: `root/v/<step>/` holds the checkpoint's files plus the canonical manifest and the trainer's
    signature under dot-names (no manifest file can have one). A relay mirrors a version into
    `root/v/<step>.partial/` (a `PartialCheckpoint` that keeps the metadata), serving each shard as soon as
    it is verified; `finish_version` renames it into place. Listing and lookups run on the server's event
    loop; the copies, hashes and renames run in worker threads.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, memory_bytes: int = 0, hold: Callable[[int], bool] = page_cache_pressed
    ) -> None:
        """`memory_bytes`: how much of the versions being mirrored a relay may hold in memory, and `hold(size)` when
        (see `PartialCheckpoint`)."""
        self.root = Path(root)
        self.memory = MemoryBudget(memory_bytes, hold)
        self._versions = self.root / "v"
        self._tmp = self.root / "tmp"
        self._versions.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self._tmp, ignore_errors=True)  # half-copied or half-pruned versions of a crashed run
        self._tmp.mkdir()
        self._manifests: dict[int, Manifest] = {}
        self._incoming: dict[int, PartialCheckpoint] = {}

    # --- writing -------------------------------------------------------------------------------------

    def put_version(self, manifest: Manifest, source_dir: str | os.PathLike[str], signature: bytes = b"") -> None:
        """Copy `source_dir`'s files into the store as version `manifest.step`, with the trainer's signature.

        Requirements: every shard and file of the source matches the manifest (else `ShardHashMismatch` or
        `FileHashMismatch`, and nothing is stored); a step already stored has the same manifest (else
        `VersionExists`; the same manifest again is a no-op).
        """
        if self._stored(manifest):
            return
        tmp = Path(tempfile.mkdtemp(dir=self._tmp, prefix=f"{manifest.step}."))
        try:
            for mf in manifest.files:
                _copy_verified(Path(source_dir) / mf.name, tmp / mf.name, mf)
            self._install(tmp, manifest, signature)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def publish_dir(
        self,
        checkpoint_dir: str | os.PathLike[str],
        *,
        pool_id: int,
        step: int,
        shard_size: int,
        sign: Signer,
        manifest_format: int = FORMAT_VERSION,
        delta: DeltaPolicy | None = None,
    ) -> Manifest:
        """Copy a trusted checkpoint directory in, build its manifest (`manifest_format`) from the copy, sign it, and
        store it. With `delta` (format 3), the version also holds its delta against the newest step stored before it,
        when the policy finds it worth sending (`_add_deltas`).

        One read of the source (a kernel copy) and one hashing pass over the copy: the origin's path. The copy is
        fsynced while it is hashed (both only read it), so publishing waits for the longer of the two, not both.
        `sign(manifest)` returns the trainer's 65-byte signature. A step already stored with the same checkpoint
        files is returned as stored, whatever its delta; with other files it is `VersionExists`.
        """
        trace.event("publish_start", step=step)
        tmp = Path(tempfile.mkdtemp(dir=self._tmp, prefix=f"{step}."))
        try:
            names = []
            for entry in sorted(os.scandir(checkpoint_dir), key=lambda e: e.name):
                check_name(entry.name)
                if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                    raise ManifestError(f"{entry.name!r} in {checkpoint_dir} is not a regular file")
                if manifest_format >= DELTA_FORMAT and entry.name.endswith(DELTA_SUFFIX):
                    raise ManifestError(f"{entry.name!r}: names ending in {DELTA_SUFFIX} are the deltas'")
                shutil.copyfile(entry.path, tmp / entry.name)
                names.append(entry.name)
            trace.event("publish_copied", step=step)
            stored = self._versions / str(step)
            with ThreadPoolExecutor(1, thread_name_prefix="publish-fsync") as pool:
                synced = [pool.submit(fsync_path, tmp / name) for name in names]
                info = None
                if delta is not None and manifest_format >= DELTA_FORMAT and not stored.exists():
                    info = self._add_deltas(tmp, names, step, delta)
                manifest = build_manifest(
                    tmp, pool_id=pool_id, step=step, shard_size=shard_size, format_version=manifest_format, delta=info
                )
                for done in synced:
                    done.result()
            trace.event("publish_hashed", step=step)
            if stored.exists():
                shutil.rmtree(tmp)
                held = self.manifest(step)
                if held.checkpoint_files != manifest.checkpoint_files:
                    raise VersionExists(step)
                return held
            self._install(tmp, manifest, sign(manifest))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        trace.event("published", step=step)
        return manifest

    def _add_deltas(self, tmp: Path, names: list[str], step: int, policy: DeltaPolicy) -> DeltaInfo | None:
        """Write into `tmp` the delta of each file against the same file of the newest step stored before `step`, and
        return the section naming them; None (and no delta file left) when there is no base, the checkpoint is
        under `policy.min_bytes`, or the deltas together are over `policy.max_ratio` of it. A file that changed size,
        is new, or whose delta is not smaller than itself is left out: a receiver fetches it whole."""
        sizes = {name: (tmp / name).stat().st_size for name in names}
        older = [s for s in self.versions() if s < step]
        if not older or sum(sizes.values()) < policy.min_bytes:
            return None
        base = self.manifest(older[-1])
        base_dir = self._versions / str(base.step)
        base_sizes = {f.name: f.size for f in base.checkpoint_files}
        pairs = [name for name in names if base_sizes.get(name) == sizes[name]]

        def encode(name: str) -> DeltaStats | None:
            return encode_delta(base_dir / name, tmp / name, tmp / delta_name(name), level=policy.level)

        with ThreadPoolExecutor(min(len(pairs), os.cpu_count() or 1) or 1, thread_name_prefix="delta") as pool:
            made = dict(zip(pairs, pool.map(encode, pairs), strict=True))
        kept = {n: s for n, s in made.items() if s is not None and s.bytes < s.size}
        for name in set(made) - set(kept):
            (tmp / delta_name(name)).unlink(missing_ok=True)
        total = sum(s.bytes for s in kept.values())
        if not kept or total > policy.max_ratio * sum(sizes.values()):
            for name in kept:
                (tmp / delta_name(name)).unlink()
            trace.event("delta_skipped", step=step, base=base.step, bytes=total)
            return None
        trace.event("delta_made", step=step, base=base.step, bytes=total)
        return DeltaInfo(base.step, manifest_hash(base), tuple(sorted(kept)))

    def _stored(self, manifest: Manifest) -> bool:
        """True if this exact version is already stored; `VersionExists` if the step holds another manifest."""
        if not (self._versions / str(manifest.step)).exists():
            return False
        if self.manifest(manifest.step) != manifest:
            raise VersionExists(manifest.step)
        return True

    def _install(self, tmp: Path, manifest: Manifest, signature: bytes) -> None:
        write_durably(tmp / PARTIAL_MANIFEST_NAME, encode_manifest(manifest))
        write_durably(tmp / SIGNATURE_NAME, signature)
        fsync_path(tmp)
        os.rename(tmp, self._versions / str(manifest.step))
        fsync_path(self._versions)
        self._manifests[manifest.step] = manifest

    def begin_version(self, manifest: Manifest, signature: bytes) -> PartialCheckpoint:
        """Start (or resume) mirroring a version; its shards are served as soon as they are written.

        Requirements: the step is not stored yet (`VersionExists` otherwise, whatever its manifest).
        """
        if (self._versions / str(manifest.step)).exists():
            raise VersionExists(manifest.step)
        current = self._incoming.get(manifest.step)
        if current is not None:
            if current.manifest != manifest:
                raise VersionExists(manifest.step)
            if not current.closed:
                return current
        partial = PartialCheckpoint(
            self._versions / str(manifest.step),
            manifest,
            metadata={SIGNATURE_NAME: signature},
            writeback=False,
            memory=self.memory if self.memory.limit else None,
        )
        self._incoming[manifest.step] = partial
        return partial

    def incoming_version(self, step: int) -> PartialCheckpoint | None:
        return self._incoming.get(step)

    def finish_version(self, partial: PartialCheckpoint) -> None:
        """Rename a mirrored version into place once every shard is verified (fsyncs: run it in a thread)."""
        partial.finish(verify_files=False)
        fsync_path(self._versions)
        self._manifests[partial.manifest.step] = partial.manifest
        self._incoming.pop(partial.manifest.step, None)

    def abandon_version(self, step: int) -> None:
        """Forget a version being mirrored and delete its partial directory."""
        partial = self._incoming.pop(step, None)
        if partial is not None:
            partial.close()
        shutil.rmtree(self._versions / f"{step}.partial", ignore_errors=True)

    # --- reading -------------------------------------------------------------------------------------

    def versions(self) -> list[int]:
        """Complete steps, ascending."""
        return sorted(int(p.name) for p in self._versions.iterdir() if _is_step(p.name))

    def version_dir(self, step: int) -> Path:
        """The folder of a complete version (`VersionNotFound` if the step is not complete here): its files, verified
        when they were stored, to be read as a delta's base."""
        folder = self._versions / str(step)
        if not folder.is_dir():
            raise VersionNotFound(step)
        return folder

    def incoming(self) -> list[int]:
        """Steps being mirrored, ascending."""
        return sorted(self._incoming)

    def manifest(self, step: int) -> Manifest:
        partial = self._incoming.get(step)
        if partial is not None:
            return partial.manifest
        if step not in self._manifests:
            try:
                data = (self._versions / str(step) / PARTIAL_MANIFEST_NAME).read_bytes()
            except FileNotFoundError:
                raise VersionNotFound(step) from None
            # our own disk, written by put_version: no hostile-input limits
            self._manifests[step] = parse_manifest(data, max_bytes=len(data), max_files=2**31, max_total_bytes=2**63)
        return self._manifests[step]

    def manifest_bytes(self, step: int) -> bytes:
        """The canonical manifest bytes, as served at `/v/{step}/manifest.json`."""
        return encode_manifest(self.manifest(step))

    def signature(self, step: int) -> bytes:
        """The trainer's signature of the version's manifest, as stored with it (empty if it had none)."""
        partial = self._incoming.get(step)
        if partial is not None:
            return partial.metadata[SIGNATURE_NAME]
        try:
            return (self._versions / str(step) / SIGNATURE_NAME).read_bytes()
        except FileNotFoundError:
            raise VersionNotFound(step) from None

    def open_shard(self, step: int, file: str, index: int) -> tuple[BinaryIO, int, int]:
        """(an open file, offset, size) holding a stored shard's verified bytes, for a server to send; the caller
        closes the file.

        A shard of a version being mirrored raises `ShardPending` until it is verified, and is read from memory
        or from the partial folder, wherever it is (`PartialCheckpoint.open_verified`). The version may be renamed
        into place meanwhile; the final path is tried then.
        """
        mf = self.manifest(step).file(file)
        if mf is None or not 0 <= index < len(mf.shards):
            raise UnknownShard(file, index)
        shard = mf.shards[index]
        partial = self._incoming.get(step)
        if partial is not None:
            if not partial.has(file, index):
                raise ShardPending(step, file, index)
            with contextlib.suppress(FileNotFoundError):  # renamed into place since `has`: read the final path
                opened = partial.open_verified(file, index)
                if opened is None:  # its memory was let go since `has` (the version was abandoned)
                    raise ShardPending(step, file, index)
                return opened, shard.offset, shard.size
        return open(self._versions / str(step) / file, "rb"), shard.offset, shard.size

    def read_shard(self, step: int, file: str, index: int) -> bytes:
        """A shard's bytes, trusted without re-hashing (they were verified when they were written)."""
        opened, offset, size = self.open_shard(step, file, index)
        with opened:
            data = os.pread(opened.fileno(), size, offset)
        if len(data) != size:
            raise RelayError(f"shard {file}[{index}] of step {step}: short read ({len(data)} of {size} bytes)")
        return data

    # --- pruning -------------------------------------------------------------------------------------

    def prune(self, keep_last: int) -> list[int]:
        """Delete all but the newest `keep_last` versions, complete or being mirrored; returns the steps deleted."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        partials = {int(p.name.split(".")[0]) for p in self._versions.glob("*.partial") if _is_step(p.name[:-8])}
        everything = sorted(set(self.versions()) | partials | set(self._incoming))
        old = everything[:-keep_last]
        for step in old:
            if step in partials or step in self._incoming:
                self.abandon_version(step)
            if (self._versions / str(step)).exists():
                # rename first, so a crash mid-delete never leaves a half version listed (readers keep open files)
                trash = Path(tempfile.mkdtemp(dir=self._tmp, prefix=f"pruned.{step}.")) / "v"
                os.rename(self._versions / str(step), trash)
                shutil.rmtree(trash.parent)
            self._manifests.pop(step, None)
        return old


def _is_step(name: str) -> bool:
    return name.isdigit() and name == str(int(name))
