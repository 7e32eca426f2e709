"""Linux file I/O for checkpoint bytes, and how much of them a relay may hold in memory.

Durable writes and fsyncs (a rename is only as durable as the fsyncs before it), exact positional reads, a copier
of ranges between open files, and two Linux calls with no `os` binding, reached through libc where they exist:
`start_writeback` (sync_file_range) and `reserve_space` (fallocate); elsewhere they do nothing. `page_cache_pressed`
reads the kernel's dirty page figures, and `MemoryBudget` bounds the verified shards a relay holds in memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from shardcast import RelayError


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


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Write `data` as the whole file at `path`, and fsync it (not its directory: see `fsync_path`)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def pread_exact(path: Path, offset: int, size: int) -> bytes:
    """`size` bytes of the file at `path` from `offset`; `RelayError` if the file ends before them."""
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), size, offset)
    if len(data) != size:
        raise RelayError(f"{path}: short read at offset {offset} ({len(data)} of {size} bytes)")
    return data


@contextlib.contextmanager
def range_copier(source: int, path: Path) -> Iterator[Callable[[int, int], None]]:
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
