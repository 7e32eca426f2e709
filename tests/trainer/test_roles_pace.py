"""Issue 22: a member asking at a GPU worker's pace (twice a file, a file every 30 s) is looked up on chain once a
minute, not at every request: with the 10 s cache it had, 1,000 such members cost one web3 call a request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import trainer.roles
from trainer.roles import LedgerRoles

NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"


class CountingLedger:
    def __init__(self) -> None:
        self.calls = 0

    def is_member(self, pool_id: int, address: str) -> bool:
        self.calls += 1
        return True


def test_a_member_at_a_gpu_workers_pace_is_looked_up_once_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(trainer.roles.time, "monotonic", lambda: clock[0])
    ledger: Any = CountingLedger()
    roles = LedgerRoles(ledger, pool_id=1)

    async def requests() -> None:
        for _ in range(8):  # a task and an upload every 30 s, for two minutes
            assert await roles.is_member(NODE)
            clock[0] += 15.0

    asyncio.run(requests())
    assert ledger.calls == 2
