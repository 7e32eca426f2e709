"""Issue 19, item 10: one member cannot fill the coordinator's disk. Before, a member could store any number of
files (each up to the size limit); now what the coordinator holds for a node that the trainer may still train on
is bounded in files and bytes. Past it an upload is refused with 429 `quota` before it is parsed or stored, room
comes back as the steps the files came at leave the window, a restart counts the inbox again, and a worker keeps
a refused file in its journal and uploads it later."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from eth_account import Account

from ledger.client import Ledger
from ledger.types import BatchStatus
from node.config import WorkerSettings
from node.daemon.chain import LedgerWorkChain
from node.daemon.worker import WorkerDaemon
from protocol.coordinator.client import CoordinatorBusy, CoordinatorClient, CoordinatorUnavailable
from protocol.coordinator.pool import PublishedStep
from protocol.signing import sign_request
from protocol.terms import step_window
from tests.ledger.helpers import make_pool, onboard
from tests.network_trainer import TASK as DEFAULT_TASK
from tests.trainer.test_api import DOMAIN, POOL, TRAINER, WORKER, Client, rollout_bytes, upload_path
from trainer.api import CoordinatorApi
from trainer.config import TrainerConfigError, load_run_config
from trainer.coordinator import ApiConfig, CoordinatorService, PoolState
from trainer.inbox import RolloutInbox, UploadQuota
from trainer.roles import StaticRoles
from trainer.verdicts import VerdictStore

OTHER = Account.from_key(b"\x15" * 32)  # a second member
NETWORK = "[run]\ndir='r'\nmodel='m'\ntask='t'\n[pool]\nid=1\ndeployment='d.json'\n"


def coordinator(tmp_path: Path, state: PoolState | None = None, **config: Any) -> CoordinatorApi:
    service = CoordinatorService(
        domain=DOMAIN,
        state=state or PoolState(pool_id=POOL, trainer=TRAINER.address),
        roles=StaticRoles(members=frozenset({WORKER.address, OTHER.address})),
        inbox=RolloutInbox(tmp_path / "inbox"),
        verdicts=VerdictStore(),
        config=ApiConfig(**config),
        signer=TRAINER,
    )
    return CoordinatorApi(service)


@asynccontextmanager
async def serving(api: CoordinatorApi) -> AsyncIterator[Client]:
    runner = web.AppRunner(api.app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Client(session, f"http://127.0.0.1:{runner.addresses[-1][1]}")
    finally:
        await runner.cleanup()


def key(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def files(n: int, node: str = WORKER.address) -> list[bytes]:
    """`n` different well-formed files of `node`, about 3.4 KB each."""
    return [rollout_bytes(node=node, proof_bytes=300 + i) for i in range(n)]


def test_a_member_past_its_quota_is_refused_before_anything_is_stored_and_others_are_served(tmp_path: Path) -> None:
    first, second, third = files(3)
    other = rollout_bytes(node=OTHER.address)

    async def main() -> None:
        async with serving(coordinator(tmp_path, max_stored_files_per_node=2)) as client:
            for data in (first, second):
                assert (await client.send("PUT", upload_path(data), data)).status == 201
            refused = await client.send("PUT", upload_path(third), third)
            assert (refused.status, refused.body["error"]) == (429, "quota"), refused.body
            assert "2 files" in refused.body["message"]
            again = await client.send("PUT", upload_path(first), first)  # stores nothing: never refused
            assert (again.status, again.body["created"]) == (200, False) and "receipt" in again.body
            assert (await client.send("PUT", upload_path(other), other, signer=OTHER)).status == 201  # its own quota

    asyncio.run(main())
    assert set(RolloutInbox(tmp_path / "inbox").uploads()) == {key(first), key(second), key(other)}
    assert not list((tmp_path / "inbox").glob(f"{key(third).hex()}*"))  # neither its bytes nor a record of it


def test_bytes_past_the_quota_are_counted_as_read_not_as_declared(tmp_path: Path) -> None:
    small, large = rollout_bytes(proof_bytes=258), rollout_bytes(proof_bytes=11000)
    limit = 48 * 1024
    assert len(large) <= limit < len(small) + len(large)  # either alone fits, both do not
    state = PoolState(pool_id=POOL, trainer=TRAINER.address)

    async def chunked(client: Client, data: bytes) -> int:
        """A PUT with no Content-Length: the coordinator learns the size by reading the body."""
        path = upload_path(data)
        host = client.url.removeprefix("http://")
        headers = sign_request(WORKER, DOMAIN, "PUT", path, data, pool_id=POOL, host=host)

        async def pieces() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 4096):
                yield data[start : start + 4096]

        async with client.session.put(client.url + path, data=pieces(), headers=headers) as response:
            assert response.request_info.headers.get("Transfer-Encoding") == "chunked"
            body = await response.json()
            assert response.status != 429 or body["error"] == "quota", body
            return response.status

    async def main() -> None:
        api = coordinator(tmp_path, state, max_upload_bytes=limit, max_stored_bytes_per_node=limit, async_level=0)
        async with serving(api) as client:
            assert (await client.send("PUT", upload_path(small), small)).status == 201
            assert await chunked(client, large) == 429
            state.publish(1, time.time())  # with k = 0 the small file can no longer be trained on
            assert await chunked(client, large) == 201

    asyncio.run(main())


def test_parallel_uploads_cannot_race_past_the_quota(tmp_path: Path) -> None:
    many = files(8)

    async def main() -> None:
        async with serving(coordinator(tmp_path, max_stored_files_per_node=2)) as client:
            answers = await asyncio.gather(*(client.send("PUT", upload_path(data), data) for data in many))
            assert sorted(a.status for a in answers) == [201, 201] + [429] * 6, [a.body for a in answers]

    asyncio.run(main())
    assert len(RolloutInbox(tmp_path / "inbox").uploads()) == 2


def test_a_refused_upload_gives_its_room_back(tmp_path: Path) -> None:
    wrong = [rollout_bytes(pool=POOL + 1, proof_bytes=300 + i) for i in range(3)]
    [good] = files(1)

    async def main() -> None:
        async with serving(coordinator(tmp_path, max_stored_files_per_node=1)) as client:
            for data in wrong:  # each held room while it was parsed, then gave it back
                refused = await client.send("PUT", upload_path(data), data)
                assert (refused.status, refused.body["error"]) == (422, "wrong_pool")
            assert (await client.send("PUT", upload_path(good), good)).status == 201

    asyncio.run(main())


def test_room_comes_back_once_the_step_a_file_came_at_leaves_the_window(tmp_path: Path) -> None:
    first, second = files(2)
    state = PoolState(pool_id=POOL, trainer=TRAINER.address)

    async def main() -> None:
        async with serving(coordinator(tmp_path, state, max_stored_files_per_node=1, async_level=1)) as client:
            assert (await client.send("PUT", upload_path(first), first)).status == 201
            assert (await client.send("PUT", upload_path(second), second)).status == 429
            state.publish(1, time.time())  # step 1 may still train on a file of step 0 (k = 1)
            assert (await client.send("PUT", upload_path(second), second)).status == 429
            state.publish(2, time.time())
            assert (await client.send("PUT", upload_path(second), second)).status == 201

    asyncio.run(main())


def test_a_restarted_coordinator_counts_what_its_inbox_holds(tmp_path: Path) -> None:
    first, second, third, fourth, fifth = files(5)
    history = [PublishedStep(0, time.time() - 60)]

    def restarted(step: int) -> CoordinatorApi:
        """A coordinator started afresh on the inbox, at `step`, with the steps published so far."""
        state = PoolState(pool_id=POOL, trainer=TRAINER.address, step=step)
        state.remember(history)
        return coordinator(tmp_path, state, max_stored_files_per_node=2, async_level=1)

    async def upload(client: Client, data: bytes) -> int:
        return (await client.send("PUT", upload_path(data), data)).status

    async def main() -> None:
        async with serving(restarted(0)) as client:
            assert [await upload(client, first), await upload(client, second)] == [201, 201]
        async with serving(restarted(0)) as client:
            assert await upload(client, third) == 429
        time.sleep(0.2)  # the two files were written at step 0, a while before step 1 was published
        history.append(PublishedStep(1, time.time()))
        api = restarted(1)
        async with serving(api) as client:
            assert await upload(client, third) == 429  # step 1 may still train on them
            at = time.time()
            api.service.state.publish(2, at)
            assert await upload(client, third) == 201  # they were counted under step 0, and it left the window
        history.append(PublishedStep(2, at))
        async with serving(restarted(2)) as client:  # holds the third (step 2), no longer the first two
            assert [await upload(client, fourth), await upload(client, fifth)] == [201, 429]

    asyncio.run(main())


def test_a_quota_refusal_reaches_the_client_as_try_later(tmp_path: Path) -> None:
    first, second = files(2)

    async def main() -> None:
        async with serving(coordinator(tmp_path, max_stored_files_per_node=1, retry_after=7.0)) as client:
            worker = CoordinatorClient(client.session, client.url, WORKER, DOMAIN, pool_id=POOL)
            assert (await worker.upload(key(first), first)).created
            with pytest.raises(CoordinatorBusy) as busy:
                await worker.upload(key(second), second)
            assert isinstance(busy.value, CoordinatorUnavailable)  # retried, unlike a CoordinatorRefused
            assert (busy.value.code, busy.value.retry_after) == ("quota", 7.0)

    asyncio.run(main())


def test_a_worker_over_its_quota_keeps_the_file_and_uploads_it_once_room_comes_back(
    tmp_path: Path, ledger_for: Callable[[int], Ledger]
) -> None:
    owner = ledger_for(0)
    pool_id = make_pool(owner)
    member = Account.create()
    owner.w3.provider.make_request("anvil_setBalance", [member.address, hex(10**20)])  # type: ignore[arg-type]
    node_ledger = onboard(owner, ledger_for(1), member, pool_id)
    state = PoolState(pool_id=pool_id, trainer=TRAINER.address)
    api = CoordinatorApi(
        CoordinatorService(
            domain=DOMAIN,
            state=state,
            roles=StaticRoles(members=frozenset({member.address})),
            inbox=RolloutInbox(tmp_path / "inbox"),
            verdicts=VerdictStore(),
            config=ApiConfig(max_stored_files_per_node=1, async_level=1),
        )
    )
    first, second = (rollout_bytes(node=member.address, pool=pool_id, proof_bytes=300 + i) for i in range(2))

    async def main() -> None:
        async with serving(api) as client:
            settings = WorkerSettings(
                state=tmp_path / "worker", coordinator=client.url, checkpoints=(client.url,),
                task=DEFAULT_TASK,  # read for its precision; nothing is generated
            )  # fmt: skip
            pool = settings.resolve(node_ledger.pool(pool_id))
            daemon = WorkerDaemon(settings, pool, LedgerWorkChain(node_ledger), member)
            for counter, data in enumerate((first, second)):  # two files generated, waiting in the journal
                daemon.state.path_of(key(data)).write_bytes(data)
                daemon.state.add(key(data), step=0, counter=counter, units=12)
            coordinator = CoordinatorClient(client.session, client.url, member, DOMAIN, pool_id=pool_id)

            def stages() -> dict[bytes, str]:
                return {record.work_key: record.stage for record in daemon.state.all()}

            await daemon.flush(coordinator, force=True)  # the second is refused: the first is submitted anyway
            assert stages() == {key(first): "submitted", key(second): "written"}
            assert daemon.state.path_of(key(second)).read_bytes() == second
            state.publish(1, time.time())
            state.publish(2, time.time())  # the first file's step has left the window (k = 1)
            await daemon.flush(coordinator, force=True)
            assert stages() == {key(first): "submitted", key(second): "submitted"}
            roots.extend(record.root for record in daemon.state.all())

    roots: list[bytes | None] = []
    asyncio.run(main())
    assert api.service.inbox.has(key(second))
    assert len(set(roots)) == 2  # each file in a batch of its own: the second was not uploaded with the first
    for root in roots:
        assert root is not None
        assert node_ledger.get_batch(pool_id, member.address, root).status == BatchStatus.PENDING


def test_a_node_at_the_pools_pace_stays_far_below_the_default_quota(tmp_path: Path) -> None:
    """The defaults against the busiest honest node: every assignment of every step, each file at the size limit."""
    path = tmp_path / "trainer.toml"
    path.write_text(NETWORK)
    api = load_run_config(path).api
    assert (api.files_per_node_per_step, api.async_level) == (6, 2)  # the pool's default window (protocol.terms)
    assert (api.max_stored_files_per_node, api.max_stored_bytes_per_node) == (96, 48 * api.max_upload_bytes)
    quota = UploadQuota(api.max_stored_bytes_per_node, api.max_stored_files_per_node)
    most = (0, 0)
    for step in range(100):
        oldest = step_window(step, api.async_level).oldest
        for _ in range(2 * api.files_per_node_per_step if step == 50 else api.files_per_node_per_step):
            quota.reserve(WORKER.address, api.max_upload_bytes, oldest).keep(step)  # step 50: two steps' files
        most = max(most, quota.usage(WORKER.address, oldest))
    assert most == (24, 24 * api.max_upload_bytes)  # a quarter of the files and half of the bytes
    path.write_text(NETWORK + "[coordinator]\nmax_stored_bytes_per_node = 65536\n")
    with pytest.raises(TrainerConfigError, match=r"max_stored_bytes_per_node .* at least max_upload_bytes") as caught:
        load_run_config(path)
    assert str(caught.value).startswith(f"{path}: ")
