"""Long-polls of `/versions`, held in a bounded pool of their own, apart from ordinary requests.

A long-poll costs the server almost nothing while it waits, but it waits up to a minute. Counted among the
requests in flight, 256 idle long-polls made every `/health`, manifest and shard request answer 503. So
`ShardServer` lets them bypass the in-flight limits and holds them here instead: at most `per_client` per
client address (more get 429) and `total` together.

When the pool is full, a newcomer from an address that holds fewer polls than the biggest holder takes the
place of that holder's oldest poll, which is answered at once with the current listing (a long-poll may
always return early; clients simply poll again). Polls from many addresses thus share the pool fairly, and
an address holding none is never refused; only an address that already holds as many as anyone gets 503.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from shardcast import LongPollRefused


class _Poll:
    def __init__(self, client: str) -> None:
        self.client = client
        self.cut = False  # answered early to make room for another address
        self.wake: asyncio.Future[None] | None = None


class LongPolls:
    """The long-polls being held, by client address, within `total` and `per_client`."""

    def __init__(self, total: int, per_client: int) -> None:
        if total < 1 or per_client < 1:
            raise ValueError(f"total and per_client must be positive, got {total} and {per_client}")
        self.total, self.per_client = total, per_client
        self._held: dict[str, deque[_Poll]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    async def wait(self, client: str, ready: Callable[[], bool], timeout: float) -> bool:
        """Hold a poll for `client` until `ready()` (checked on each `wake_all`), `timeout` s pass, or it is cut;
        True if it was cut to make room for another address.

        Raises `LongPollRefused` at once when `client` holds `per_client` polls already, or holds as many as
        any other address while the pool is full.
        """
        poll = self._admit(client)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while not ready() and not poll.cut and (left := deadline - loop.time()) > 0:
                poll.wake = loop.create_future()
                try:
                    await asyncio.wait_for(poll.wake, timeout=left)
                except TimeoutError:
                    break
                finally:
                    poll.wake = None
        finally:
            self._release(poll)
        return poll.cut

    def wake_all(self) -> None:
        """Something changed: every poll checks its condition again."""
        for polls in self._held.values():
            for poll in polls:
                _wake(poll)

    def _admit(self, client: str) -> _Poll:
        mine = len(self._held.get(client, ()))
        if mine >= self.per_client:
            raise LongPollRefused(client, "per_client", f"at most {self.per_client} long-polls per client")
        if self._count >= self.total:
            biggest = max(self._held.values(), key=len)
            if len(biggest) <= mine:
                raise LongPollRefused(client, "total", f"{self.total} long-polls held, {mine} of them yours")
            victim = biggest[0]
            self._release(victim)
            victim.cut = True
            _wake(victim)
        poll = _Poll(client)
        self._held.setdefault(client, deque()).append(poll)
        self._count += 1
        return poll

    def _release(self, poll: _Poll) -> None:
        polls = self._held.get(poll.client)
        if polls is None or poll not in polls:
            return  # cut already
        polls.remove(poll)
        self._count -= 1
        if not polls:
            del self._held[poll.client]


def _wake(poll: _Poll) -> None:
    if poll.wake is not None and not poll.wake.done():
        poll.wake.set_result(None)
