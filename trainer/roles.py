"""Who may do what at the coordinator: pool members ask for tasks and upload, validators attest.

`LedgerRoles` asks the chain (ComputePool.isMember / isValidator) and remembers an answer for `ttl` seconds, so
a burst of requests costs one RPC per address; an ejected node is refused again within `ttl`. `StaticRoles` is
a fixed table, for the trainer's local mode, where the trainer starts the workers itself and trusts them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

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


@dataclass
class LedgerRoles:
    ledger: Ledger
    pool_id: int
    ttl: float = 10.0
    _cache: dict[tuple[str, str], tuple[float, bool]] = field(default_factory=dict)

    async def _ask(self, role: str, address: str) -> bool:
        now = time.monotonic()
        hit = self._cache.get((role, address))
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        check = self.ledger.is_member if role == "member" else self.ledger.is_validator
        answer = await asyncio.to_thread(check, self.pool_id, address)  # the Ledger client is synchronous
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[(role, address)] = (now, answer)
        return answer

    async def is_member(self, address: str) -> bool:
        return await self._ask("member", address)

    async def is_validator(self, address: str) -> bool:
        return await self._ask("validator", address)
