"""A relay's mirror against a real origin server in the same event loop: late upstreams, pruning, resume."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from eth_account import Account

from protocol.signing import SigningDomain
from shardcast.client import fetch_checkpoint
from shardcast.manifest import Manifest, build_manifest, encode_manifest
from shardcast.mirror import Mirror
from shardcast.origin import Origin
from shardcast.protocol import SIGNATURE_HEADER
from shardcast.server import ServerLimits, ShardServer
from shardcast.store import ShardStore
from shardcast.trust import TrustPolicy, sign_manifest

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
TRAINER = Account.from_key(b"\x01" * 32)
MALLORY = Account.from_key(b"\x02" * 32)
POLICY = TrustPolicy(DOMAIN, TRAINER.address, pool_id=2)
SHARD = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkpoint(path: Path, seed: int, size: int = 300_000) -> Path:
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(random.Random(seed).randbytes(size))
    return path


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def with_origin(
    root: Path, port: int, body: Callable[[Origin], Awaitable[None]], *, limits: ServerLimits | None = None
) -> None:
    server = ShardServer(ShardStore(root / "origin"), role="origin", limits=limits)
    await server.start("127.0.0.1", port)
    origin = Origin(server, account=TRAINER, domain=DOMAIN, pool_id=2, keep=5, shard_size=SHARD)
    try:
        await body(origin)
    finally:
        await server.stop()


def test_a_relay_started_before_its_upstream_mirrors_once_it_answers(tmp_path: Path) -> None:
    port = free_port()
    relay_store = ShardStore(tmp_path / "relay")

    async def scenario() -> None:
        relay = ShardServer(relay_store, role="relay")
        mirror = Mirror(relay, [f"http://127.0.0.1:{port}"], policy=POLICY, keep=2)
        task = asyncio.create_task(mirror.run())
        try:
            await asyncio.sleep(1.0)  # the upstream refuses connections meanwhile: the mirror backs off, keeps trying

            async def body(origin: Origin) -> None:
                await origin.publish(checkpoint(tmp_path / "c1", seed=1), 1)
                await until(lambda: relay_store.versions() == [1])

            await with_origin(tmp_path, port, body)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    assert (
        relay_store.read_shard(1, "model.safetensors", 0)
        == (tmp_path / "c1" / "model.safetensors").read_bytes()[:SHARD]
    )


def test_a_relay_keeps_the_newest_versions_and_drops_older_ones(tmp_path: Path) -> None:
    port = free_port()
    relay_store = ShardStore(tmp_path / "relay")

    async def scenario() -> None:
        relay = ShardServer(relay_store, role="relay")
        mirror = Mirror(relay, [f"http://127.0.0.1:{port}"], policy=POLICY, keep=2)

        async def body(origin: Origin) -> None:
            task = asyncio.create_task(mirror.run())
            try:
                for step in (1, 2, 3):
                    await origin.publish(checkpoint(tmp_path / f"c{step}", seed=step), step)
                    await until(lambda step=step: step in relay_store.versions())  # type: ignore[misc]
                # the mirror prunes just after a version completes: wait for that, not only for step 3
                await until(lambda: relay_store.versions() == [2, 3])
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        await with_origin(tmp_path, port, body)

    asyncio.run(scenario())
    assert relay_store.versions() == [2, 3]
    assert sorted(p.name for p in (tmp_path / "relay" / "v").iterdir()) == ["2", "3"]
    assert no_partial_directory_left(relay_store)


def no_partial_directory_left(store: ShardStore) -> bool:
    return all(not p.name.endswith(".partial") for p in (store.root / "v").iterdir())


def test_a_restarted_relay_resumes_a_half_mirrored_version(tmp_path: Path) -> None:
    port = free_port()
    source = checkpoint(tmp_path / "c1", seed=7, size=40 * SHARD)

    async def scenario() -> tuple[int, int]:
        async def body(origin: Origin) -> None:
            await origin.publish(source, 1)
            first_store = ShardStore(tmp_path / "relay")
            relay = ShardServer(first_store, role="relay")
            mirror = Mirror(relay, [f"http://127.0.0.1:{port}"], policy=POLICY, parallel=1)
            task = asyncio.create_task(mirror.run())
            partial = None
            try:
                await until(lambda: first_store.incoming_version(1) is not None)
                partial = first_store.incoming_version(1)
                assert partial is not None
                await until(lambda: len(partial.missing()) < 30)  # type: ignore[union-attr]
            finally:
                task.cancel()  # the relay stops mid-version
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert (tmp_path / "relay" / "v" / "1.partial").is_dir() and first_store.versions() == []

            second_store = ShardStore(tmp_path / "relay")  # a new process on the same data directory
            relay2 = ShardServer(second_store, role="relay")
            mirror2 = Mirror(relay2, [f"http://127.0.0.1:{port}"], policy=POLICY)
            before = origin.server.metrics.render()
            task2 = asyncio.create_task(mirror2.run())
            try:
                await until(lambda: second_store.versions() == [1])
            finally:
                task2.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task2
            after = origin.server.metrics.render()
            sent.extend([_bytes_sent(before), _bytes_sent(after)])

        sent: list[float] = []
        # 1 MB/s to a client: the version takes 2.6 s, so the relay is stopped with a dozen shards to go however
        # loaded the machine (unthrottled on loopback, it could finish between the test's look and the stop)
        await with_origin(tmp_path, port, body, limits=ServerLimits(client_rate=1_000_000))
        return int(sent[0]), int(sent[1])

    before, after = asyncio.run(scenario())
    assert after - before < 40 * SHARD  # the second relay fetched only what the first had not verified
    assert (tmp_path / "relay" / "v" / "1" / "model.safetensors").read_bytes() == (
        source / "model.safetensors"
    ).read_bytes()


def _bytes_sent(metrics: str) -> float:
    return next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("shardcast_bytes_sent"))


@pytest.mark.slow
def test_a_checkpoint_with_a_manifest_of_hundreds_of_kilobytes_reaches_a_client_through_a_relay(
    tmp_path: Path,
) -> None:
    # a manifest is read whole: one content.read(n) call returned the first 64-112 KB, which then failed its hash
    port = free_port()
    relay_store = ShardStore(tmp_path / "relay")
    source = checkpoint(tmp_path / "c1", seed=3, size=10 * 1024 * 1024)
    fetched: list[Path] = []

    async def scenario() -> None:
        relay = ShardServer(relay_store, role="relay")
        relay_port = await relay.start("127.0.0.1", 0)
        mirror = Mirror(relay, [f"http://127.0.0.1:{port}"], policy=POLICY, keep=2)
        task = asyncio.create_task(mirror.run())

        async def body(origin: Origin) -> None:
            origin.shard_size = 4096  # 2,560 shards: a manifest of about 0.4 MB
            await origin.publish(source, 1)
            await until(lambda: relay_store.versions() == [1], timeout=60.0)
            fetched.append(await fetch_checkpoint([f"http://127.0.0.1:{relay_port}"], POLICY, tmp_path / "out", step=1))

        try:
            await with_origin(tmp_path, port, body)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await relay.stop()

    asyncio.run(scenario())
    assert len(relay_store.manifest_bytes(1)) > 256 * 1024
    assert (fetched[0] / "model.safetensors").read_bytes() == source.joinpath("model.safetensors").read_bytes()


async def serve_junk(root: Path, steps: range) -> tuple[str, web.AppRunner]:
    """An upstream listing `steps`, each with a well-formed manifest of that step signed by Mallory."""
    base = build_manifest(checkpoint(root / "junk", seed=99, size=1000), pool_id=2, step=0, shard_size=SHARD)

    async def versions(request: web.Request) -> web.Response:
        return web.json_response({"latest": steps[-1], "versions": [{"step": s, "complete": True} for s in steps]})

    async def manifest(request: web.Request) -> web.Response:
        fake = Manifest(base.pool_id, int(request.match_info["step"]), base.shard_size, base.files)
        signature = "0x" + sign_manifest(fake, MALLORY, DOMAIN).hex()
        return web.Response(body=encode_manifest(fake), headers={SIGNATURE_HEADER: signature})

    app = web.Application()
    app.add_routes([web.get("/versions", versions), web.get("/v/{step}/manifest.json", manifest)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{runner.addresses[-1][1]}", runner


def test_a_relay_with_a_junk_upstream_still_mirrors_each_new_real_step(tmp_path: Path) -> None:
    # the junk upstream's unsigned steps 1000-1002 were the newest `keep`: no real step was ever mirrored
    port = free_port()
    relay_store = ShardStore(tmp_path / "relay")

    async def scenario() -> None:
        junk_url, junk_runner = await serve_junk(tmp_path, range(1000, 1003))
        relay = ShardServer(relay_store, role="relay")

        async def body(origin: Origin) -> None:
            await origin.publish(checkpoint(tmp_path / "c1", seed=1), 1)
            mirror = Mirror(relay, [junk_url, f"http://127.0.0.1:{port}"], policy=POLICY, keep=2)
            task = asyncio.create_task(mirror.run())
            try:
                await until(lambda: relay_store.versions() == [1], timeout=10)
                await origin.publish(checkpoint(tmp_path / "c2", seed=2), 2)
                await until(lambda: relay_store.versions() == [1, 2], timeout=10)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        try:
            await with_origin(tmp_path, port, body)
        finally:
            await junk_runner.cleanup()

    asyncio.run(scenario())
    assert relay_store.incoming() == []  # no junk step was ever announced
    assert (tmp_path / "relay" / "v" / "2" / "model.safetensors").read_bytes() == (
        tmp_path / "c2" / "model.safetensors"
    ).read_bytes()
