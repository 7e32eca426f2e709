"""When the validator daemon acts: the pool's step at a submission's time, retry back-off, and stoppable work.

Pure or self-contained pieces of `validator.daemon`, kept apart so that each is tested without a chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from node.coordinator import PublishedStep

T = TypeVar("T")
MAX_RETRY_SECONDS = 30.0  # longest wait before a row that failed for a passing reason is tried again


def step_at(history: Sequence[PublishedStep], timestamp: float, slack: float) -> int | None:
    """The pool's step when a block stamped `timestamp` was mined: the newest step published by then.

    `slack` seconds of the trainer's clock running ahead of the chain's are forgiven (erring late only widens the
    window an honest file is judged by). None when the history starts after `timestamp`: the step is unknown.
    """
    published = [entry.step for entry in history if entry.at <= timestamp + slack]
    return max(published) if published else None


def retry_delay(attempts: int) -> float:
    """1, 2, 4 ... seconds, at most MAX_RETRY_SECONDS."""
    return float(min(MAX_RETRY_SECONDS, 2 ** min(attempts, 16)))


class Stopped(Exception):
    """The daemon was asked to stop while waiting for a result it can drop."""


async def interruptible(work: Callable[[], T], stopping: asyncio.Event) -> T:
    """`work()` in a daemon thread; raises `Stopped` as soon as `stopping` is set, abandoning the thread.

    A daemon thread, not the loop's executor: interpreter exit does not wait for it, so a stop request never
    waits for a long verification (whose result nobody records: its row stays as it was).
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(set_outcome: Callable[[Any], None], outcome: Any) -> None:
        if not future.done():  # cancelled when the daemon stopped first
            set_outcome(outcome)

    def target() -> None:
        settle: Callable[[Any], None]
        outcome: Any
        try:
            settle, outcome = future.set_result, work()
        except BaseException as exc:
            settle, outcome = future.set_exception, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(deliver, settle, outcome)

    threading.Thread(target=target, name="verify", daemon=True).start()
    stop: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait([future, stop], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not future.done():
        future.cancel()
        raise Stopped()
    return future.result()
