"""Checkpoint bytes on disk: the version store of an origin or relay, and the client's partial download.

`ShardStore` keeps versions under `root/v/<step>/` (`manifest.json` plus `files/<name>`). A version is
copied into `root/tmp/` first, every shard checked against the manifest while copying, fsynced, and renamed
into place, so `versions()` never lists a half-written one. Shards are verified on write only: after that
the store trusts its own disk and serves bytes without re-hashing them (clients verify every shard anyway).
One process owns a root; leftovers in `root/tmp/` from a crash are removed when the store is opened.

`PartialCheckpoint` assembles one version on a client from verified shards in any order, in
`<target>.partial/`, with a journal of the shards written so a restarted process resumes; `finish()`
checks whole files and renames the directory to `<target>`, so the final path never holds a partial
checkpoint. The journal and a copy of the manifest live inside the partial directory under dot-names,
which no manifest file can have; they are removed just before the rename.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import mmap
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, TextIO

from shardcast import (
    FileHashMismatch,
    IncompleteCheckpoint,
    ManifestError,
    RelayError,
    ShardHashMismatch,
    ShardPending,
    TargetExists,
    UnknownShard,
    VersionExists,
    VersionNotFound,
    trace,
)
from shardcast.manifest import (
    FORMAT_VERSION,
    Manifest,
    ManifestFile,
    ShardInfo,
    build_manifest,
    check_name,
    encode_manifest,
    parse_manifest,
)

JOURNAL_NAME = ".shardcast-journal"  # "<index>\t<file>\n" per shard written; names hold no tab or newline
PARTIAL_MANIFEST_NAME = ".shardcast-manifest.json"
SIGNATURE_NAME = ".shardcast-signature"

Signer = Callable[[Manifest], bytes]
RELAY_MEMORY_MIB = 1024  # a relay's default memory window (`ShardStore(memory_bytes=...)`, `prime-node relay`)


def _load_sync_file_range() -> Callable[[int, int, int], None] | None:
    """Linux's sync_file_range(2) through libc, or None where it is missing (it has no `os` binding)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    write = 2  # SYNC_FILE_RANGE_WRITE: start writeback of the range's dirty pages, do not wait

    def start(fd: int, offset: int, size: int) -> None:
        function(fd, offset, size, write)  # advisory: an error only means the final fsync does more work

    return start


# Writeback started as each piece lands overlaps the disk writes with the download, so the fsync before the
# rename finds almost nothing left: without it, several clients fsyncing 512 MiB each at the end wait seconds.
_start_writeback = _load_sync_file_range() if sys.platform == "linux" else None


def start_writeback(fd: int, offset: int, size: int) -> None:
    """Start writing a just-written range to disk without waiting (nothing where sync_file_range is missing)."""
    if _start_writeback is not None:
        _start_writeback(fd, offset, size)


def _load_fallocate() -> Callable[[int, int], int] | None:
    """Linux's fallocate(2) through libc (mode 0), answering 0 or an errno, or None where it is missing.

    Not `os.posix_fallocate`: where the file system cannot allocate, glibc emulates it by writing zeros over the
    whole length, a second write of every byte of a checkpoint."""
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]

    def allocate(fd: int, size: int) -> int:
        return 0 if function(fd, 0, 0, size) == 0 else ctypes.get_errno()

    return allocate


_fallocate = _load_fallocate() if sys.platform == "linux" else None


def reserve_space(path: Path, fd: int, size: int) -> None:
    """Allocate `size` bytes of disk for a file about to be written in pieces: a download that cannot fit fails
    before its first byte (`RelayError`), not at some shard halfway, and the file system writes into extents it has
    allocated once instead of reserving blocks page by page (about 5% of a receiving process's time here). Where
    it cannot allocate, the file stays sparse."""
    if _fallocate is None or size == 0:
        return
    error = _fallocate(fd, size)
    if error in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        raise RelayError(f"cannot hold {size} bytes at {path}: {os.strerror(error)}")


def _fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _pread_exact(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), size, offset)
    if len(data) != size:
        raise RelayError(f"{path}: short read at offset {offset} ({len(data)} of {size} bytes)")
    return data


@contextlib.contextmanager
def _range_copier(source: int, path: Path) -> Iterator[Callable[[int, int], None]]:
    """A function copying (offset, size) of the open file `source` to the same offset of the file at `path`, for as
    long as the context lasts: the source is mapped once and the destination opened once, however many ranges."""
    piece = 8 * 1024 * 1024
    fd = os.open(path, os.O_WRONLY)
    try:
        with mmap.mmap(source, 0, prot=mmap.PROT_READ) as mapped, memoryview(mapped) as view:

            def copy(offset: int, size: int) -> None:
                done = 0
                while done < size:
                    n = min(piece, size - done)
                    at = offset + done
                    done += os.pwrite(fd, view[at : at + n], at)

            yield copy
    finally:
        os.close(fd)


def _check_shard(file: str, shard: ShardInfo, data: bytes) -> None:
    actual = shard.check(data)
    if actual is not None:
        raise ShardHashMismatch(file, shard.index, shard.digest.hex(), actual.hex())


def _copy_verified(src: Path, dst: Path, mf: ManifestFile) -> None:
    """Copy shard by shard, refusing any shard, size or whole-file hash that differs from the manifest."""
    whole = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for shard in mf.shards:
            data = fin.read(shard.size)
            _check_shard(mf.name, shard, data)
            whole.update(data)
            fout.write(data)
        if fin.read(1):
            raise FileHashMismatch(mf.name, f"{mf.size} bytes", f"more than {mf.size} bytes")
        fout.flush()
        os.fsync(fout.fileno())
    if whole.digest() != mf.sha256:
        raise FileHashMismatch(mf.name, mf.sha256.hex(), whole.hexdigest())


MEMINFO = Path("/proc/meminfo")
VM = Path("/proc/sys/vm")


def page_cache_pressed(size: int, meminfo: Path = MEMINFO, vm: Path = VM) -> bool:
    """Whether writing `size` more bytes now would take this machine's dirty page cache past the kernel's
    background threshold, where it starts writing back and, soon after, makes writers wait for the disk (on a
    machine with little memory or a slow disk, that is every few hundred megabytes). Below it, a write lands in the
    page cache at memory speed and costs less CPU than holding the bytes in a memfd: 0.52 against 0.82 CPU-s per
    512 MiB for a relay here (benchmarks/shardcast.py). True where the figures cannot be read."""
    try:
        fields = {}
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0]) * 1024
        background = int((vm / "dirty_background_bytes").read_text())
        if background == 0:  # set as a share of the memory the page cache may use instead
            dirtyable = fields["MemFree"] + fields["Active(file)"] + fields["Inactive(file)"]
            background = dirtyable * int((vm / "dirty_background_ratio").read_text()) // 100
        return fields["Dirty"] + fields["Writeback"] + size > background
    except (OSError, KeyError, ValueError, IndexError):
        return True


class MemoryBudget:
    """Bytes of verified shards a relay may hold in memory at once, across the versions it is mirroring, and when
    to: `hold(size)`, by default while the page cache is pressed (`page_cache_pressed`)."""

    def __init__(self, limit: int, hold: Callable[[int], bool] = page_cache_pressed) -> None:
        if limit < 0:
            raise ValueError(f"a memory budget cannot be negative, got {limit}")
        self.limit, self.hold = limit, hold
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        with self._lock:
            return self._used

    def take(self, size: int) -> bool:
        """Reserve `size` bytes if they fit under the limit and are worth holding now (`hold`)."""
        if not self.hold(size):
            return False
        with self._lock:
            if self._used + size > self.limit:
                return False
            self._used += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self._used -= size


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
    ) -> Manifest:
        """Copy a trusted checkpoint directory in, build its manifest (`manifest_format`) from the copy, sign it, and
        store it.

        One read of the source (a kernel copy) and one hashing pass over the copy: the origin's path. The copy is
        fsynced while it is hashed (both only read it), so publishing waits for the longer of the two, not both.
        `sign(manifest)` returns the trainer's 65-byte signature.
        """
        trace.event("publish_start", step=step)
        tmp = Path(tempfile.mkdtemp(dir=self._tmp, prefix=f"{step}."))
        try:
            names = []
            for entry in sorted(os.scandir(checkpoint_dir), key=lambda e: e.name):
                check_name(entry.name)
                if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                    raise ManifestError(f"{entry.name!r} in {checkpoint_dir} is not a regular file")
                shutil.copyfile(entry.path, tmp / entry.name)
                names.append(entry.name)
            trace.event("publish_copied", step=step)
            with ThreadPoolExecutor(1, thread_name_prefix="publish-fsync") as pool:
                synced = [pool.submit(_fsync_path, tmp / name) for name in names]
                manifest = build_manifest(
                    tmp, pool_id=pool_id, step=step, shard_size=shard_size, format_version=manifest_format
                )
                for done in synced:
                    done.result()
            trace.event("publish_hashed", step=step)
            if self._stored(manifest):
                shutil.rmtree(tmp)
                return manifest
            self._install(tmp, manifest, sign(manifest))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        trace.event("published", step=step)
        return manifest

    def _stored(self, manifest: Manifest) -> bool:
        """True if this exact version is already stored; `VersionExists` if the step holds another manifest."""
        if not (self._versions / str(manifest.step)).exists():
            return False
        if self.manifest(manifest.step) != manifest:
            raise VersionExists(manifest.step)
        return True

    def _install(self, tmp: Path, manifest: Manifest, signature: bytes) -> None:
        _write_durably(tmp / PARTIAL_MANIFEST_NAME, encode_manifest(manifest))
        _write_durably(tmp / SIGNATURE_NAME, signature)
        _fsync_path(tmp)
        os.rename(tmp, self._versions / str(manifest.step))
        _fsync_path(self._versions)
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
        _fsync_path(self._versions)
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


class PartialCheckpoint:
    """A checkpoint being downloaded into `<target>.partial/`, resumable, published by `finish()`.

    `write_shard` may be called from several threads. Opening a partial directory left by another
    manifest (another step) discards it and starts over. With `metadata` (dot-name -> bytes), those files
    and the manifest copy stay in the published directory: that is how a relay's store keeps a version.

    With a `memory` budget (a relay's), shards are received into memory (one `memfd` per file) while the budget
    allows and the page cache is pressed (`MemoryBudget.hold`), served from there once verified, and written to the
    partial folder only by `write_behind`, which `finish` calls: a relay's clients are never held up by its disk,
    which on a machine that writes slowly would pace its receiving and serving, and on a disk shared with them
    would take their writes' turn. Each shard stays
    where its first byte went (a resumed range lands beside the bytes before it); the rest go to the folder. A
    shard in memory is journalled once written behind, so a crash before that loses it and a restart fetches it
    again: it is never served unverified.
    """

    def __init__(
        self,
        target_dir: str | os.PathLike[str],
        manifest: Manifest,
        *,
        metadata: Mapping[str, bytes] | None = None,
        writeback: bool = True,
        memory: MemoryBudget | None = None,
    ) -> None:
        self.target = Path(target_dir)
        self.memory = memory if memory is not None and hasattr(os, "memfd_create") else None
        self._placed: dict[tuple[str, int], bool] = {}  # shards whose bytes went somewhere: True = in memory
        self._memfds: dict[str, int] = {}  # file name -> the memfd holding its shards placed in memory
        # start writing each range to disk as it lands, so `finish` has little left to fsync: a client's rename
        # waits for that fsync; a relay's does not (it serves each shard as soon as it is verified), and its disk
        # writes only take the CPU and the disk from its own transfers and its clients'
        self.writeback = writeback
        self.partial = self.target.with_name(self.target.name + ".partial")
        self.manifest = manifest
        self.metadata = dict(metadata or {})
        self._keep_metadata = metadata is not None
        for name in self.metadata:
            if not name.startswith(".") or "/" in name or name in (JOURNAL_NAME, PARTIAL_MANIFEST_NAME):
                raise ValueError(f"metadata name {name!r} must be a new dot-name")
        if self.target.exists():
            raise TargetExists(str(self.target))
        self._shards = {(f.name, s.index): s for f in manifest.files for s in f.shards}
        self._sizes = {f.name: f.size for f in manifest.files}
        self._done: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._finished = False
        encoded = encode_manifest(manifest)
        marker = self.partial / PARTIAL_MANIFEST_NAME
        if self.partial.exists() and not (marker.is_file() and marker.read_bytes() == encoded):
            shutil.rmtree(self.partial)
        if self.partial.exists():
            self._resume()
        else:
            self.partial.mkdir(parents=True)
            _write_durably(marker, encoded)
        for name, data in self.metadata.items():
            _write_durably(self.partial / name, data)
        for mf in manifest.files:
            with open(self.partial / mf.name, "ab") as f:  # creates it
                if os.fstat(f.fileno()).st_size == mf.size:
                    continue  # resumed
                reserve_space(self.partial / mf.name, f.fileno(), mf.size)  # extends it where it can
                try:
                    f.truncate(mf.size)  # sparse where it could not, or shorter than a leftover
                except OSError as exc:
                    raise RelayError(f"cannot hold {mf.size} bytes at {self.partial / mf.name}: {exc}") from exc
        self._journal: TextIO | None = None
        self._rewrite_journal()

    def _resume(self) -> None:
        """Keep only journalled shards whose bytes still hash right: a crash may have torn the last writes."""
        try:
            lines = (self.partial / JOURNAL_NAME).read_text(encoding="utf-8").split("\n")[:-1]  # drop a torn tail
        except FileNotFoundError:
            lines = []
        for line in lines:
            index, _, file = line.partition("\t")
            shard = self._shards.get((file, int(index))) if index.isdigit() else None
            if shard is None or (file, shard.index) in self._done:
                continue
            path = self.partial / file
            if path.is_file() and path.stat().st_size >= shard.offset + shard.size:
                data = _pread_exact(path, shard.offset, shard.size)
                if shard.check(data) is None:
                    self._done.add((file, shard.index))

    def _rewrite_journal(self) -> None:
        """Replace the journal with exactly the verified shards, and reopen it for appending."""
        if self._journal is not None:
            self._journal.close()
        text = "".join(f"{i}\t{f}\n" for f, i in sorted(self._done) if not self._placed.get((f, i)))
        tmp = self.partial / (JOURNAL_NAME + ".tmp")
        _write_durably(tmp, text.encode("utf-8"))
        os.replace(tmp, self.partial / JOURNAL_NAME)
        self._journal = open(self.partial / JOURNAL_NAME, "a", encoding="utf-8")  # noqa: SIM115 (closed by finish)

    def write_shard(self, file: str, index: int, data: bytes) -> bool:
        """Check `data` against the manifest and write it in place; False if the shard was already done.

        A shard that fails its hash raises `ShardHashMismatch` and writes nothing.
        """
        shard = self._shards.get((file, index))
        if shard is None:
            raise UnknownShard(file, index)
        _check_shard(file, shard, data)
        with self._lock:
            if self._finished:
                raise RelayError(f"{self.target} is already finished")
            if (file, index) in self._done:
                return False
        fd, offset, _ = self.open_target(file, index)
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], offset + written)
        finally:
            os.close(fd)
        self._journal_done(file, index)
        return True

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._finished

    def write_unverified(self, file: str, index: int, at: int, chunks: Sequence[bytes]) -> None:
        """Write the concatenated `chunks` into a shard not yet done, at offset `at` within it, unverified.

        For a client that hashes a shard as it streams in; `commit` then checks the hash and journals it.
        Bytes written here and never committed are ignored on resume (only journalled shards count).
        """
        shard = self._shards.get((file, index))
        if shard is None:
            raise UnknownShard(file, index)
        size = sum(len(c) for c in chunks)
        if at < 0 or at + size > shard.size:
            raise RelayError(f"{size} bytes at {at} do not fit shard {file}[{index}] of {shard.size} bytes")
        fd, _, _ = self.open_target(file, index)
        try:
            written = os.pwritev(fd, chunks, shard.offset + at)
            if written < size:  # a short write (rare): finish it piece by piece
                rest = b"".join(chunks)[written:]
                while rest:
                    n = os.pwrite(fd, rest, shard.offset + at + written)
                    rest, written = rest[n:], written + n
            if self.writeback:
                start_writeback(fd, shard.offset + at, size)
        finally:
            os.close(fd)

    def open_target(self, file: str, index: int) -> tuple[int, int, int]:
        """(a new file descriptor, offset, size) where a shard not yet done is to be written, for a caller that
        writes it itself (the splice path), which then calls `commit` like a `write_unverified` caller, and closes
        the descriptor. It is the partial file, or the memory holding the version's shards (`memory`)."""
        shard = self._shards.get((file, index))
        if shard is None:
            raise UnknownShard(file, index)
        with self._lock:
            if self._finished or (file, index) in self._done:
                raise RelayError(f"shard {file}[{index}] is already written (or the checkpoint finished)")
            if self._in_memory(file, index, shard):
                return os.dup(self._memfds[file]), shard.offset, shard.size
        return os.open(self.partial / file, os.O_RDWR), shard.offset, shard.size

    def open_placed(self, file: str, index: int) -> tuple[int, int]:
        """(a new read-only file descriptor, offset) onto a shard's bytes as they are now, verified or not, for a
        caller that compares pieces of them (`Downloader`'s suspects); the caller closes it."""
        shard = self._shards.get((file, index))
        if shard is None:
            raise UnknownShard(file, index)
        with self._lock:
            fd = self._memory_fd(file, index)
        return (os.open(self.partial / file, os.O_RDONLY) if fd is None else fd), shard.offset

    def open_verified(self, file: str, index: int) -> BinaryIO | None:
        """An open file holding the verified shard at its manifest offset, None if it is not done yet; the caller
        closes it. `FileNotFoundError` once the version was renamed into place (then read the final path)."""
        with self._lock:
            if (file, index) not in self._done:
                return None
            fd = self._memory_fd(file, index)
        return open(self.partial / file, "rb") if fd is None else os.fdopen(fd, "rb")

    def _memory_fd(self, file: str, index: int) -> int | None:
        """A new file descriptor onto the memory holding the shard, None if its bytes went to the partial file. The
        caller holds the lock."""
        return os.dup(self._memfds[file]) if self._placed.get((file, index)) else None

    def _in_memory(self, file: str, index: int, shard: ShardInfo) -> bool:
        """Whether the shard's bytes go to memory: decided at its first write, while the budget allows, and kept.
        The caller holds the lock."""
        placed = self._placed.get((file, index))
        if placed is None:
            placed = self.memory is not None and self.memory.take(shard.size)
            if placed and file not in self._memfds:
                fd = os.memfd_create(f"shardcast-{file}", os.MFD_CLOEXEC)
                os.ftruncate(fd, self._sizes[file])  # sparse: memory is taken only where shards land
                self._memfds[file] = fd
            self._placed[(file, index)] = placed
        return placed

    @property
    def held_bytes(self) -> int:
        """Bytes of shards placed in memory and not written behind yet."""
        with self._lock:
            return self._held()

    def _held(self) -> int:
        """Bytes of shards placed in memory, taken from `memory`. The caller holds the lock."""
        return sum(self._shards[key].size for key, placed in self._placed.items() if placed)

    def write_behind(self) -> int:
        """Write every verified shard held in memory into the partial file and journal it, then free its memory;
        returns the bytes written. Shards still arriving in memory stay there. Readers that opened a shard in
        memory keep reading it; new ones read the file."""
        with self._lock:
            moving = sorted(key for key, placed in self._placed.items() if placed and key in self._done)
            sources = {file: os.dup(self._memfds[file]) for file, _ in moving}
        written = 0
        try:
            for file, source in sources.items():
                with _range_copier(source, self.partial / file) as copy:
                    for index in (index for name, index in moving if name == file):
                        shard = self._shards[(file, index)]
                        copy(shard.offset, shard.size)
                        with self._lock:
                            if self._finished:
                                raise RelayError(f"{self.target} was closed while its shards were being written")
                            self._placed[(file, index)] = False
                            assert self.memory is not None and self._journal is not None
                            self.memory.give(shard.size)
                            self._journal.write(f"{index}\t{file}\n")
                            self._journal.flush()
                        written += shard.size
        finally:
            for fd in sources.values():
                os.close(fd)
        with self._lock:
            if not self._held():
                self._release_memory()
        return written

    def _release_memory(self) -> None:
        """Close the memfds and give their budget back; shards held in memory are no longer done. The caller holds
        the lock."""
        for fd in self._memfds.values():
            os.close(fd)
        self._memfds.clear()
        if self.memory is not None:
            self.memory.give(self._held())
        for key, placed in self._placed.items():
            if placed:
                self._done.discard(key)
        self._placed = {key: False for key, placed in self._placed.items() if not placed}

    def commit(self, file: str, index: int, digest: bytes) -> None:
        """Mark a shard written with `write_unverified` as done, if `digest` (of all its bytes, by the shard's
        `hasher()`) is the manifest's.

        A wrong hash raises `ShardHashMismatch` and leaves the shard missing.
        """
        shard = self._shards.get((file, index))
        if shard is None:
            raise UnknownShard(file, index)
        if digest != shard.digest:
            raise ShardHashMismatch(file, index, shard.digest.hex(), digest.hex())
        self._journal_done(file, index)

    def _journal_done(self, file: str, index: int) -> None:
        with self._lock:
            if self._finished:
                raise RelayError(f"{self.target} is already finished")
            # no fsync here: a power cut can tear the data under a journal line, and resume re-hashes it
            assert self._journal is not None
            if not self._placed.get((file, index)):  # a shard in memory is journalled once written behind
                self._journal.write(f"{index}\t{file}\n")
                self._journal.flush()
            self._done.add((file, index))

    def has(self, file: str, index: int) -> bool:
        """True once the shard is written and verified."""
        with self._lock:
            return (file, index) in self._done

    def close(self) -> None:
        """Stop writing (an abandoned download); the partial directory stays for a later resume."""
        with self._lock:
            self._finished = True
            if self._journal is not None:
                self._journal.close()
            self._release_memory()

    def missing(self) -> list[tuple[str, int]]:
        """Shards not yet written, in manifest order."""
        with self._lock:
            return [
                (f.name, s.index) for f in self.manifest.files for s in f.shards if (f.name, s.index) not in self._done
            ]

    @property
    def done_bytes(self) -> int:
        with self._lock:
            return sum(self._shards[key].size for key in self._done)

    def finish(self, *, verify_files: bool = True) -> Path:
        """Verify every file, fsync, and rename `<target>.partial` to `<target>`; returns the target.

        Requirements: no shard missing (`IncompleteCheckpoint`); every whole-file hash right
        (`FileHashMismatch`; shards that no longer verify become missing again); the target absent (`TargetExists`).

        `verify_files=False` skips the whole-file pass. Every byte is already covered by a verified shard hash
        (written in this process, or re-hashed on resume); the pass only catches a manifest whose file hash
        disagrees with its own shards, which the trainer signed, at the cost of reading every byte again.
        """
        missing = self.missing()
        if missing:
            raise IncompleteCheckpoint(missing)
        if self.target.exists():
            raise TargetExists(str(self.target))
        trace.event("finish_start", step=self.manifest.step)
        if self.held_bytes:
            self.write_behind()
            trace.event("finish_written_behind", step=self.manifest.step)
        for mf in self.manifest.files:
            if verify_files:
                self._verify_file(mf)
            else:
                _fsync_path(self.partial / mf.name)
        with self._lock:
            self._finished = True
            if self._journal is not None:
                self._journal.close()
        (self.partial / JOURNAL_NAME).unlink()
        if not self._keep_metadata:
            (self.partial / PARTIAL_MANIFEST_NAME).unlink()
        _fsync_path(self.partial)
        trace.event("finish_fsynced", step=self.manifest.step)
        os.rename(self.partial, self.target)
        _fsync_path(self.target.parent)
        trace.event("finish_renamed", step=self.manifest.step)
        return self.target

    def _verify_file(self, mf: ManifestFile) -> None:
        whole = hashlib.sha256()
        with open(self.partial / mf.name, "rb+") as f:
            while chunk := f.read(1024 * 1024):
                whole.update(chunk)
            os.fsync(f.fileno())
        if whole.digest() == mf.sha256:
            return
        with self._lock:  # find the shards that went bad so missing() asks for them again
            for shard in mf.shards:
                data = _pread_exact(self.partial / mf.name, shard.offset, shard.size)
                if shard.check(data) is not None:
                    self._done.discard((mf.name, shard.index))
            self._rewrite_journal()
        raise FileHashMismatch(mf.name, mf.sha256.hex(), whole.hexdigest())
