"""How a daemon (the worker's, the validator's) runs in the foreground: until it returns, or SIGTERM or SIGINT asks it
to stop, which sets its `stopping` event so that it finishes what it is doing and returns."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol, TypeVar

T = TypeVar("T", covariant=True)


class Stoppable(Protocol[T]):
    """A daemon that runs until its `stopping` event is set."""

    stopping: asyncio.Event

    def run(self) -> Awaitable[T]: ...


async def run_until_signalled(daemon: Stoppable[T]) -> T:
    """`daemon.run()`'s result, with SIGTERM and SIGINT setting `daemon.stopping` meanwhile."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopping.set)
    return await daemon.run()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancels every one of `tasks`, then waits for each to end: a background loop stops before what it uses (a
    server, a gossip host) is closed under it. Their cancellations end here; any other error is raised."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
