"""Uploads are parsed off the coordinator's event loop (issue 19, item 2), on a real aiohttp server on loopback.

Before, the upload route decoded the file on the event loop: a 3,981-byte Parquet bomb held every request for
5.9 s and took the coordinator to 1.3 GB. Now a child process parses it under a memory limit and a
timeout (trainer/parsing.py), and a parse that blows either is a refused upload, never a stalled or dead server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from eth_account import Account

from protocol.signing import SigningDomain, sign_request
from tests.protocol.test_parquet_bomb import bomb_bytes
from tests.trainer.test_api import rollout_bytes
from trainer.api import CoordinatorApi
from trainer.coordinator import ApiConfig, CoordinatorService, PoolState
from trainer.inbox import RolloutInbox
from trainer.parsing import ParseConfig, UploadParser
from trainer.roles import StaticRoles
from trainer.verdicts import VerdictStore

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
POOL = 4
WORKER = Account.from_key(b"\x11" * 32)  # the worker of tests/trainer/test_api.py, whose `rollout_bytes` it signs
TRAINER = Account.from_key(b"\x14" * 32)


def wrapped_parser(tmp_path: Path, first: str, config: ParseConfig) -> UploadParser:
    """A parser whose children run the real one, except that the first file any of them is given makes it
    `first`: "wait" (touch `parsing`, then parse after `go` appears), "hang" or "crash"."""
    code = f"""
import os, pathlib, time
import trainer.parsing as parsing
real, tmp = parsing.inspect_rollouts, pathlib.Path({str(tmp_path)!r})
def first_time(*args, **kwargs):
    if not (tmp / "seen").exists():
        (tmp / "seen").touch()
        if {first!r} == "crash":
            os._exit(3)
        (tmp / "parsing").touch()
        while {first!r} == "hang" or not (tmp / "go").exists():
            time.sleep(0.01)
    return real(*args, **kwargs)
parsing.inspect_rollouts = first_time
parsing.main()
"""
    return UploadParser(config, command=[sys.executable, "-c", code])


async def put(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, dict[str, Any]]:
    path = f"/v1/rollouts/{hashlib.sha256(data).hexdigest()}"
    headers = sign_request(WORKER, DOMAIN, "PUT", path, data, pool_id=POOL, host=urllib.parse.urlsplit(url).netloc)
    async with session.put(url + path, data=data, headers=headers) as response:
        return response.status, json.loads(await response.read())


def serve(
    tmp_path: Path,
    scenario: Callable[[str, CoordinatorApi], Awaitable[None]],
    parser: Callable[[], UploadParser] | None = None,
) -> None:
    async def main() -> None:
        service = CoordinatorService(
            domain=DOMAIN,
            state=PoolState(pool_id=POOL, trainer=TRAINER.address),
            roles=StaticRoles(members=frozenset({WORKER.address}), validators=frozenset()),
            inbox=RolloutInbox(tmp_path / "inbox"),
            verdicts=VerdictStore(),
            config=ApiConfig(),
            signer=TRAINER,
        )
        if parser is not None:
            service.parser = parser()
        api = CoordinatorApi(service)
        runner = web.AppRunner(api.app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            await scenario(f"http://127.0.0.1:{runner.addresses[-1][1]}", api)
        finally:
            await runner.cleanup()  # ends the parsing processes

    asyncio.run(main())


def test_a_bomb_upload_is_refused_and_other_clients_are_answered_while_it_is_parsed(tmp_path: Path) -> None:
    bomb = bomb_bytes(10**8, node=WORKER.address, pool_id=POOL)

    async def scenario(url: str, api: CoordinatorApi) -> None:
        async with aiohttp.ClientSession() as worker, aiohttp.ClientSession() as other:
            upload = asyncio.create_task(put(worker, url, bomb))
            while not (tmp_path / "parsing").exists():  # the child has the bomb
                assert not upload.done(), upload.result()  # an upload answered before any child parsed it
                await asyncio.sleep(0.01)
            async with other.get(url + "/v1/step") as response:
                assert response.status == 200 and await response.json() == {"step": 0}
            assert not upload.done()  # answered while the bomb was being parsed, not after
            (tmp_path / "go").touch()
            status, body = await upload
        assert (status, body["error"]) == (422, "malformed_file")
        assert "too_many_tokens" in body["message"] and "100000000" in body["message"], body

    serve(tmp_path, scenario, lambda: wrapped_parser(tmp_path, "wait", ParseConfig(workers=1)))
    assert RolloutInbox(tmp_path / "inbox").uploads() == []


def test_the_bomb_is_refused_by_the_default_parser_and_an_honest_file_still_stored(tmp_path: Path) -> None:
    bomb, honest = bomb_bytes(10**8, node=WORKER.address, pool_id=POOL), rollout_bytes()

    async def scenario(url: str, api: CoordinatorApi) -> None:
        async with aiohttp.ClientSession() as session:
            status, body = await put(session, url, bomb)
            assert (status, body["error"]) == (422, "malformed_file") and "too_many_tokens" in body["message"]
            assert (await put(session, url, honest))[0] == 201

    serve(tmp_path, scenario)
    assert RolloutInbox(tmp_path / "inbox").uploads() == [hashlib.sha256(honest).digest()]


def test_a_parse_over_its_memory_limit_is_refused_and_the_next_file_parsed_by_a_fresh_process(tmp_path: Path) -> None:
    values = (1 << 25) - 16  # within max_tokens and, padded, within the values a byte: only memory stops it
    big = bomb_bytes(values, node=WORKER.address, pool_id=POOL, padding=values // 100)
    honest = rollout_bytes()

    async def scenario(url: str, api: CoordinatorApi) -> None:
        async with aiohttp.ClientSession() as session:
            status, body = await put(session, url, big)
            assert (status, body["error"]) == (413, "too_large"), body
            assert "memory limit" in body["message"]
            assert (await put(session, url, honest))[0] == 201

    serve(tmp_path, scenario, lambda: UploadParser(ParseConfig(workers=1, memory_bytes=768 << 20)))
    assert RolloutInbox(tmp_path / "inbox").uploads() == [hashlib.sha256(honest).digest()]


@pytest.mark.parametrize(("first", "code"), [("hang", "parse_timeout"), ("crash", "parser_died")])
def test_a_parse_that_hangs_or_crashes_is_refused_and_its_process_replaced(
    tmp_path: Path, first: str, code: str
) -> None:
    stuck, honest = rollout_bytes(rows=6), rollout_bytes()

    async def scenario(url: str, api: CoordinatorApi) -> None:
        async with aiohttp.ClientSession() as session:
            status, body = await put(session, url, stuck)
            assert (status, body["error"]) == (422, code), body
            assert (await put(session, url, honest))[0] == 201

    config = ParseConfig(workers=1, timeout=2.0)
    serve(tmp_path, scenario, lambda: wrapped_parser(tmp_path, first, config))
    assert RolloutInbox(tmp_path / "inbox").uploads() == [hashlib.sha256(honest).digest()]
