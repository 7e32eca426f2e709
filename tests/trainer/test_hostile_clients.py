"""Issue 32, attacks 3 to 5: strangers and members that would exhaust the coordinator's memory, descriptors or nonce
cache, played against the real server on loopback (the API in this process, or in a process of its own under a
descriptor limit, `tests.loopback_coordinator.coordinator_process`)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from core.serving import ConnectionLimits
from protocol.signing import HEADER_BODY_HASH, NonceCache, sign_request
from tests.loopback_coordinator import coordinator_process
from tests.trainer.test_api import (
    DOMAIN,
    POOL,
    TRAINER,
    VALIDATOR,
    WORKER,
    Client,
    rollout_bytes,
    run,
    signed_attestation,
    upload_path,
)
from trainer.api import CoordinatorApi

MIB = 1024 * 1024


async def _answer_without_sending_the_body(url: str, path: str, size: int) -> bytes:
    """The raw answer to headers that declare a `size`-byte body, none of which is sent."""
    host = url.removeprefix("http://")
    address, port = host.split(":")
    reader, writer = await asyncio.open_connection(address, int(port))
    writer.write(f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {size}\r\n\r\n".encode())
    await writer.drain()
    try:
        async with asyncio.timeout(5):
            return await reader.read(4096)
    except TimeoutError:
        return b"(no answer within 5 s)"
    finally:
        writer.close()


def test_an_unsigned_upload_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    """Attack 3: ten unsigned connections that sent 60 MiB - 1 byte and held took the coordinator from 110 to 710 MiB:
    it read each body before the signature. Now the answer comes on the headers alone."""

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        answer = await _answer_without_sending_the_body(client.url, upload_path(b"x" * 10), 60 * MIB - 1)
        assert answer.startswith(b"HTTP/1.1 401"), answer
        assert b"missing_header" in answer and b"Connection: close" in answer

    run(tmp_path, scenario)


def test_a_signed_body_that_is_not_the_one_declared_is_refused_and_keeps_no_nonce(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        host = client.url.removeprefix("http://")
        signed = sign_request(WORKER, DOMAIN, "POST", "/v1/tasks", b"{}", pool_id=POOL, host=host)
        assert signed[HEADER_BODY_HASH] == hashlib.sha256(b"{}").hexdigest()
        async with client.session.post(client.url + "/v1/tasks", data=b'{"other": 1}', headers=signed) as r:
            refused = (r.status, (await r.json())["error"])
        assert refused == (400, "body_mismatch")
        assert len(api.nonces) == 0

    run(tmp_path, scenario)


def test_a_member_body_slower_than_its_deadline_is_refused_and_its_nonce_given_back(tmp_path: Path) -> None:
    """Attack 3's slow bodies: a body must arrive within `body_grace` plus its size at `min_body_rate`."""
    data = rollout_bytes()

    path = upload_path(data)

    async def trickle() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 256):
            yield data[i : i + 256]
            await asyncio.sleep(0.05)

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        host = client.url.removeprefix("http://")
        signed = sign_request(WORKER, DOMAIN, "PUT", path, data, pool_id=POOL, host=host)
        signed["Content-Length"] = str(len(data))
        async with asyncio.timeout(20), client.session.put(client.url + path, data=trickle(), headers=signed) as r:
            slow = (r.status, (await r.json())["error"])
        assert slow == (408, "body_timeout")
        assert len(api.nonces) == 0
        fast = await client.send("PUT", path, data)
        assert fast.status == 201, fast.body

    run(tmp_path, scenario, connections=ConnectionLimits(body_grace=0.5, min_body_rate=1e9))


@pytest.mark.slow
def test_idle_connections_cannot_take_the_descriptors_members_upload_through(tmp_path: Path) -> None:
    """Attack 4: with the server at a 400-descriptor limit, 490 idle connections made 5 of 5 member uploads time out
    and the server logged 469,720 "too many open files" tracebacks in about 25 s."""
    files = [rollout_bytes(rows=4 + i) for i in range(5)]
    with coordinator_process(
        tmp_path / "coordinator",
        DOMAIN,
        trainer=TRAINER,
        members=[WORKER.address],
        validator=VALIDATOR.address,
        pool_id=POOL,
        nofile=400,
        connections={"header_timeout": 3.0},
    ) as server:
        host, port = server.url.removeprefix("http://").split(":")
        idle = []
        for _ in range(490):  # from another loopback address, as a stranger's machine
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.settimeout(5)
            try:
                sock.connect((host, int(port)))
            except OSError:
                sock.close()
                continue
            idle.append(sock)

        async def uploads() -> list[tuple[int, float]]:
            answers = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
                client = Client(session, server.url)
                for data in files:
                    started = time.monotonic()
                    reply = await client.send("PUT", upload_path(data), data)
                    answers.append((reply.status, time.monotonic() - started))
            return answers

        answers = asyncio.run(uploads())
        assert [status for status, _ in answers] == [201] * 5, answers
        time.sleep(4)  # past the header timeout: the server has closed every idle connection
        still_open = 0
        for sock in idle:
            with sock:
                try:
                    answer = sock.recv(1)  # b"": closed by the server
                except ConnectionResetError:  # closed by the server at once (over a limit)
                    answer = b""
                except TimeoutError:  # still held
                    answer = b"held"
                still_open += answer != b""
        lines = server.log_lines()
    assert still_open == 0
    assert len(lines) < 50, lines[:20]  # one line per refused cause per interval, not one traceback per connection
    assert not any("Traceback" in line for line in lines), lines[:20]


def test_a_member_flooding_nonces_cannot_make_a_validator_wait_and_refused_requests_keep_none(tmp_path: Path) -> None:
    """Attack 5: every signed request recorded a nonce, even one refused with 422; four member keys kept the shared
    cache full and validators got `503 nonce_cache_full`. Here the cache holds 50, and one member sends 60 refused
    uploads and then 60 accepted requests."""

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        api.nonces = NonceCache(max_skew=api.nonces.max_skew, max_entries=50)
        for i in range(60):
            junk = b"not parquet %d" % i
            refused = await client.send("PUT", upload_path(junk), junk)
            assert (refused.status, refused.body["error"]) == (422, "malformed_file"), refused.body
        assert len(api.nonces) == 0  # a refused request consumes no nonce
        start = int(time.time()) - 120
        for i in range(60):  # signed over the last two minutes (a second apart), as a member at its pace does
            asked = await client.send("POST", "/v1/tasks", b"{}", now=start + 2 * i)
            assert asked.status == 200, asked.body  # never `nonce_cache_full`: it pushes out its own oldest
        verdict = signed_attestation(VALIDATOR, b"\x11" * 32, True, 0)
        validator = await client.send("POST", "/v1/attestations", verdict, signer=VALIDATOR)
        assert validator.status == 201, validator.body
        assert len(api.nonces) <= 50

    run(tmp_path, scenario, requests_per_signer_per_s=1000.0, signer_burst=1000)
