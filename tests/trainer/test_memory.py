"""trainer/memory.py: the step loop's one thread, and memory a step freed handed back to the system.

The coordinator's RSS grew by a training step's peak for each thread of the default pool that happened to train
(benchmarks/train_memory.py measures it): these pin the two parts of the fix against the real C library."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.heap import heap_bytes, release_free_memory
from trainer.memory import TrainingThread

glibc = pytest.mark.skipif(heap_bytes() is None, reason="malloc_trim and mallinfo2 are glibc's")


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS in /proc/self/status")


def test_every_call_runs_on_the_same_one_thread() -> None:
    async def idents() -> set[int]:
        with TrainingThread() as training:
            return {await training.run(threading.get_ident) for _ in range(20)}

    [ident] = asyncio.run(idents())
    assert ident != threading.get_ident()  # off the event loop's thread


def test_a_call_gets_its_arguments_and_its_exception() -> None:
    async def calls() -> tuple[int, str]:
        with TrainingThread() as training:
            total = await training.run(sum, [1, 2, 3], start=4)
            with pytest.raises(ZeroDivisionError):
                await training.run(lambda: 1 // 0)
            return total, await training.run(str.upper, "after")

    assert asyncio.run(calls()) == (10, "AFTER")


def _hold_free_chunks(megabytes: int) -> list[bytearray]:
    """On this thread: `megabytes` MiB in 64 KiB buffers (under malloc's mmap threshold: they come from an arena),
    each followed by a small one that is kept, so that freeing the large ones leaves free chunks between live
    ones, which malloc keeps in the arena (what a training step leaves); returns the small ones."""
    large, small = [], []
    for _ in range(megabytes * 16):
        large.append(bytearray(64 << 10))
        small.append(bytearray(1024))
    for buffer in large:
        buffer[::4096] = b"\x01" * len(buffer[::4096])  # touched: resident
    del large
    return small


@glibc
def test_release_hands_back_what_a_thread_freed_and_keeps_what_is_live() -> None:
    with ThreadPoolExecutor(1) as other:  # another thread: its own arena, as a pool thread that trained had
        kept = other.submit(_hold_free_chunks, 256).result()
    before = rss()
    free = heap_bytes()
    assert free is not None and free[1] > 200 << 20  # freed, and still held by malloc
    assert release_free_memory()
    assert before - rss() > 150 << 20
    assert all(len(buffer) == 1024 for buffer in kept)  # live memory untouched


def test_the_training_thread_computes_with_the_threads_it_was_given() -> None:
    """torch's thread count is per thread: set on the event loop's thread it never reached the one that trains,
    which trained with one thread a core beside the local workers (the step's lost third, docs/trainer.md)."""
    import torch

    def count_after_work() -> int:
        torch.ones(256, 256) @ torch.ones(256, 256)  # a parallel operation: the thread's count is settled
        return torch.get_num_threads()

    async def counts() -> tuple[int, int]:
        with TrainingThread(1) as one, TrainingThread(2) as two:
            return await one.run(count_after_work), await two.run(count_after_work)

    before = torch.get_num_threads()
    assert asyncio.run(counts()) == (1, 2)
    assert torch.get_num_threads() == before  # the event loop's thread kept its own
