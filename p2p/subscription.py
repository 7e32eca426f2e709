"""The asyncio side of a topic subscription: verified messages, in arrival order, as an async iterator."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

from core.metrics import Metric
from p2p.messages import SignedMessage

log = logging.getLogger("p2p")


@dataclass(frozen=True)
class Received:
    """A message that passed every check of p2p/guard.py.

    `sender` is the peer id that published it and `signer` its Ethereum address, which is also the address
    the message's EIP-712 signature recovers to. Who may sign what (the trainer for checkpoints, appointed
    validators for attestations) is the application's check, not the transport's.
    """

    topic: str
    message: SignedMessage
    sender: str
    signer: str


_END = object()


class Subscription:
    """Messages on `topic` for one reader. Iterate with `async for`; `close()` (or the host stopping) ends it.

    When the reader falls `maxsize` messages behind, newer messages are dropped for it and counted in
    `p2p_subscription_overflow_total`; the host and other readers are not slowed down.
    """

    def __init__(
        self, topic: str, maxsize: int, on_close: Callable[[Subscription], Awaitable[None]], overflow: Metric
    ) -> None:
        self.topic = topic
        self._queue: asyncio.Queue[Received | object] = asyncio.Queue(maxsize)
        self._on_close = on_close
        self._overflow = overflow
        self.closed = False

    def offer(self, item: Received) -> None:
        """Queues `item` unless the subscription is closed or full (asyncio thread only)."""
        if self.closed:
            return
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self._overflow.inc()
            log.warning("subscription to %s is %d messages behind; dropped one", self.topic, self._queue.maxsize)

    def end(self) -> None:
        """Marks the subscription closed; a reader waiting on it wakes up and stops."""
        if self.closed:
            return
        self.closed = True
        # a full queue has no reader waiting on it: that reader drains it, then sees `closed` and stops
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_END)

    async def close(self) -> None:
        if not self.closed:
            self.end()
            await self._on_close(self)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Received:
        if self.closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, Received):
            return item
        raise StopAsyncIteration

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
