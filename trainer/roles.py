"""Who may do what at the coordinator: pool members ask for tasks and upload, validators attest.

`LedgerRoles` asks the chain (ComputePool.isMember / isValidator) and remembers an answer for `ttl` seconds, so
a burst of requests costs one RPC per address; an ejected node is refused again within `ttl`. The ttl is a minute,
longer than a worker's pace: a GPU worker on a 7B-32B model asks twice a file, every 30 s or so, and with the
10 s it had every one of its requests missed the cache (benchmarks/scale.py: 1,000 members cost the event loop a
web3 call a request, a fifth of the coordinator's samples, and passed the lookup budget). An ejected node's
uploads in that minute are never paid (WorkLedger) and are bounded by its quota. Both caches are
bounded (least recently used first out), and lookups of addresses it has no answer for share a budget
(`lookups_per_s`): a flood of fresh keys costs the chain at most that, and is answered `RoleLookupBusy` (429)
beyond it, while every cached member and validator goes on being served. `StaticRoles` is a fixed table, for
the trainer's local mode, where the trainer starts the workers itself and trusts them.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from core.ratelimit import TokenBucket

if TYPE_CHECKING:
    from ledger.client import Ledger


class Roles(Protocol):
    async def is_member(self, address: str) -> bool: ...

    async def is_validator(self, address: str) -> bool: ...


@dataclass(frozen=True)
class StaticRoles:
    members: frozenset[str] = frozenset()
    validators: frozenset[str] = frozenset()

    async def is_member(self, address: str) -> bool:
        return address in self.members

    async def is_validator(self, address: str) -> bool:
        return address in self.validators


class RoleLookupBusy(Exception):
    """Too many lookups of unknown addresses right now; the caller should try again after `retry_after` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"too many role lookups of unknown addresses; try again in {retry_after:.2f} s")
        self.retry_after = retry_after


@dataclass
class LedgerRoles:
    ledger: Ledger
    pool_id: int
    ttl: float = 60.0  # seconds: above two of a worker's requests at a GPU's pace (see the module doc)
    max_known: int = 100_000  # cached answers "yes" (members, validators): the pool's own, never crowded out
    max_refused: int = 10_000  # cached answers "no": strangers, bounded apart so they cannot evict members
    lookups_per_s: float = 50.0  # chain lookups of addresses with no live answer, shared by all of them
    lookup_burst: int = 200
    _known: OrderedDict[tuple[str, str], float] = field(default_factory=OrderedDict)
    _refused: OrderedDict[tuple[str, str], float] = field(default_factory=OrderedDict)
    _budget: TokenBucket | None = None

    async def _ask(self, role: str, address: str) -> bool:
        now = time.monotonic()
        key = (role, address)
        for table, answer in ((self._known, True), (self._refused, False)):
            seen = table.get(key)
            if seen is not None and now - seen < self.ttl:
                table.move_to_end(key)
                return answer
        if self._budget is None:
            self._budget = TokenBucket(self.lookups_per_s, self.lookup_burst, now)
        if not self._budget.take(now):
            raise RoleLookupBusy(1.0 / self.lookups_per_s)
        check = self.ledger.is_member if role == "member" else self.ledger.is_validator
        answer = await asyncio.to_thread(check, self.pool_id, address)  # the Ledger client is synchronous
        table, limit = (self._known, self.max_known) if answer else (self._refused, self.max_refused)
        (self._refused if answer else self._known).pop(key, None)
        table[key] = now
        table.move_to_end(key)
        while len(table) > limit:
            table.popitem(last=False)
        return answer

    async def is_member(self, address: str) -> bool:
        return await self._ask("member", address)

    async def is_validator(self, address: str) -> bool:
        return await self._ask("validator", address)
