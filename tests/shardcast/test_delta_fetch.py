"""Delta checkpoints end to end (issue 36): an origin publishes each step whole and as a delta against the step before,
relays mirror both, and a receiver that holds the base rebuilds the step from the delta, checked against the
trainer's signed hashes of the whole step before a byte is loaded or served.

Each fault of the issue has its test here: a corrupt delta (in transit, and signed but malformed), a delta for a base
the receiver does not hold, a relay serving a delta of another base, a crash halfway through applying one, and a
delta larger than the checkpoint. Real servers on loopback; the checkpoints are bfloat16 safetensors files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from eth_account import Account

from protocol.signing import SigningDomain
from shardcast import DownloadFailed
from shardcast.client import FetchReport, fetch_checkpoint
from shardcast.delta import DeltaPolicy, encode_delta
from shardcast.manifest import DeltaInfo, Manifest, build_manifest, delta_name, manifest_hash
from shardcast.mirror import Mirror
from shardcast.protocol import SIGNATURE_HEADER
from shardcast.rebuild import SIGNED_MANIFEST_NAME
from shardcast.server import ShardServer
from shardcast.store import ShardStore
from shardcast.trust import TrustPolicy, sign_manifest

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
TRAINER = Account.from_key(b"\x01" * 32)
POLICY = TrustPolicy(DOMAIN, TRAINER.address, pool_id=7)
SHARD = 64 * 1024
WORDS = 400_000  # 800 KB of bfloat16: 13 shards
ALWAYS = DeltaPolicy(min_bytes=0)  # deltas for checkpoints of any size (the default sends small ones whole)
CONFIG = b'{"architectures": ["Tiny"]}'


def safetensors(path: Path, words: np.ndarray) -> None:
    """A safetensors file of one bfloat16 tensor (`words`, as uint16), its header padded to 8 bytes."""
    header = json.dumps({"w": {"dtype": "BF16", "shape": [len(words)], "data_offsets": [0, 2 * len(words)]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + words.astype(np.uint16).tobytes())


def steps(root: Path, count: int, *, changed: float = 0.02, seed: int = 0) -> list[Path]:
    """Checkpoint folders step_1 .. step_count: each changes `changed` of the words of the one before."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**16, WORDS, dtype=np.uint16)
    folders = []
    for step in range(1, count + 1):
        if step > 1:
            at = rng.choice(WORDS, int(WORDS * changed), replace=False)
            words[at] = rng.integers(0, 2**16, len(at), dtype=np.uint16)
        folder = root / f"ckpt_{step}"
        folder.mkdir(parents=True)
        safetensors(folder / "model.safetensors", words)
        (folder / "config.json").write_bytes(CONFIG)
        folders.append(folder)
    return folders


def publish(store: ShardStore, folder: Path, step: int, policy: DeltaPolicy | None = ALWAYS) -> Manifest:
    return store.publish_dir(
        folder, pool_id=7, step=step, shard_size=SHARD, sign=lambda m: sign_manifest(m, TRAINER, DOMAIN), delta=policy
    )


def same_checkpoint(got: Path, want: Path) -> bool:
    names = sorted(p.name for p in got.iterdir() if p.name != SIGNED_MANIFEST_NAME)
    return names == sorted(p.name for p in want.iterdir()) and all(
        (got / p.name).read_bytes() == p.read_bytes() for p in want.iterdir()
    )


@contextlib.asynccontextmanager
async def origin(store: ShardStore) -> AsyncIterator[tuple[str, ShardServer]]:
    server = ShardServer(store, role="origin")
    port = await server.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        await server.stop()


def bytes_sent(server: ShardServer) -> float:
    text = server.metrics.render()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("shardcast_bytes_sent_total"))


async def fetch(urls: list[str], out: Path, step: int, **kwargs: object) -> tuple[Path, FetchReport]:
    report = FetchReport()
    path = await fetch_checkpoint(urls, POLICY, out, step=step, report=report, **kwargs)  # type: ignore[arg-type]
    return path, report


@pytest.fixture
def folders(tmp_path: Path) -> list[Path]:
    return steps(tmp_path / "src", 4)


def test_the_origin_publishes_each_step_whole_and_as_a_delta_of_the_step_before(
    tmp_path: Path, folders: list[Path]
) -> None:
    store = ShardStore(tmp_path / "store")
    first = publish(store, folders[0], 1)
    second = publish(store, folders[1], 2)
    assert first.delta is None and first.format_version == 3  # nothing to be a delta of
    assert second.delta is not None and second.delta.base_step == 1
    assert second.delta.base_manifest == manifest_hash(first)
    # config.json did not change, yet its delta (a header and one empty block) is longer than its 27 bytes: whole
    assert second.delta.targets == ("model.safetensors",)
    assert [f.name for f in second.files] == [delta_name("model.safetensors"), "config.json", "model.safetensors"]
    assert [f.name for f in second.checkpoint_files] == ["config.json", "model.safetensors"]  # whole, as ever
    assert 0 < second.delta_size < 0.1 * second.checkpoint_size  # 2% of the words changed
    assert publish(store, folders[1], 2) == second  # republishing is a no-op, delta and all
    # the default policy sends a checkpoint of under 64 MiB whole
    assert publish(ShardStore(tmp_path / "other"), folders[0], 1, DeltaPolicy()).delta is None


def test_a_delta_larger_than_the_checkpoint_is_not_published(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "store")
    folders = steps(tmp_path / "src", 2, changed=1.0)  # every word new: a float32 pool after any step, roughly
    publish(store, folders[0], 1)
    manifest = publish(store, folders[1], 2)
    assert manifest.delta is None and not list((tmp_path / "store" / "v" / "2").glob("*.scdelta"))
    # and a policy that takes only small deltas sends a 2% change whole too
    small = steps(tmp_path / "small", 2)
    publish(store, small[0], 3)
    assert publish(store, small[1], 4, DeltaPolicy(min_bytes=0, max_ratio=0.001)).delta is None


def test_a_file_that_changed_size_is_sent_whole_beside_the_others_deltas(tmp_path: Path, folders: list[Path]) -> None:
    store = ShardStore(tmp_path / "store")
    publish(store, folders[0], 1)
    (folders[1] / "config.json").write_bytes(CONFIG + b" ")
    (folders[1] / "tokenizer.json").write_bytes(b"{}")  # new: no base
    manifest = publish(store, folders[1], 2)
    assert manifest.delta is not None and manifest.delta.targets == ("model.safetensors",)


def test_a_receiver_holding_the_base_downloads_only_the_delta_and_rebuilds_the_step_byte_for_byte(
    tmp_path: Path, folders: list[Path]
) -> None:
    store = ShardStore(tmp_path / "store")
    for step, folder in enumerate(folders[:2], start=1):
        publish(store, folder, step)
    manifest = store.manifest(2)

    async def scenario() -> tuple[FetchReport, FetchReport, float]:
        async with origin(store) as (url, server):
            _, whole = await fetch([url], tmp_path / "out", 1)
            before = bytes_sent(server)
            path, report = await fetch([url], tmp_path / "out", 2)
            assert same_checkpoint(path, folders[1])
            return whole, report, bytes_sent(server) - before

    whole, report, sent = asyncio.run(scenario())
    assert whole.base_step is None and whole.whole_bytes == manifest.checkpoint_size
    assert (report.base_step, report.links, report.problems) == (1, 1, [])
    assert report.delta_bytes == manifest.delta_size
    assert report.rebuilt_bytes == manifest.file("model.safetensors").size  # type: ignore[union-attr]
    assert report.whole_bytes == len(CONFIG)  # the one file without a delta
    assert sent == manifest.delta_size + len(CONFIG)  # what the origin sent for step 2, every byte counted
    assert sent < 0.1 * manifest.checkpoint_size
    # the folder keeps the manifest it was fetched by, so that it is the base of step 3's delta in turn
    assert (tmp_path / "out" / "step_2" / SIGNED_MANIFEST_NAME).read_bytes() == store.manifest_bytes(2)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["step_1", "step_2"]  # no scratch left


def test_a_receiver_without_the_base_fetches_whole_or_chains_deltas_when_that_is_fewer_bytes(
    tmp_path: Path, folders: list[Path]
) -> None:
    store = ShardStore(tmp_path / "store")
    for step, folder in enumerate(folders, start=1):
        publish(store, folder, step)

    async def scenario() -> list[FetchReport]:
        async with origin(store) as (url, _):
            _, none_held = await fetch([url], tmp_path / "fresh", 3)  # holds nothing: whole
            await fetch([url], tmp_path / "gap", 1)
            path, chained = await fetch([url], tmp_path / "gap", 4)  # holds step 1: deltas 2, 3 and 4
            assert same_checkpoint(path, folders[3])
            _, not_delta = await fetch([url], tmp_path / "off", 4, delta=False)
            return [none_held, chained, not_delta]

    none_held, chained, not_delta = asyncio.run(scenario())
    assert none_held.base_step is None and none_held.whole_bytes == store.manifest(3).checkpoint_size
    assert "no step held here" in none_held.problems[0]
    assert (chained.base_step, chained.links, chained.problems) == (1, 3, [])
    assert chained.delta_bytes == sum(store.manifest(s).delta_size for s in (2, 3, 4))
    assert chained.whole_bytes == len(CONFIG)
    assert not_delta.base_step is None and not_delta.whole_bytes == store.manifest(4).checkpoint_size


def test_a_chain_whose_link_no_source_holds_any_more_falls_back_to_the_whole_step(
    tmp_path: Path, folders: list[Path]
) -> None:
    store = ShardStore(tmp_path / "store")
    for step, folder in enumerate(folders, start=1):
        publish(store, folder, step)
    held = ShardStore(tmp_path / "held")  # the receiver's step 1 comes from elsewhere; the origin keeps steps 3-4
    publish(held, folders[0], 1)

    async def scenario() -> FetchReport:
        async with origin(held) as (url, _):
            await fetch([url], tmp_path / "out", 1)
        store.prune(2)
        async with origin(store) as (url, _):
            path, report = await fetch([url], tmp_path / "out", 4)
            assert same_checkpoint(path, folders[3])
            return report

    report = asyncio.run(scenario())
    assert report.base_step is None and report.whole_bytes == store.manifest(4).checkpoint_size
    assert "step 2, is not to be had" in report.problems[0]


def test_a_long_chain_is_not_taken_when_the_step_whole_is_fewer_bytes(tmp_path: Path) -> None:
    folders = steps(tmp_path / "src", 4, changed=0.3)  # each delta about half the checkpoint: 3 links cost more
    store = ShardStore(tmp_path / "store")
    for step, folder in enumerate(folders, start=1):
        publish(store, folder, step, DeltaPolicy(min_bytes=0, max_ratio=0.9))
    assert all(store.manifest(s).delta is not None for s in (2, 3, 4))

    async def scenario() -> FetchReport:
        async with origin(store) as (url, _):
            await fetch([url], tmp_path / "out", 1)
            return (await fetch([url], tmp_path / "out", 4))[1]

    report = asyncio.run(scenario())
    assert report.base_step is None and "not fewer bytes" in report.problems[0]


def hostile_relay(store: ShardStore, swap: Callable[[int, str, int, bytes], bytes]) -> web.Application:
    """A relay that lists and describes `store` honestly and serves each shard as `swap(step, file, index, bytes)`."""

    async def versions(request: web.Request) -> web.Response:
        held = store.versions()
        return web.json_response({"latest": held[-1], "versions": [{"step": s, "complete": True} for s in held]})

    async def manifest(request: web.Request) -> web.Response:
        step = int(request.match_info["step"])
        return web.Response(
            body=store.manifest_bytes(step), headers={SIGNATURE_HEADER: "0x" + store.signature(step).hex()}
        )

    async def shard(request: web.Request) -> web.Response:
        m = request.match_info
        step, file, index = int(m["step"]), m["file"], int(m["index"])
        return web.Response(body=swap(step, file, index, store.read_shard(step, file, index)))

    app = web.Application()
    app.add_routes(
        [
            web.get("/versions", versions),
            web.get("/v/{step}/manifest.json", manifest),
            web.get("/v/{step}/shards/{file}/{index}", shard),
        ]
    )
    return app


async def with_hostile(app: web.Application, body: Callable[[str], Awaitable[None]]) -> None:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        await body(f"http://127.0.0.1:{runner.addresses[-1][1]}")
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("fault", ["flipped byte", "another base's delta"])
def test_a_relay_corrupting_a_delta_or_serving_one_of_another_base_is_banned_and_the_step_still_rebuilds(
    tmp_path: Path, folders: list[Path], fault: str
) -> None:
    store = ShardStore(tmp_path / "store")
    for step, folder in enumerate(folders[:3], start=1):
        publish(store, folder, step)
    delta = delta_name("model.safetensors")

    def swap(step: int, file: str, index: int, data: bytes) -> bytes:
        if file != delta:
            return data
        if fault == "flipped byte":
            return data[:-1] + bytes([data[-1] ^ 1])
        other = store.read_shard(2, file, 0)  # step 2's delta, against step 1: a delta of another base
        return other[: len(data)].ljust(len(data), b"\0")

    async def scenario() -> tuple[FetchReport, FetchReport]:
        async with origin(store) as (url, _):
            await fetch([url], tmp_path / "out", 2)
            alone, mixed = FetchReport(), FetchReport()

            async def body(relay: str) -> None:
                # the hostile relay alone: its delta fails its hash, it is banned, and nothing is published
                with pytest.raises(DownloadFailed):
                    await fetch_checkpoint([relay], POLICY, tmp_path / "out", step=3, report=alone)
                assert not (tmp_path / "out" / "step_3").exists()
                # beside the origin: wherever a shard of the delta comes from, the step rebuilds right
                path = await fetch_checkpoint([relay, url], POLICY, tmp_path / "out", step=3, report=mixed)
                assert same_checkpoint(path, folders[2])

            await with_hostile(hostile_relay(store, swap), body)
            return alone, mixed

    alone, mixed = asyncio.run(scenario())
    assert alone.base_step == 2 and "failed its blake3" in alone.problems[0] and alone.rebuilt_bytes == 0
    assert (mixed.base_step, mixed.links, mixed.problems) == (2, 1, [])
    assert mixed.rebuilt_bytes == store.manifest(3).file("model.safetensors").size  # type: ignore[union-attr]


def signed_with_delta(store: ShardStore, folder: Path, step: int, base_step: int, delta_bytes: bytes) -> Manifest:
    """Store `folder` as version `step` with `delta_bytes` as its model's delta against `base_step`, signed by the
    trainer: a trainer's (or origin's) bug, which the signature cannot catch."""
    staged = folder.parent / f"staged_{step}"
    staged.mkdir()
    for p in folder.iterdir():
        (staged / p.name).write_bytes(p.read_bytes())
    (staged / delta_name("model.safetensors")).write_bytes(delta_bytes)
    info = DeltaInfo(base_step, manifest_hash(store.manifest(base_step)), ("model.safetensors",))
    manifest = build_manifest(staged, pool_id=7, step=step, shard_size=SHARD, delta=info)
    store.put_version(manifest, staged, sign_manifest(manifest, TRAINER, DOMAIN))
    return manifest


@pytest.mark.parametrize("fault", ["malformed", "made against other bytes"])
def test_a_signed_delta_that_does_not_rebuild_the_step_is_never_loaded_and_the_step_comes_whole(
    tmp_path: Path, folders: list[Path], fault: str
) -> None:
    store = ShardStore(tmp_path / "store")
    publish(store, folders[0], 1)
    if fault == "malformed":
        data = b"SCDELTA1" + os.urandom(300)
    else:  # a delta of the right base's step number and manifest hash, encoded against step 3's bytes instead
        encode_delta(folders[2] / "model.safetensors", folders[1] / "model.safetensors", tmp_path / "wrong")
        data = (tmp_path / "wrong").read_bytes()
    manifest = signed_with_delta(store, folders[1], 2, 1, data)

    async def scenario() -> FetchReport:
        async with origin(store) as (url, _):
            await fetch([url], tmp_path / "out", 1)
            path, report = await fetch([url], tmp_path / "out", 2)
            assert same_checkpoint(path, folders[1])  # every byte the trainer's, whatever the delta made
            return report

    report = asyncio.run(scenario())
    assert report.base_step == 1 and report.problems
    if fault == "malformed":
        assert report.rebuilt_bytes == 0 and "model.safetensors" in report.problems[0]
    # what did rebuild right (shards the wrong base shares with the right one) was kept; the rest came whole
    assert report.rebuilt_bytes + report.whole_bytes == manifest.checkpoint_size
    assert report.whole_bytes > 0


def test_a_relay_mirrors_the_delta_with_the_step_and_its_clients_rebuild_through_it(
    tmp_path: Path, folders: list[Path]
) -> None:
    origin_store, relay_store = ShardStore(tmp_path / "origin"), ShardStore(tmp_path / "relay")
    for step, folder in enumerate(folders[:2], start=1):
        publish(origin_store, folder, step)

    async def scenario() -> FetchReport:
        async with origin(origin_store) as (upstream, _):
            relay = ShardServer(relay_store, role="relay")
            relay_url = f"http://127.0.0.1:{await relay.start('127.0.0.1', 0)}"
            mirror = Mirror(relay, [upstream], policy=POLICY, keep=3)
            task = asyncio.create_task(mirror.run())
            try:
                for _ in range(500):
                    if relay_store.versions() == [1, 2]:
                        break
                    await asyncio.sleep(0.02)
                await fetch([relay_url], tmp_path / "out", 1)
                path, report = await fetch([relay_url], tmp_path / "out", 2)
                assert same_checkpoint(path, folders[1])
                return report
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await relay.stop()

    report = asyncio.run(scenario())
    assert relay_store.manifest(2) == origin_store.manifest(2)  # both the whole step and its delta, as signed
    assert (tmp_path / "relay" / "v" / "2" / delta_name("model.safetensors")).is_file()
    assert (report.base_step, report.problems) == (1, [])


CRASH = """
import asyncio, os, signal, sys
import shardcast.partial, shardcast.rebuild
from shardcast.client import fetch_checkpoint
from shardcast.trust import TrustPolicy
from protocol.signing import SigningDomain

where, url, out, trainer = sys.argv[1:5]
real_apply, real_take = shardcast.rebuild.apply_delta, shardcast.partial.PartialCheckpoint.take_file

def apply_then_die(base, delta, target, *, size):  # leaves half the result written, as a crash mid-apply would
    real_apply(base, delta, target, size=size)
    data = target.read_bytes()
    target.unlink()
    target.with_name(target.name + ".partial").write_bytes(data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)

def take_then_die(self, file, path):  # the rebuilt file moved into the checkpoint, not one shard journalled yet
    os.replace(path, self.partial / file)
    os.kill(os.getpid(), signal.SIGKILL)

if where == "apply":
    shardcast.rebuild.apply_delta = apply_then_die
else:
    shardcast.partial.PartialCheckpoint.take_file = take_then_die
policy = TrustPolicy(SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0"), trainer, 7)
asyncio.run(fetch_checkpoint([url], policy, out, step=2))
"""


@contextlib.contextmanager
def origin_in_thread(store: ShardStore) -> Iterator[tuple[str, ShardServer]]:
    """An origin on an event loop of its own, for a client in another process."""
    loop = asyncio.new_event_loop()
    server = ShardServer(store, role="origin")
    port = loop.run_until_complete(server.start("127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


@pytest.mark.parametrize("where", ["apply", "take"])
def test_a_receiver_killed_halfway_through_applying_a_delta_resumes_without_fetching_it_again(
    tmp_path: Path, folders: list[Path], where: str
) -> None:
    store = ShardStore(tmp_path / "store")
    for step, folder in enumerate(folders[:2], start=1):
        publish(store, folder, step)
    out = tmp_path / "out"
    manifest = store.manifest(2)
    with origin_in_thread(store) as (url, server):
        asyncio.run(fetch([url], out, 1))
        crashed = subprocess.run(
            [sys.executable, "-c", CRASH, where, url, str(out), TRAINER.address], capture_output=True, timeout=120
        )
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
        assert not (out / "step_2").exists()  # the final path never holds a half-rebuilt step
        assert (out / "step_1" / "model.safetensors").read_bytes() == (folders[0] / "model.safetensors").read_bytes()
        before = bytes_sent(server)
        path, report = asyncio.run(fetch([url], out, 2))
        sent = bytes_sent(server) - before
    assert same_checkpoint(path, folders[1])
    assert (report.base_step, report.problems) == (1, [])
    assert sent == len(CONFIG)  # config.json, which has no delta; the delta was not fetched again
    assert report.delta_bytes == manifest.delta_size  # counted, as resumed


@pytest.mark.parametrize("memory", [False, True], ids=["on disk", "memory window"])
@pytest.mark.parametrize("base", ["intact", "corrupted on the relay's disk"])
def test_a_relay_holding_the_base_rebuilds_the_step_from_its_delta_and_downloads_only_what_did_not_verify(
    tmp_path: Path, folders: list[Path], memory: bool, base: str
) -> None:
    origin_store = ShardStore(tmp_path / "origin")
    relay_store = ShardStore(tmp_path / "relay", memory_bytes=64 << 20 if memory else 0, hold=lambda size: True)

    async def scenario() -> float:
        async with origin(origin_store) as (upstream, server):
            relay = ShardServer(relay_store, role="relay")
            await relay.start("127.0.0.1", 0)
            task = asyncio.create_task(Mirror(relay, [upstream], policy=POLICY, keep=3).run())
            try:
                publish(origin_store, folders[0], 1)
                await server.notify()
                await until(lambda: relay_store.versions() == [1])
                if base != "intact":  # its disk flips a byte of shard 0 after the relay verified it
                    stored = tmp_path / "relay" / "v" / "1" / "model.safetensors"
                    data = bytearray(stored.read_bytes())
                    data[100] ^= 1
                    stored.write_bytes(bytes(data))
                before = bytes_sent(server)
                publish(origin_store, folders[1], 2)
                await server.notify()
                await until(lambda: relay_store.versions() == [1, 2])
                return bytes_sent(server) - before
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await relay.stop()

    sent = asyncio.run(scenario())
    manifest = origin_store.manifest(2)
    assert relay_store.manifest(2) == manifest
    for f in manifest.files:  # the step and its delta, byte for byte, whatever the relay's base held
        assert (tmp_path / "relay" / "v" / "2" / f.name).read_bytes() == (
            tmp_path / "origin" / "v" / "2" / f.name
        ).read_bytes()
    whole = len(CONFIG) + (SHARD if base != "intact" else 0)  # config.json has no delta; a bad shard comes whole
    assert sent == manifest.delta_size + whole


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
