"""Issue 37: a batch's leaf list made available through the coordinator, on a real aiohttp server. A list is stored
only when its leaves hash to the root its path names and every file it names is held, and is then receipted by the
trainer for whoever sent it; every malformed list has its own refusal and leaves nothing behind; a list lost after
its receipt answers 410, one never stored 404; and a client refuses a served list that is not the root's, as the
coordinator's failure."""

from __future__ import annotations

import asyncio
import hashlib
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from eth_account import Account

from ledger.merkle import BatchTree, Leaf
from protocol.batches import LEAF_BYTES, MAX_BATCH_BYTES, MEDIA_TYPE, encode_leaves
from protocol.coordinator import routes
from protocol.coordinator.client import (
    CoordinatorBusy,
    CoordinatorClient,
    CoordinatorLostFile,
    CoordinatorRefused,
    CoordinatorUnavailable,
)
from protocol.signing import BatchReceipt, recover, sign_request
from tests.loopback_coordinator import coordinator_service, serving
from tests.trainer.test_api import DOMAIN, POOL, STRANGER, TRAINER, VALIDATOR, WORKER, Client, rollout_bytes
from trainer.api import CoordinatorApi
from trainer.coordinator import ApiConfig

OTHER = Account.from_key(b"\x15" * 32)  # a second member


def held_key(n: int) -> bytes:
    return hashlib.sha256(b"held file %d" % n).digest()


def listed(*numbers: int, units: int = 100) -> tuple[Leaf, ...]:
    return tuple(Leaf(held_key(n), units + n) for n in numbers)


def hold(api: CoordinatorApi, *numbers: int) -> None:
    """Files the coordinator holds, as an upload leaves them (their parsing is tests/trainer/test_api.py's)."""
    for n in numbers:
        api.service.inbox.put(held_key(n), b"held file %d" % n, WORKER.address)


def stored_lists(tmp_path: Path) -> list[str]:
    """Every file the coordinator keeps for leaf lists: the lists and the records of their uploaders."""
    return sorted(path.name for path in (tmp_path / "inbox" / "batches").iterdir())


Scenario = Callable[[Client, CoordinatorApi], Awaitable[None]]


def run(tmp_path: Path, scenario: Scenario, *, signed: bool = True, **config: Any) -> None:
    async def main() -> None:
        service = coordinator_service(
            tmp_path,
            DOMAIN,
            trainer=TRAINER,
            worker=WORKER.address,
            members=[OTHER.address],
            validator=VALIDATOR.address,
            pool_id=POOL,
            config=ApiConfig(**config),
        )
        if not signed:
            service.signer = None
        async with serving(service) as (api, url), aiohttp.ClientSession() as session:
            await scenario(Client(session, url), api)

    asyncio.run(main())


def receipted_for(receipt: bytes | None, root: bytes, node: str, count: int) -> str | None:
    assert receipt is not None
    return recover(BatchReceipt(POOL, root, node, count), receipt, DOMAIN)


def test_a_leaf_list_of_uploaded_files_is_stored_receipted_and_read_back_by_a_validator(tmp_path: Path) -> None:
    files = [rollout_bytes(proof_bytes=300 + i) for i in range(3)]
    leaves = tuple(Leaf(hashlib.sha256(data).digest(), 12 + i) for i, data in enumerate(files))
    root = BatchTree(leaves).root

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        worker = CoordinatorClient(client.session, client.url, WORKER, DOMAIN)
        validator = CoordinatorClient(client.session, client.url, VALIDATOR, DOMAIN)
        for data in files:
            assert (await worker.upload(hashlib.sha256(data).digest(), data)).created
        upload = await worker.upload_batch(leaves)
        assert (upload.root, upload.count, upload.created) == (root, 3, True)
        assert upload.receipt_signer(POOL, WORKER.address, DOMAIN) == TRAINER.address
        assert upload.receipt_signer(POOL, OTHER.address, DOMAIN) != TRAINER.address  # the node is signed for
        assert upload.receipt_signer(POOL + 1, WORKER.address, DOMAIN) != TRAINER.address
        assert await validator.download_batch(root) == leaves
        async with client.session.get(client.url + routes.batch(root)) as response:
            assert response.status == 200 and response.content_type == MEDIA_TYPE
            assert await response.read() == encode_leaves(leaves)
        assert "coordinator_batches_total 1" in await (await client.session.get(client.url + "/metrics")).text()

    run(tmp_path, scenario)


def test_a_second_upload_of_a_held_list_stores_nothing_and_is_receipted_for_its_sender(tmp_path: Path) -> None:
    leaves = listed(1, 2)
    root = BatchTree(leaves).root

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        hold(api, 1, 2)
        first = await client.send("PUT", routes.batch(root), encode_leaves(leaves))
        again = await client.send("PUT", routes.batch(root), encode_leaves(leaves))
        other = await client.send("PUT", routes.batch(root), encode_leaves(leaves), signer=OTHER)
        answers = [(reply.status, reply.body["created"]) for reply in (first, again, other)]
        assert answers == [(201, True), (200, False), (200, False)]
        for reply, node in ((first, WORKER), (again, WORKER), (other, OTHER)):
            assert reply.body["root"] == "0x" + root.hex() and reply.body["count"] == 2
            assert receipted_for(bytes.fromhex(reply.body["receipt"][2:]), root, node.address, 2) == TRAINER.address
        assert api.service.batches.uploader(root) == WORKER.address  # the first sender's record stays

    run(tmp_path, scenario)
    assert stored_lists(tmp_path) == sorted([f"{root.hex()}.leaves", f"{root.hex()}.node"])


def test_each_bad_leaf_list_gets_its_own_refusal_and_nothing_is_stored(tmp_path: Path) -> None:
    good = listed(1, 2, 3)
    root = BatchTree(good).root
    path, body = routes.batch(root), encode_leaves(good)
    missing = (*listed(1), Leaf(held_key(8), 5), *listed(2), Leaf(held_key(9), 5))  # files 8 and 9 never uploaded
    zero_units = encode_leaves(listed(1, 2)) + held_key(3) + bytes(8)
    oversized = encode_leaves(listed(1)) * (MAX_BATCH_BYTES // LEAF_BYTES + 1)

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        hold(api, 1, 2, 3)
        replies = {
            "unsigned": await client.send("PUT", path, body, signer=None),
            "non-member": await client.send("PUT", path, body, signer=STRANGER),
            "a validator": await client.send("PUT", path, body, signer=VALIDATOR),
            "bad name": await client.send("PUT", "/v1/batches/" + root.hex().upper(), body),
            "empty": await client.send("PUT", path, b""),
            "a stray byte": await client.send("PUT", path, body + b"\x00"),
            "zero units": await client.send("PUT", routes.batch(root), zero_units),
            "oversized": await client.send("PUT", path, oversized),
            "another root": await client.send("PUT", routes.batch(BatchTree(listed(1, 2)).root), body),
            "missing files": await client.send("PUT", routes.batch(BatchTree(missing).root), encode_leaves(missing)),
        }
        expected = {
            "unsigned": (401, "missing_header"),
            "non-member": (403, "not_member"),
            "a validator": (403, "not_member"),
            "bad name": (400, "bad_name"),
            "empty": (400, "malformed_batch"),
            "a stray byte": (400, "malformed_batch"),
            "zero units": (400, "malformed_batch"),
            "oversized": (413, "too_large"),
            "another root": (400, "root_mismatch"),
            "missing files": (409, "missing_files"),
        }
        assert {name: (reply.status, reply.body.get("error")) for name, reply in replies.items()} == expected
        assert all(reply.body.get("message") for reply in replies.values())
        assert "leaf 2: claims 0 units" in replies["zero units"].body["message"]
        # the first missing file is named, so the worker knows what to upload
        assert f"leaf 1 names rollout file {held_key(8).hex()}" in replies["missing files"].body["message"]
        assert "2 of the 4 leaves" in replies["missing files"].body["message"]
        with pytest.raises(CoordinatorRefused) as refused:
            await CoordinatorClient(client.session, client.url, WORKER, DOMAIN).upload_batch(missing)
        assert (refused.value.status, refused.value.code) == (409, "missing_files")
        assert (await client.send("PUT", path, body)).status == 201  # the good list after all of them

    run(tmp_path, scenario)
    assert stored_lists(tmp_path) == sorted([f"{root.hex()}.leaves", f"{root.hex()}.node"])


def test_without_the_trainers_key_a_list_is_stored_with_no_receipt(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        hold(api, 1)
        upload = await CoordinatorClient(client.session, client.url, WORKER, DOMAIN).upload_batch(listed(1))
        assert upload.created and upload.receipt is None
        assert upload.receipt_signer(POOL, WORKER.address, DOMAIN) is None

    run(tmp_path, scenario, signed=False)


def test_a_lost_leaf_list_is_gone_not_missing_until_it_is_listed_again(tmp_path: Path) -> None:
    leaves = listed(1, 2)
    root = BatchTree(leaves).root

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        hold(api, 1, 2)
        validator = CoordinatorClient(client.session, client.url, VALIDATOR, DOMAIN)
        assert (await CoordinatorClient(client.session, client.url, WORKER, DOMAIN).upload_batch(leaves)).created
        assert await validator.download_batch(root) == leaves
        api.service.batches.path(root).unlink()  # the coordinator's disk loses the list it acknowledged
        with pytest.raises(CoordinatorLostFile, match="acknowledged"):
            await validator.download_batch(root)
        assert await validator.download_batch(BatchTree(listed(3)).root) is None  # never stored: 404
        for asked, status, code in ((root, 410, "lost"), (BatchTree(listed(3)).root, 404, "not_found")):
            async with client.session.get(client.url + routes.batch(asked)) as response:
                assert (response.status, (await response.json())["error"]) == (status, code)
        # the worker lists it again (its files are still held), and it is served again
        assert (await CoordinatorClient(client.session, client.url, WORKER, DOMAIN).upload_batch(leaves)).created
        assert await validator.download_batch(root) == leaves

    run(tmp_path, scenario)


def test_a_member_past_its_quota_of_lists_is_refused_before_its_body_is_read_and_a_restart_counts_them(
    tmp_path: Path,
) -> None:
    first, second = listed(1), listed(1, 2)

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        hold(api, 1, 2)
        worker = CoordinatorClient(client.session, client.url, WORKER, DOMAIN)
        assert (await worker.upload_batch(first)).created
        with pytest.raises(CoordinatorBusy) as busy:
            await worker.upload_batch(second)
        assert busy.value.code == "quota"
        assert not (await worker.upload_batch(first)).created  # a held list is never refused for the quota
        assert (await CoordinatorClient(client.session, client.url, OTHER, DOMAIN).upload_batch(second)).created

    async def after_restart(client: Client, api: CoordinatorApi) -> None:
        path, body = routes.batch(BatchTree(listed(2)).root), encode_leaves(listed(2))
        # signed over the list, sent with other bytes: read, they would be refused as `body_mismatch`
        host = urllib.parse.urlsplit(client.url).netloc
        headers = sign_request(WORKER, DOMAIN, "PUT", path, body, pool_id=POOL, host=host)
        async with client.session.put(client.url + path, data=bytes(len(body)), headers=headers) as response:
            assert (response.status, (await response.json())["error"]) == (429, "quota")

    run(tmp_path, scenario, max_stored_batches_per_node=1)
    run(tmp_path, after_restart, max_stored_batches_per_node=1)


def test_a_nodes_quota_of_lists_is_its_quota_of_files_unless_set(tmp_path: Path) -> None:
    def quota(**config: Any) -> int:
        options = {"trainer": TRAINER, "worker": WORKER.address, "validator": VALIDATOR.address}
        return coordinator_service(tmp_path, DOMAIN, config=ApiConfig(**config), **options).batch_quota.max_files

    assert quota(max_stored_files_per_node=96) == 96  # a batch names at least one file
    assert quota(max_stored_files_per_node=96, max_stored_batches_per_node=7) == 7
    assert quota() == 0  # no limit, as for files


@asynccontextmanager
async def hostile(body: bytes, headers: dict[str, str] | None = None) -> AsyncIterator[str]:
    """A coordinator that serves `body` for every leaf list."""

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=body, headers=headers)

    app = web.Application()
    app.router.add_get(routes.BATCH, serve)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("served", "problem"),
    [
        (encode_leaves(listed(1, 3)), "whose root is"),
        (encode_leaves(listed(2, 1)), "whose root is"),  # the same leaves in another order are another batch
        (encode_leaves(listed(1, 2))[:-1], "not a whole number"),
        (encode_leaves(listed(1)) * (MAX_BATCH_BYTES // LEAF_BYTES + 1), f"over {MAX_BATCH_BYTES}"),
    ],
    ids=["other leaves", "reordered", "truncated", "oversized"],
)
def test_a_served_list_that_is_not_the_roots_is_the_coordinators_failure(served: bytes, problem: str) -> None:
    root = BatchTree(listed(1, 2)).root

    async def scenario() -> None:
        async with hostile(served) as url, aiohttp.ClientSession() as session:
            client = CoordinatorClient(session, url, VALIDATOR, DOMAIN, pool_id=POOL)
            with pytest.raises(CoordinatorUnavailable, match=problem):
                await client.download_batch(root)

    asyncio.run(scenario())
