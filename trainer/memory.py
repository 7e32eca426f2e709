"""Where the trainer's training runs, and giving the memory a step freed back to the system.

Under `benchmarks/scale.py` the coordinator's process grew by one training step's peak every few steps (3.7 GB
after the N = 100 phase, 4.6 GB after N = 1,000) while its Python objects, pyarrow's pool and its live heap stayed
flat. glibc's malloc gives each thread that allocates an arena of its own (up to 8 per core), and keeps what a
thread frees in that arena for the thread's next allocation: a step's activations (tensors of a few MB, under
malloc's mmap threshold once it has risen to 32 MB) were freed into the arena of whichever thread of the event
loop's default pool trained that step, and each new thread that trained kept one step's peak more (measured,
N = 30 at a 5 s pace: 2.6 GiB free and held in the arenas against 0.2 GiB in use, after 4 steps).

So the step loop's work runs on one thread of its own (`TrainingThread`): what a step frees, the next one reuses.
That thread sets its own torch thread count as it starts (`[run] threads`): torch sets OpenMP's count for the
calling thread only, so a count set on the event loop's thread never reached the thread that trains. Until issue 33
it trained with the machine's default of one thread a core, against the local workers' generation on those cores
(docs/trainer.md, "The step's lost third").

And after each step (`TrainingLoop.train`, on every rank) `core.heap.release_free_memory` hands the free pages of
every arena back to the system (glibc's `malloc_trim`) once malloc keeps more than `KEEP_FREE_BYTES` (256 MiB) free,
so between steps the process holds what is live and at most that much more, and during one at most one step's peak
more, which `[learner] micro_batch_tokens` bounds. Below that bound the next step reuses the memory instead of
faulting it in again. Elsewhere (musl, macOS) it does nothing and says so.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from core.threads import use_torch_threads

P = ParamSpec("P")
T = TypeVar("T")


class TrainingThread:
    """One thread for the step loop's work (choosing files, training, checkpoints), awaited from the event loop.

    Every call runs on the same thread, so a step's memory lands in one malloc arena that the next step reuses;
    with a pool of threads each thread that happened to train kept a step's peak in an arena of its own."""

    def __init__(self, threads: int = 0) -> None:
        """`threads`: torch's intra-op threads for everything this thread runs (0: torch's default)."""
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix="training", initializer=functools.partial(use_torch_threads, threads)
        )

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`function(*args, **kwargs)` on the training thread."""
        call = functools.partial(function, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def __enter__(self) -> TrainingThread:
        return self

    def __exit__(self, *exc: object) -> None:
        """The thread ends once the call under way, if any, has (not waited for here: on the event loop)."""
        self._executor.shutdown(wait=False)
