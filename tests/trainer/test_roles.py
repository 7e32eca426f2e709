"""Roles read from the chain: ComputePool membership and validators on a real anvil, with a short cache."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ledger.accounts import dev_account
from ledger.client import Ledger
from tests.ledger.helpers import make_pool, onboard
from trainer.roles import LedgerRoles


def test_members_and_validators_come_from_the_pool_and_ejection_shows_after_the_cache(
    ledger_for: Callable[[int], Ledger],
) -> None:
    owner, provider = ledger_for(0), ledger_for(1)
    pool_id = make_pool(owner)
    node = dev_account(3)  # a funded account: the node pays for its own join
    onboard(owner, provider, node, pool_id)
    validator = ledger_for(2).address
    owner.set_validator(pool_id, validator)
    roles = LedgerRoles(owner, pool_id, ttl=0.0)

    async def check() -> tuple[bool, bool, bool, bool]:
        return (
            await roles.is_member(node.address),
            await roles.is_member(validator),
            await roles.is_validator(validator),
            await roles.is_validator(node.address),
        )

    assert asyncio.run(check()) == (True, False, True, False)
    cached = LedgerRoles(owner, pool_id, ttl=3600.0)
    assert asyncio.run(cached.is_member(node.address)) is True
    owner.eject(pool_id, node.address)
    assert asyncio.run(cached.is_member(node.address)) is True  # within the ttl the answer is remembered
    assert asyncio.run(roles.is_member(node.address)) is False  # with ttl 0 every request asks the chain
