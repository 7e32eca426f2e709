"""JSON from strangers: deep nesting is refused before the C parser can overflow its stack."""

from __future__ import annotations

import asyncio
import sys

import eth_account  # noqa: F401  (its import raises the recursion limit: the condition every daemon runs under)
import pytest
from aiohttp import web

from core.safejson import TooDeepError, json_too_deep, loads_bounded
from ledger.accounts import dev_account
from protocol.coordinator.client import CoordinatorClient, CoordinatorUnavailable
from protocol.signing import SigningDomain
from shardcast.client import new_session

BOMB = b"[" * 200_000


def test_the_recursion_limit_is_what_makes_this_necessary() -> None:
    assert sys.getrecursionlimit() >= 100_000  # py_ecc's doing: json.loads(BOMB) would segfault, not raise


def test_depth_counts_brackets_outside_strings_only() -> None:
    assert not json_too_deep(b'{"a": [1, [2]]}', 3)
    assert json_too_deep(b'{"a": [1, [2]]}', 2)
    assert not json_too_deep(b'{"url": "[[[[[[\\"[[[[[", "b": 1}', 1)


def test_loads_bounded_parses_what_fits_and_refuses_a_bomb() -> None:
    assert loads_bounded('{"steps": [{"step": 1}]}', 3) == {"steps": [{"step": 1}]}
    with pytest.raises(TooDeepError, match="deeper than 3"):
        loads_bounded(BOMB, 3)
    with pytest.raises(ValueError):
        loads_bounded(b"{not json", 3)


def test_a_coordinator_answering_a_json_bomb_is_unavailable_and_the_worker_lives() -> None:
    async def bomb(_: web.Request) -> web.Response:
        return web.Response(body=BOMB[:60_000], content_type="application/json")

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/v1/step", bomb)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with new_session() as session:
                client = CoordinatorClient(session, url, dev_account(1), SigningDomain(31337, "0x" + "11" * 20))
                with pytest.raises(CoordinatorUnavailable, match="not a JSON object"):
                    await client.step()
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
