"""Torch's thread count is per thread: a thread that computes sets its own.

`torch.set_num_threads` sets OpenMP's count for the calling thread only (and a global that a thread reads once, at
its first parallel operation). A count set on the main thread therefore never reaches a thread that already
computed, and an executor's thread created earlier keeps the machine's default of one thread a core: on a machine
whose cores are shared (a trainer beside its local workers), threads that spin at every barrier make the work
slower, not faster. So each thread that computes calls `use_torch_threads` as it starts (an executor's
`initializer`).
"""

from __future__ import annotations


def use_torch_threads(threads: int = 0) -> None:
    """The calling thread's torch (and OpenMP) thread count: `threads`, or when 0 the count torch holds now."""
    import torch

    torch.set_num_threads(threads or torch.get_num_threads())
