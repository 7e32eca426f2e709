"""When the validator daemon acts: the pool's step at a submission's time, retry back-off, and stoppable work.

Pure or self-contained pieces of `validator.daemon`, kept apart so that each is tested without a chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from protocol.coordinator.client import PublishedStep

T = TypeVar("T")
MAX_RETRY_SECONDS = 30.0  # longest wait before a row that failed for a passing reason is tried again


def step_at(history: Sequence[PublishedStep], timestamp: float) -> int | None:
    """The pool's step at `timestamp`: the newest step published by then; None when the history starts later."""
    published = [entry.step for entry in history if entry.at <= timestamp]
    return max(published) if published else None


def steps_around(history: Sequence[PublishedStep], timestamp: float, slack: float) -> tuple[int | None, int | None]:
    """The pool's steps at `timestamp - slack` and at `timestamp + slack`, for a block stamped `timestamp`.

    The trainer stamps its steps with its own clock and the chain its blocks with another; `slack` seconds of
    disagreement either way must never make an honest file look stale or early. So a file is judged against
    every step current within `slack` of its block: it is stale only when older than the earliest of them by
    more than the async level, and early only when newer than the latest. Either end is None when the history
    starts after it (the validator then cannot judge that side).
    """
    return step_at(history, timestamp - slack), step_at(history, timestamp + slack)


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
