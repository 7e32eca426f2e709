"""Issue 22: an upload's write and fsync run in a worker thread, one write a key at a time, and an uploader is read
from disk at most once. Before, `RolloutInbox.put` ran on the event loop, so every request waited for the disk,
and each receipt read the `.node` file again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.trainer.test_api import WORKER, Client, rollout_bytes, run, upload_path
from trainer.api import CoordinatorApi
from trainer.inbox import RolloutInbox


def slow_puts(api: CoordinatorApi, seconds: float) -> list[bytes]:
    """Makes the inbox's writes take `seconds` (a slow disk); returns the keys as each write starts."""
    inbox, started = api.service.inbox, []
    put = inbox.put

    def slow(work_key: bytes, data: bytes, node: str) -> bool:
        started.append(work_key)
        time.sleep(seconds)
        return put(work_key, data, node)

    inbox.put = slow  # type: ignore[method-assign]
    return started


def test_the_coordinator_answers_while_an_upload_is_written(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        slow_puts(api, 1.0)
        data, order = rollout_bytes(), []

        async def upload() -> None:
            assert (await client.send("PUT", upload_path(data), data)).status == 201
            order.append("upload")

        async def step() -> None:
            await asyncio.sleep(0.3)  # the upload is being written by now
            assert (await client.send("GET", "/v1/step", signer=None)).status == 200
            order.append("step")

        await asyncio.gather(upload(), step())
        assert order == ["step", "upload"]

    run(tmp_path, scenario)


def test_the_same_bytes_uploaded_at_once_are_written_once_and_held_once(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        started = slow_puts(api, 0.5)
        data = rollout_bytes()
        replies = await asyncio.gather(*(client.send("PUT", upload_path(data), data) for _ in range(2)))
        assert sorted(r.status for r in replies) == [200, 201]
        assert all(r.body["receipt"] for r in replies)  # the uploader's receipt, both times
        assert len(started) == 1
        assert api.service.quota.usage(WORKER.address, 0) == (1, len(data))
        assert api.service.inbox.uploads() == [bytes.fromhex(upload_path(data).rsplit("/", 1)[1])]

    run(tmp_path, scenario)


def test_an_uploader_is_read_from_disk_once_and_a_reopened_inbox_reads_it_again(tmp_path: Path) -> None:
    inbox, key = RolloutInbox(tmp_path), b"\x01" * 32
    assert inbox.put(key, b"bytes", WORKER.address)
    node_file = tmp_path / f"{key.hex()}.node"
    assert inbox.uploader(key) == WORKER.address
    reopened = RolloutInbox(tmp_path)
    assert reopened.uploader(key) == WORKER.address
    node_file.unlink()  # neither reads it again
    assert inbox.uploader(key) == reopened.uploader(key) == WORKER.address
    assert RolloutInbox(tmp_path).uploader(key) is None


def test_the_uploaders_kept_in_memory_are_at_most_max_uploaders_and_older_ones_are_read_again(tmp_path: Path) -> None:
    inbox = RolloutInbox(tmp_path, max_uploaders=4)
    keys = [bytes([i]) * 32 for i in range(12)]
    for key in keys:
        assert inbox.put(key, key, WORKER.address)
        assert len(inbox._uploaders) <= 4
    assert set(inbox._uploaders) == set(keys[-4:])  # the files stored last
    assert inbox.uploader(keys[0]) == WORKER.address  # read from its .node file
    assert keys[0] in inbox._uploaders and len(inbox._uploaders) == 4
