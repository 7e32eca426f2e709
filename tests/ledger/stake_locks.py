"""A node's stake lock as the ledger tests check it: unlocked when the node leaves its pool (or is ejected), then
released to its provider, who may unbond it."""

from __future__ import annotations

from typing import Any

from ledger.client import Ledger
from tests.conftest import TOKEN  # not `conftest`: a test folder with its own conftest.py shadows that name


def stake_unlocked(
    provider: Ledger, node: Ledger, pool_id: int, release_at: int, amount: int = 100 * TOKEN
) -> list[dict[str, Any]]:
    """The StakeUnlocked event of `node` leaving `pool_id` (or ejected from it), as `events` returns it: its
    provider's `amount` stays locked until `release_at`."""
    return [
        {
            "provider": provider.address,
            "node": node.address,
            "poolId": pool_id,
            "amount": amount,
            "releaseAt": release_at,
        }
    ]


def assert_unbonds_once_released(owner: Ledger, provider: Ledger, amount: int = 100 * TOKEN) -> None:
    """`provider` has no stake locked any more, and can start unbonding `amount`."""
    assert owner.stake_of(provider.address).locked == 0
    provider.request_unstake(amount)
    assert owner.stake_of(provider.address).unbonding == amount
