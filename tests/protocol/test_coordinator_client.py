"""The coordinator client against real aiohttp servers on loopback that misbehave: one that never answers costs a
caller its call's timeout and surfaces as `CoordinatorUnavailable` (retryable), never a hang; no more than the
client's `concurrency` calls are in flight at once; an answer that does not fit its schema is unavailable too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from eth_account import Account

from protocol.coordinator import routes
from protocol.coordinator.client import ClientLimits, CoordinatorClient, CoordinatorRefused, CoordinatorUnavailable
from protocol.signing import Attestation, SigningDomain
from shardcast.client import new_session

DOMAIN = SigningDomain(31337, "0x" + "11" * 20)
NODE = Account.from_key(b"\x31" * 32)
KEY = b"\x42" * 32
QUICK = ClientLimits(call_timeout=0.4, transfer_timeout=0.6, connect_timeout=0.4)


@asynccontextmanager
async def server(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """An aiohttp app answering every route with `handler`."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def calls(client: CoordinatorClient) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "step": client.step,
        "steps": client.steps,
        "request_task": client.request_task,
        "upload": lambda: client.upload(KEY, b"file"),
        "download": lambda: client.download(KEY, 100),
        "holds": lambda: client.holds(KEY),
        "attestations": lambda: client.attestations(KEY, 0),
        "attest": lambda: client.attest(Attestation(0, KEY, True, 0)),
    }


CALLS = ["step", "steps", "request_task", "upload", "download", "holds", "attestations", "attest"]


@pytest.mark.parametrize("call", CALLS)
def test_a_coordinator_that_never_answers_is_unavailable_within_the_timeout(call: str) -> None:
    async def scenario() -> None:
        never = asyncio.Event()

        async def silent(request: web.Request) -> web.Response:
            await never.wait()
            raise AssertionError("not reached")

        async with server(silent) as url, CoordinatorClient.connect(url, NODE, DOMAIN, pool_id=0, limits=QUICK) as c:
            started = time.monotonic()
            with pytest.raises(CoordinatorUnavailable, match="no answer within"):
                await calls(c)[call]()
            waited = time.monotonic() - started
            assert 0.3 < waited < 1.5  # the call's timeout (the file transfers' is 0.6 s), not a hang
            never.set()

    asyncio.run(scenario())


def test_a_session_without_a_timeout_passed_in_still_gets_the_clients() -> None:
    """The older form, on the relay's session (no timeout of its own): the client's timeouts still hold."""

    async def scenario() -> None:
        never = asyncio.Event()

        async def headers_then_nothing(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"st')  # a body begun and never finished
            await never.wait()
            return response

        async with server(headers_then_nothing) as url, new_session() as session:
            client = CoordinatorClient(session, url, NODE, DOMAIN, pool_id=0, limits=QUICK)
            started = time.monotonic()
            with pytest.raises(CoordinatorUnavailable):
                await client.step()
            assert time.monotonic() - started < 1.5
            never.set()

    asyncio.run(scenario())


def test_no_more_than_the_concurrency_bound_is_in_flight() -> None:
    async def scenario() -> None:
        in_flight, most = 0, 0

        async def slow(request: web.Request) -> web.Response:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.1)
            in_flight -= 1
            return web.json_response({"step": 5})

        limits = ClientLimits(concurrency=2)
        async with server(slow) as url, CoordinatorClient.connect(url, NODE, DOMAIN, limits=limits) as client:
            assert await asyncio.gather(*(client.step() for _ in range(8))) == [5] * 8
        assert most == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "answer",
    [{"step": True}, {"step": -1}, {"step": 2**64}, {"step": "5"}, {"steps": 5}, {}],
)
def test_an_answer_that_does_not_fit_its_schema_is_unavailable_and_names_the_field(answer: dict[str, object]) -> None:
    async def scenario() -> None:
        async def wrong(request: web.Request) -> web.Response:
            return web.json_response(answer)

        async with server(wrong) as url, CoordinatorClient.connect(url, NODE, DOMAIN, limits=QUICK) as client:
            with pytest.raises(CoordinatorUnavailable, match=r"StepInfo\.step"):
                await client.step()

    asyncio.run(scenario())


def test_an_assignment_for_another_node_or_out_of_range_is_unavailable() -> None:
    grant = {"pool_id": 0, "node": NODE.address, "step": 1, "counter": 0, "prompts": 8, "group_size": 8}

    async def scenario() -> None:
        answers = iter([grant | {"node": "0x" + "22" * 20}, grant | {"prompts": 0}, grant | {"counter": -1}, grant])

        async def handler(request: web.Request) -> web.Response:
            assert request.path == routes.TASKS and await request.read() == routes.TASK_REQUEST_BODY
            return web.json_response(next(answers))

        async with server(handler) as url, CoordinatorClient.connect(url, NODE, DOMAIN, pool_id=0) as client:
            for match in ("a task for 0x2222", r"TaskGrant\.prompts", r"TaskGrant\.counter"):
                with pytest.raises(CoordinatorUnavailable, match=match):
                    await client.request_task()
            job = await client.request_task()
            assert (job.node, job.step, job.prompts, job.signature) == (NODE.address, 1, 8, None)

    asyncio.run(scenario())


def test_a_refusal_keeps_its_code_and_a_busy_coordinator_its_retry_after() -> None:
    async def scenario() -> None:
        async def refuse(request: web.Request) -> web.Response:
            if request.method == "PUT":
                return web.json_response(
                    {"error": "quota", "message": "full"}, status=429, headers={"Retry-After": "7"}
                )
            return web.json_response({"error": "not_member", "message": "who?"}, status=403)

        async with server(refuse) as url, CoordinatorClient.connect(url, NODE, DOMAIN, pool_id=0) as client:
            with pytest.raises(CoordinatorRefused) as refused:
                await client.request_task()
            assert (refused.value.status, refused.value.code, refused.value.message) == (403, "not_member", "who?")
            with pytest.raises(CoordinatorUnavailable) as busy:
                await client.upload(KEY, b"file")
            assert (getattr(busy.value, "code", None), getattr(busy.value, "retry_after", None)) == ("quota", 7.0)

    asyncio.run(scenario())
