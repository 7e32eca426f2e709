"""Which of this host's resources ran out, read from an exception's type and errno, never from its message.

A process that runs out of memory, disk space or file descriptors fails on its own account: the input it was
working on is not at fault. A role that judges a stranger's input (a validator, whose verdicts slash stake) asks
`exhausted` before it blames the input; parsers that wrap every error of a library into their own (the rollout
reader wraps what pyarrow raises into `RolloutFormatError ... from exc`) keep the original as the cause, which is
followed here.
"""

from __future__ import annotations

import errno
import sys
from enum import StrEnum


class Resource(StrEnum):
    """A resource of this host that can run out."""

    MEMORY = "memory"
    DISK = "disk"
    DESCRIPTORS = "descriptors"  # open files and sockets, per process (EMFILE) or system-wide (ENFILE)


_BY_ERRNO = {
    errno.ENOMEM: Resource.MEMORY,
    errno.ENOSPC: Resource.DISK,
    errno.EDQUOT: Resource.DISK,
    errno.EMFILE: Resource.DESCRIPTORS,
    errno.ENFILE: Resource.DESCRIPTORS,
}


def exhausted(exc: BaseException) -> Resource | None:
    """The resource `exc`, or an exception it was raised from (`raise ... from`), says ran out; None otherwise.

    Memory: `MemoryError` (pyarrow's `ArrowMemoryError` is one), torch's `OutOfMemoryError` (CUDA, or the CPU
    allocator), an `OSError` with ENOMEM. Disk: ENOSPC, EDQUOT. Descriptors: EMFILE, ENFILE.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or _is_torch_oom(current):
            return Resource.MEMORY
        if isinstance(current, OSError) and current.errno in _BY_ERRNO:
            return _BY_ERRNO[current.errno]
        current = current.__cause__
    return None


def _is_torch_oom(exc: BaseException) -> bool:
    # A torch error exists only once torch is imported, so it is looked up, never imported: importing it takes
    # seconds, and under a memory limit it may be the very thing that failed.
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None)
    return isinstance(oom, type) and isinstance(exc, oom)
