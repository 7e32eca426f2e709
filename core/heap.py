"""The process's C heap: how much glibc's malloc holds, and handing what it keeps free back to the system.

glibc keeps what a thread frees in that thread's arena for its next allocation, so a process that once held a
large peak (a training step's activations, a flood of 60 MiB bodies) keeps its RSS long after the memory is free.
`release_free_memory` (`malloc_trim(0)`) returns the free pages of every arena; `heap_bytes` (`mallinfo2`) tells
what is in use and what is kept. Elsewhere than glibc both say so (False, None) and do nothing. Used by the
trainer after each step (trainer/memory.py) and by the coordinator after large bodies (core/bodies.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None


def heap_bytes() -> tuple[int, int] | None:
    """(in use, free and kept) bytes of malloc's arenas, every thread's together (glibc's `mallinfo2`); None
    where the C library has no `mallinfo2` (not glibc, or older than 2.33)."""
    libc = _libc()
    mallinfo2 = getattr(libc, "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.uordblks), int(info.fordblks)


def release_free_memory(*, above: int = 0) -> bool:
    """Returns the free pages of every malloc arena to the system; False where malloc cannot (not glibc), or when
    malloc keeps no more than `above` bytes free (then it keeps them: the caller's next allocations reuse them).

    Costs a walk of the free lists (milliseconds after a step); what is in use is never touched. What it hands back
    is faulted in again, page by page, by the next allocation that needs it."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    if above:
        held = heap_bytes()
        if held is not None and held[1] <= above:
            return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
