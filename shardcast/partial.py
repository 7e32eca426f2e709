"""The client's partial download: one checkpoint version assembled from verified shards, resumable.

`PartialCheckpoint` assembles one version on a client from verified shards in any order, in
`<target>.partial/`, with a journal of the shards written so a restarted process resumes; `finish()`
checks whole files and renames the directory to `<target>`, so the final path never holds a partial
checkpoint. The journal and a copy of the manifest live inside the partial directory under dot-names,
which no manifest file can have; they are removed just before the rename.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from shardcast import (
    FileHashMismatch,
    IncompleteCheckpoint,
    RelayError,
    ShardHashMismatch,
    TargetExists,
    UnknownShard,
    trace,
)
from shardcast.fileio import (
    MemoryBudget,
    fsync_path,
    pread_exact,
    range_copier,
    reserve_space,
    start_writeback,
    write_durably,
)
from shardcast.manifest import Manifest, ManifestFile, ShardInfo, encode_manifest

JOURNAL_NAME = ".shardcast-journal"  # "<index>\t<file>\n" per shard written; names hold no tab or newline
PARTIAL_MANIFEST_NAME = ".shardcast-manifest.json"


def check_shard(file: str, shard: ShardInfo, data: bytes) -> None:
    actual = shard.check(data)
    if actual is not None:
        raise ShardHashMismatch(file, shard.index, shard.digest.hex(), actual.hex())


def partial_path(target: Path) -> Path:
    """Where a `PartialCheckpoint` of `target` assembles it."""
    return target.with_name(target.name + ".partial")


def bad_shards(path: Path, mf: ManifestFile) -> list[int]:
    """The shards of `path` that do not hash to the manifest's values (all of them if its size is not the file's)."""
    if not path.is_file() or path.stat().st_size != mf.size:
        return [s.index for s in mf.shards]
    if mf.size == 0:
        return []
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped, memoryview(mapped) as view:
        bad = []
        for shard in mf.shards:
            with view[shard.offset : shard.offset + shard.size] as piece:
                if shard.check(piece) is not None:
                    bad.append(shard.index)
        return bad


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
        keep_manifest: bool | None = None,
    ) -> None:
        """`keep_manifest`: whether the published folder keeps this manifest (default: when there is `metadata`)."""
        self.target = Path(target_dir)
        self.memory = memory if memory is not None and hasattr(os, "memfd_create") else None
        self._placed: dict[tuple[str, int], bool] = {}  # shards whose bytes went somewhere: True = in memory
        self._memfds: dict[str, int] = {}  # file name -> the memfd holding its shards placed in memory
        # start writing each range to disk as it lands, so `finish` has little left to fsync: a client's rename
        # waits for that fsync; a relay's does not (it serves each shard as soon as it is verified), and its disk
        # writes only take the CPU and the disk from its own transfers and its clients'
        self.writeback = writeback
        self.partial = partial_path(self.target)
        self.manifest = manifest
        self.metadata = dict(metadata or {})
        self._keep_manifest = metadata is not None if keep_manifest is None else keep_manifest
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
            write_durably(marker, encoded)
        for name, data in self.metadata.items():
            write_durably(self.partial / name, data)
        for mf in manifest.files:
            self._allocate(mf)
        self._journal: TextIO | None = None
        self._rewrite_journal()

    def _allocate(self, mf: ManifestFile) -> None:
        """The file at its full size, its disk allocated where the file system can (a resumed one is left as is)."""
        with open(self.partial / mf.name, "ab") as f:  # creates it
            if os.fstat(f.fileno()).st_size == mf.size:
                return  # resumed
            reserve_space(self.partial / mf.name, f.fileno(), mf.size)  # extends it where it can
            try:
                f.truncate(mf.size)  # sparse where it could not, or shorter than a leftover
            except OSError as exc:
                raise RelayError(f"cannot hold {mf.size} bytes at {self.partial / mf.name}: {exc}") from exc

    def release_file(self, file: str) -> bool:
        """Give back the disk held for `file` while none of its shards is written (and no memory holds the version):
        for a receiver about to rebuild the file from a delta, which writes it whole elsewhere and moves it in
        (`take_file`), so that the disk never holds it twice. True if released; `allocate_file` takes the space
        again for a file that was not taken."""
        mf = self.manifest.file(file)
        if mf is None:
            raise UnknownShard(file, 0)
        with self._lock:
            if self._finished or self.memory is not None or any((file, s.index) in self._done for s in mf.shards):
                return False
            os.truncate(self.partial / file, 0)
        return True

    def allocate_file(self, file: str) -> None:
        """`file` at its full size again after `release_file` (nothing if it is, or was taken meanwhile)."""
        mf = self.manifest.file(file)
        if mf is None:
            raise UnknownShard(file, 0)
        self._allocate(mf)

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
                data = pread_exact(path, shard.offset, shard.size)
                if shard.check(data) is None:
                    self._done.add((file, shard.index))

    def _rewrite_journal(self) -> None:
        """Replace the journal with exactly the verified shards, and reopen it for appending."""
        if self._journal is not None:
            self._journal.close()
        text = "".join(f"{i}\t{f}\n" for f, i in sorted(self._done) if not self._placed.get((f, i)))
        tmp = self.partial / (JOURNAL_NAME + ".tmp")
        write_durably(tmp, text.encode("utf-8"))
        os.replace(tmp, self.partial / JOURNAL_NAME)
        self._journal = open(self.partial / JOURNAL_NAME, "a", encoding="utf-8")  # noqa: SIM115 (closed by finish)

    def write_shard(self, file: str, index: int, data: bytes) -> bool:
        """Check `data` against the manifest and write it in place; False if the shard was already done.

        A shard that fails its hash raises `ShardHashMismatch` and writes nothing.
        """
        shard = self._shards.get((file, index))
        if shard is None:
            raise UnknownShard(file, index)
        check_shard(file, shard, data)
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

    def take_file(self, file: str, path: Path) -> int:
        """Take the shards of `file` not yet done from a whole copy of it at `path` (a file rebuilt from a delta), each
        only if it verifies; returns the bytes taken. `path` is gone afterwards. When none of the file's shards is done
        and no memory holds the version, the copy is moved into place and checked there, without copying a byte."""
        mf = next((f for f in self.manifest.files if f.name == file), None)
        if mf is None:
            raise UnknownShard(file, 0)
        with self._lock:
            if self._finished:
                raise RelayError(f"{self.target} is already finished")
            untouched = self.memory is None and not any((file, s.index) in self._done for s in mf.shards)
        taken = 0
        if untouched and path.stat().st_size == mf.size:
            os.replace(path, self.partial / file)
            bad = set(bad_shards(self.partial / file, mf))
            for shard in mf.shards:
                if shard.index not in bad:
                    self._journal_done(file, shard.index)
                    taken += shard.size
            return taken
        try:
            for shard in mf.shards:
                if self.has(file, shard.index) or path.stat().st_size < shard.offset + shard.size:
                    continue
                try:
                    if self.write_shard(file, shard.index, pread_exact(path, shard.offset, shard.size)):
                        taken += shard.size
                except ShardHashMismatch:
                    continue
        finally:
            path.unlink(missing_ok=True)
        return taken

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
                with range_copier(source, self.partial / file) as copy:
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
                fsync_path(self.partial / mf.name)
        with self._lock:
            self._finished = True
            if self._journal is not None:
                self._journal.close()
        (self.partial / JOURNAL_NAME).unlink()
        if not self._keep_manifest:
            (self.partial / PARTIAL_MANIFEST_NAME).unlink()
        fsync_path(self.partial)
        trace.event("finish_fsynced", step=self.manifest.step)
        os.rename(self.partial, self.target)
        fsync_path(self.target.parent)
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
                data = pread_exact(self.partial / mf.name, shard.offset, shard.size)
                if shard.check(data) is not None:
                    self._done.discard((mf.name, shard.index))
            self._rewrite_journal()
        raise FileHashMismatch(mf.name, mf.sha256.hex(), whole.hexdigest())
