"""Issue 19, attack 3: strangers lock members out. Before, a stranger's nonce was recorded after the signature check
but before the role check, into the one cache members' nonces go to: 500 requests from random non-member keys filled
a 500-entry cache and the member and the validator then got `503 nonce_cache_full`. And every fresh address cost
one chain lookup, without bound."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from eth_account import Account

from ledger.client import Ledger
from protocol.signing import NonceCache
from tests.ledger.helpers import make_pool, onboard
from tests.trainer.test_api import POOL, STRANGER, VALIDATOR, WORKER, Client, run
from trainer.api import CoordinatorApi
from trainer.roles import LedgerRoles, RoleLookupBusy


def test_a_flood_of_strangers_keys_cannot_lock_a_member_or_a_validator_out(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        api.nonces = NonceCache(max_skew=api.nonces.max_skew, max_entries=50)
        for _ in range(120):  # each a fresh key: signed correctly, holding no role
            refused = await client.send("POST", "/v1/tasks", b"{}", signer=Account.create())
            assert (refused.status, refused.body["error"]) == (403, "not_member")
        assert len(api.nonces) == 0  # nothing of theirs was kept
        member = await client.send("POST", "/v1/tasks", b"{}")
        assert member.status == 200, member.body
        verdict = b'{"work_key": "0x' + b"11" * 32 + b'", "accepted": true, "reason": 0}'
        validator = await client.send("POST", "/v1/attestations", verdict, signer=VALIDATOR)
        assert validator.status != 503 and validator.body.get("error") != "nonce_cache_full", validator.body

    run(tmp_path, scenario)


def test_one_signer_over_its_rate_is_told_to_wait_and_others_are_served(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        answers = [await client.send("POST", "/v1/tasks", b"{}", signer=STRANGER) for _ in range(4)]
        assert [a.status for a in answers] == [403, 403, 403, 429]
        assert answers[-1].body["error"] == "rate_limited"
        assert (await client.send("POST", "/v1/tasks", b"{}")).status == 200  # the member has its own budget

    run(tmp_path, scenario, requests_per_signer_per_s=0.01, signer_burst=3)


def test_one_address_over_its_rate_is_told_to_wait_whatever_it_forwards_and_other_addresses_are_served(
    tmp_path: Path,
) -> None:
    """The per-address bucket is keyed by the connection's address: neither a fresh key for each request nor a
    forwarding header buys another turn; a client on another address has its own budget; the bucket refills."""

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        flood = []
        for i in range(7):  # each a fresh key, and each claiming to forward for another address
            forwarded = {"X-Forwarded-For": f"10.0.0.{i}", "X-Real-IP": f"10.0.0.{i}", "Forwarded": f"for=10.0.0.{i}"}
            flood.append(await client.send("POST", "/v1/tasks", b"{}", signer=Account.create(), headers=forwarded))
        assert [a.status for a in flood] == [403] * 5 + [429] * 2
        assert flood[-1].body["error"] == "rate_limited" and "address 127.0.0.1" in flood[-1].body["message"]
        assert (await client.send("POST", "/v1/tasks", b"{}")).status == 429  # the member's own key, same address
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))  # Linux routes all of 127/8 to loopback
        async with aiohttp.ClientSession(connector=connector) as session:
            elsewhere = Client(session, client.url)
            assert [(await elsewhere.send("POST", "/v1/tasks", b"{}")).status for _ in range(4)] == [200] * 4
        await asyncio.sleep(1.2)  # one token a second
        assert (await client.send("POST", "/v1/tasks", b"{}")).status == 200

    run(tmp_path, scenario, requests_per_address_per_s=1.0, address_burst=5)


def test_role_lookups_of_unknown_addresses_share_a_budget_and_members_stay_cached(
    ledger_for: Callable[[int], Ledger],
) -> None:
    owner = ledger_for(0)
    pool_id = make_pool(owner)
    member = Account.create()
    owner.w3.provider.make_request("anvil_setBalance", [member.address, hex(10**20)])  # type: ignore[arg-type]
    onboard(owner, ledger_for(1), member, pool_id)
    roles = LedgerRoles(owner, pool_id, lookups_per_s=0.01, lookup_burst=5)

    async def scenario() -> None:
        assert await roles.is_member(member.address)  # one lookup, then cached
        for _ in range(4):
            assert not await roles.is_member(Account.create().address)
        with pytest.raises(RoleLookupBusy):
            await roles.is_member(Account.create().address)  # the budget is spent: no sixth chain call
        assert await roles.is_member(member.address)  # a cached member is still served

    asyncio.run(scenario())
    assert POOL and WORKER  # the coordinator fixtures of test_api, reused above
