"""The SHARDCAST HTTP server on loopback, driven by a real aiohttp client: endpoints, mirroring waits and limits.

pytest-asyncio is not installed: each test runs its scenario with `asyncio.run` through `serve()`. Timing checks
are behaviour checks with generous bounds (a wait happened, or it did not), never benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from multidict import CIMultiDictProxy
from yarl import URL

from core.metrics import CONTENT_TYPE
from core.serving import ConnectionLimits
from protocol.signing import SigningDomain, recover
from shardcast import UntrustedManifest
from shardcast.manifest import Manifest, build_manifest, encode_manifest, parse_manifest
from shardcast.protocol import SIGNATURE_HEADER
from shardcast.server import ServerLimits, ShardServer
from shardcast.store import ShardStore
from shardcast.trust import TrustPolicy, checkpoint_message, sign_manifest
from tests.promtool import check_metrics

KIB = 1024
MIB = 1024 * KIB
SHARD = 64 * KIB
POOL = 1
STEP = 10
TRAINER: LocalAccount = Account.from_key("0x" + "11" * 32)
DOMAIN = SigningDomain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SHARD_PATH = "/v/{step}/shards/{file}/{index}"


def make_checkpoint(d: Path, seed: int, model_bytes: int = 5 * SHARD + 321) -> Path:
    rng = random.Random(seed)
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(rng.randbytes(model_bytes))
    (d / "config.json").write_bytes(b'{"vocab_size": 256}')
    (d / "empty.txt").write_bytes(b"")
    return d


def sign(manifest: Manifest) -> bytes:
    return sign_manifest(manifest, TRAINER, DOMAIN)


def publish(store: ShardStore, source: Path, step: int, shard_size: int = SHARD) -> Manifest:
    return store.publish_dir(source, pool_id=POOL, step=step, shard_size=shard_size, sign=sign)


def all_shards(m: Manifest) -> list[tuple[str, int]]:
    return [(f.name, s.index) for f in m.files for s in f.shards]


def shard_bytes(source: Path, m: Manifest, file: str, index: int) -> bytes:
    s = m.file(file).shards[index]  # type: ignore[union-attr]
    return (source / file).read_bytes()[s.offset : s.offset + s.size]


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text; labels in sorted order, as the registry writes them."""
    label_text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""
    for line in text.splitlines():
        if line.startswith(name + label_text + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{label_text} in:\n{text}")


@dataclass
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        assert self.headers["Content-Type"].startswith("application/json"), self.headers["Content-Type"]
        return json.loads(self.body)


@dataclass
class Served:
    server: ShardServer
    url: str
    session: aiohttp.ClientSession

    async def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        """GET `path` exactly as written: percent-escapes and dot segments reach the server untouched."""
        async with self.session.get(URL(self.url + path, encoded=True), headers=headers) as r:
            return Reply(r.status, r.headers, await r.read())

    def in_flight(self) -> float:
        return sample(self.server.metrics.render(), "shardcast_in_flight")

    async def until_in_flight(self, n: int) -> None:
        deadline = time.monotonic() + 5
        while self.in_flight() != n:
            assert time.monotonic() < deadline, f"{self.in_flight()} requests in flight, waited for {n}"
            await asyncio.sleep(0.01)


def serve(
    store: ShardStore,
    scenario: Callable[[Served], Awaitable[None]],
    *,
    role: str = "origin",
    limits: ServerLimits | None = None,
    connections: ConnectionLimits | None = None,
) -> None:
    async def main() -> None:
        server = ShardServer(store, role=role, limits=limits, connections=connections)
        port = await server.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                await scenario(Served(server, f"http://127.0.0.1:{port}", session))
        finally:
            await server.stop()

    asyncio.run(main())


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "source", seed=1)


@pytest.fixture
def store(tmp_path: Path) -> ShardStore:
    return ShardStore(tmp_path / "store")


@pytest.fixture
def manifest(store: ShardStore, source: Path) -> Manifest:
    """Version STEP published into `store`."""
    return publish(store, source, STEP)


# ---- /versions ----


def test_versions_lists_complete_and_incoming_versions_in_step_order(
    tmp_path: Path, store: ShardStore, source: Path
) -> None:
    publish(store, source, 8)
    publish(store, make_checkpoint(tmp_path / "src3", seed=3), 3)
    for step in (12, 5):
        m = build_manifest(source, pool_id=POOL, step=step, shard_size=SHARD)
        store.begin_version(m, sign(m))

    async def scenario(s: Served) -> None:
        reply = await s.get("/versions")
        assert reply.status == 200
        assert reply.json() == {
            "latest": 12,
            "versions": [
                {"step": 3, "complete": True},
                {"step": 5, "complete": False},
                {"step": 8, "complete": True},
                {"step": 12, "complete": False},
            ],
        }

    serve(store, scenario)


def test_versions_of_an_empty_store(store: ShardStore) -> None:
    async def scenario(s: Served) -> None:
        assert (await s.get("/versions")).json() == {"latest": None, "versions": []}

    serve(store, scenario)


def test_long_poll_returns_as_soon_as_a_newer_version_is_published(
    tmp_path: Path, store: ShardStore, manifest: Manifest
) -> None:
    newer = make_checkpoint(tmp_path / "src11", seed=11)

    async def scenario(s: Served) -> None:
        started = time.monotonic()
        poll = asyncio.create_task(s.get(f"/versions?after={STEP}&wait=30"))
        await s.until_in_flight(1)
        await s.server.notify()  # a wake-up with nothing newer must not end the poll
        await asyncio.sleep(0.2)
        assert not poll.done()
        await asyncio.to_thread(publish, s.server.store, newer, STEP + 1)
        await s.server.notify()
        reply = await asyncio.wait_for(poll, timeout=10)
        assert time.monotonic() - started < 10  # far below the 30 s asked for
        assert reply.status == 200 and reply.json()["latest"] == STEP + 1
        assert [v["step"] for v in reply.json()["versions"]] == [STEP, STEP + 1]

    serve(store, scenario)


def test_long_poll_is_woken_by_a_version_that_starts_mirroring(
    store: ShardStore, source: Path, manifest: Manifest
) -> None:
    async def scenario(s: Served) -> None:
        poll = asyncio.create_task(s.get(f"/versions?after={STEP}&wait=30"))
        await s.until_in_flight(1)
        incoming = build_manifest(source, pool_id=POOL, step=STEP + 5, shard_size=SHARD)
        store.begin_version(incoming, sign(incoming))
        await s.server.notify()
        reply = await asyncio.wait_for(poll, timeout=10)
        assert reply.json()["latest"] == STEP + 5
        assert {"step": STEP + 5, "complete": False} in reply.json()["versions"]

    serve(store, scenario)


@pytest.mark.parametrize(
    ("wait", "limits", "at_least"),
    [("0.5", None, 0.4), ("3600", ServerLimits(max_wait=0.3), 0.2)],
    ids=["the-wait-asked", "capped-by-max-wait"],
)
def test_long_poll_returns_after_the_wait_or_max_wait_when_nothing_newer_appears(
    store: ShardStore, manifest: Manifest, wait: str, limits: ServerLimits | None, at_least: float
) -> None:
    async def scenario(s: Served) -> None:
        started = time.monotonic()
        reply = await s.get(f"/versions?after={STEP}&wait={wait}")
        elapsed = time.monotonic() - started
        assert at_least <= elapsed < 5, elapsed
        assert reply.status == 200 and reply.json()["latest"] == STEP

    serve(store, scenario, limits=limits)


def test_long_poll_after_minus_one_waits_for_the_first_version(tmp_path: Path) -> None:
    empty = ShardStore(tmp_path / "empty")
    first = make_checkpoint(tmp_path / "first", seed=5)

    async def scenario(s: Served) -> None:
        poll = asyncio.create_task(s.get("/versions?after=-1&wait=30"))
        await s.until_in_flight(1)
        await asyncio.sleep(0.2)
        assert not poll.done()  # an empty store has nothing newer than -1 yet
        await asyncio.to_thread(publish, empty, first, 0)
        await s.server.notify()
        reply = await asyncio.wait_for(poll, timeout=10)
        assert reply.status == 200 and reply.json()["latest"] == 0

    serve(empty, scenario)


def test_long_poll_after_an_older_step_returns_at_once(store: ShardStore, manifest: Manifest) -> None:
    async def scenario(s: Served) -> None:
        started = time.monotonic()
        reply = await s.get(f"/versions?after={STEP - 1}&wait=30")
        assert time.monotonic() - started < 5
        assert reply.json()["latest"] == STEP

    serve(store, scenario)


@pytest.mark.parametrize("query", ["after=ten&wait=1", "after=-2&wait=1", "after=010&wait=1", "after=1&wait=soon"])
def test_versions_refuses_a_malformed_query(store: ShardStore, query: str) -> None:
    async def scenario(s: Served) -> None:
        reply = await s.get(f"/versions?{query}")
        assert reply.status == 400 and "error" in reply.json()

    serve(store, scenario)


# ---- manifest and shards ----


def test_manifest_is_the_canonical_encoding_signed_by_the_trainer(store: ShardStore, manifest: Manifest) -> None:
    async def scenario(s: Served) -> None:
        reply = await s.get(f"/v/{STEP}/manifest.json")
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("application/json")
        assert reply.body == encode_manifest(manifest)
        header = reply.headers[SIGNATURE_HEADER]
        assert re.fullmatch(r"0x[0-9a-f]{130}", header)
        signature = bytes.fromhex(header[2:])
        served = parse_manifest(reply.body)
        assert recover(checkpoint_message(served), signature, DOMAIN) == TRAINER.address
        TrustPolicy(DOMAIN, TRAINER.address, pool_id=POOL).check(served, signature, step=STEP)
        impostor = Account.from_key("0x" + "22" * 32).address
        with pytest.raises(UntrustedManifest):
            TrustPolicy(DOMAIN, impostor).check(served, signature, step=STEP)

    serve(store, scenario)


def test_every_shard_served_equals_the_source_bytes(store: ShardStore, source: Path, manifest: Manifest) -> None:
    async def scenario(s: Served) -> None:
        assert len(all_shards(manifest)) == 7
        for file, index in all_shards(manifest):
            reply = await s.get(SHARD_PATH.format(step=STEP, file=file, index=index))
            assert reply.status == 200, (file, index)
            assert reply.body == shard_bytes(source, manifest, file, index), (file, index)
            assert reply.headers["Accept-Ranges"] == "bytes"
            assert reply.headers["Content-Type"] == "application/octet-stream"

    serve(store, scenario)


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=0-99", 0, 100),
        ("bytes=100-", 100, SHARD),
        ("bytes=7-7", 7, 8),
        ("bytes=1000-999999", 1000, SHARD),  # an end past the shard is clipped to it
        (f"bytes=0-{SHARD - 1}", 0, SHARD),
    ],
)
def test_range_request_gives_206_with_content_range_and_those_bytes(
    store: ShardStore, source: Path, manifest: Manifest, header: str, start: int, end: int
) -> None:
    whole = shard_bytes(source, manifest, "model.safetensors", 1)

    async def scenario(s: Served) -> None:
        reply = await s.get(f"/v/{STEP}/shards/model.safetensors/1", headers={"Range": header})
        assert reply.status == 206
        assert reply.headers["Content-Range"] == f"bytes {start}-{end - 1}/{SHARD}"
        assert reply.body == whole[start:end]

    serve(store, scenario)


@pytest.mark.parametrize(
    "header",
    [
        f"bytes={SHARD}-",  # starts at the end
        f"bytes={SHARD + 5}-{SHARD + 9}",
        "bytes=10-5",  # ends before it starts
        "bytes=-100",  # suffix ranges are not supported
        "bytes=a-b",
        "bytes=0-1,4-5",  # nor several ranges
        "items=0-1",
        "bytes=123456789012345678901-",  # over 20 digits
    ],
)
def test_unsatisfiable_or_malformed_range_gives_416(store: ShardStore, manifest: Manifest, header: str) -> None:
    async def scenario(s: Served) -> None:
        reply = await s.get(f"/v/{STEP}/shards/model.safetensors/1", headers={"Range": header})
        assert reply.status == 416
        assert "error" in reply.json()
        assert reply.headers["Content-Range"] == f"bytes */{SHARD}"  # RFC 9110 section 14.4

    serve(store, scenario)


HOSTILE_PATHS = [
    "/v/99/manifest.json",  # unknown step
    "/v/99/shards/config.json/0",
    f"/v/{STEP}/shards/nope.bin/0",  # unknown file
    f"/v/{STEP}/shards/config.json/1",  # unknown index
    f"/v/{STEP}/shards/empty.txt/0",  # an empty file has no shards
    f"/v/{STEP}/shards/config.json/99999999999999999999",
    f"/v/{STEP}/shards/config.json/-1",
    f"/v/{STEP}/shards/config.json/0x0",
    "/v/123456789012345678901/manifest.json",  # overlong step
    "/v/99999999999999999999/manifest.json",  # 20 digits, over uint64
    "/v/123456789012345678901/shards/config.json/0",
    "/v/ten/manifest.json",  # non-digits
    "/v/1e1/manifest.json",
    "/v/%EF%BC%91%EF%BC%90/manifest.json",  # fullwidth digits "10", which int() would accept
    "/v/-10/shards/config.json/0",
    f"/v/{STEP}%2F..%2F{STEP}/manifest.json",  # encoded slashes in the step
    f"/v/{STEP}/shards/..%2F..%2F..%2Fsecret/0",  # traversal with encoded slashes
    f"/v/{STEP}/shards/..%2F{STEP}%2Fconfig.json/0",
    f"/v/{STEP}/shards/%2E%2E/0",
    f"/v/{STEP}/shards/..%5C..%5Csecret/0",  # backslashes
    f"/v/{STEP}/shards/.shardcast-signature/0",  # the store's own dot-files are not shards
    f"/v/{STEP}/shards/.shardcast-manifest.json/0",
    f"/v/{STEP}/shards/config.json%00/0",
]


RAW_DOT_SEGMENTS = [  # never a file outside the store
    f"/v/{STEP}/shards/../../../secret/0",
    f"/v/{STEP}/shards/config.json/../../../../secret",
    "/v/../../secret",
    "/../secret",
]


@pytest.mark.parametrize("path", HOSTILE_PATHS + RAW_DOT_SEGMENTS)
def test_unknown_hostile_or_dot_segment_shard_paths_give_a_json_404_and_no_file_outside_the_store(
    tmp_path: Path, store: ShardStore, manifest: Manifest, path: str
) -> None:
    secret = b"SECRET-" + random.Random(7).randbytes(64)
    (tmp_path / "secret").write_bytes(secret)

    async def scenario(s: Served) -> None:
        reply = await s.get(path)
        assert reply.status == 404
        assert list(reply.json()) == ["error"]
        assert secret not in reply.body

    serve(store, scenario)


# ---- a version being mirrored ----


def test_a_shard_being_mirrored_is_awaited_and_served_once_written(tmp_path: Path, source: Path) -> None:
    relay_store = ShardStore(tmp_path / "relay")
    manifest = build_manifest(source, pool_id=POOL, step=STEP, shard_size=SHARD)
    partial = relay_store.begin_version(manifest, sign(manifest))
    wanted = shard_bytes(source, manifest, "model.safetensors", 2)

    async def scenario(s: Served) -> None:
        assert (await s.get("/versions")).json()["versions"] == [{"step": STEP, "complete": False}]
        reply = await s.get(f"/v/{STEP}/manifest.json")
        assert reply.body == encode_manifest(manifest)
        assert reply.headers[SIGNATURE_HEADER] == "0x" + sign(manifest).hex()

        fetch = asyncio.create_task(s.get(f"/v/{STEP}/shards/model.safetensors/2"))
        await s.until_in_flight(1)
        await asyncio.sleep(0.1)
        assert not fetch.done()
        partial.write_shard("model.safetensors", 3, shard_bytes(source, manifest, "model.safetensors", 3))
        await s.server.notify()  # another shard arrived: this request keeps waiting
        await asyncio.sleep(0.1)
        assert not fetch.done()
        partial.write_shard("model.safetensors", 2, wanted)
        await s.server.notify()
        reply = await asyncio.wait_for(fetch, timeout=10)
        assert reply.status == 200 and reply.body == wanted

        for file, index in partial.missing():
            partial.write_shard(file, index, shard_bytes(source, manifest, file, index))
        await asyncio.to_thread(relay_store.finish_version, partial)
        await s.server.notify()
        assert (await s.get("/versions")).json()["versions"] == [{"step": STEP, "complete": True}]
        reply = await s.get(f"/v/{STEP}/shards/model.safetensors/2")
        assert reply.status == 200 and reply.body == wanted

    serve(relay_store, scenario, role="relay", limits=ServerLimits(pending_wait=30))


def test_a_shard_not_mirrored_within_pending_wait_gives_503_with_retry_after(tmp_path: Path, source: Path) -> None:
    relay_store = ShardStore(tmp_path / "relay")
    manifest = build_manifest(source, pool_id=POOL, step=STEP, shard_size=SHARD)
    relay_store.begin_version(manifest, sign(manifest))

    async def scenario(s: Served) -> None:
        started = time.monotonic()
        reply = await s.get(f"/v/{STEP}/shards/model.safetensors/0")
        elapsed = time.monotonic() - started
        assert reply.status == 503 and "error" in reply.json()
        assert float(reply.headers["Retry-After"]) > 0
        assert 0.25 <= elapsed < 5, elapsed

    serve(relay_store, scenario, role="relay", limits=ServerLimits(pending_wait=0.3))


# ---- limits ----


def _relay_waiting_for_shards(tmp_path: Path, source: Path) -> tuple[ShardStore, Manifest, Callable[[], None]]:
    """A relay store mirroring version STEP with no shard yet: a shard request waits (holds a request in flight)
    until the returned function writes every shard."""
    relay_store = ShardStore(tmp_path / "relay")
    manifest = build_manifest(source, pool_id=POOL, step=STEP, shard_size=SHARD)
    partial = relay_store.begin_version(manifest, sign(manifest))

    def arrive() -> None:
        for file, index in partial.missing():
            partial.write_shard(file, index, shard_bytes(source, manifest, file, index))

    return relay_store, manifest, arrive


async def _release_shard_waits(s: Served, arrive: Callable[[], None], waits: list[asyncio.Task[Reply]]) -> None:
    """Write the shards the requests holding the limit wait for, so they return."""
    arrive()
    await s.server.notify()
    for reply in await asyncio.wait_for(asyncio.gather(*waits), timeout=10):
        assert reply.status == 200


def test_requests_in_flight_per_client_over_the_limit_get_429(tmp_path: Path, source: Path) -> None:
    relay_store, _, arrive = _relay_waiting_for_shards(tmp_path, source)

    async def scenario(s: Served) -> None:
        waits = [asyncio.create_task(s.get(f"/v/{STEP}/shards/model.safetensors/{i}")) for i in range(2)]
        await s.until_in_flight(2)
        reply = await s.get("/health")
        assert reply.status == 429 and "error" in reply.json()
        await _release_shard_waits(s, arrive, waits)
        assert (await s.get("/health")).status == 200
        assert sample(s.server.metrics.render(), "shardcast_refused_total", limit="per_client") == 1

    serve(relay_store, scenario, role="relay", limits=ServerLimits(max_per_client=2, pending_wait=30))


def test_requests_in_flight_over_max_connections_get_503(tmp_path: Path, source: Path) -> None:
    relay_store, _, arrive = _relay_waiting_for_shards(tmp_path, source)

    async def scenario(s: Served) -> None:
        waits = [asyncio.create_task(s.get(f"/v/{STEP}/shards/model.safetensors/{i}")) for i in range(3)]
        await s.until_in_flight(3)
        reply = await s.get(f"/v/{STEP}/manifest.json")
        assert reply.status == 503 and "error" in reply.json()
        assert float(reply.headers["Retry-After"]) > 0
        await _release_shard_waits(s, arrive, waits)
        assert (await s.get(f"/v/{STEP}/shards/config.json/0")).status == 200
        assert sample(s.server.metrics.render(), "shardcast_refused_total", limit="connections") == 1

    limits = ServerLimits(max_connections=3, max_per_client=10, pending_wait=30)
    serve(relay_store, scenario, role="relay", limits=limits)


async def _long_polls(address: str, url: str, n: int) -> tuple[aiohttp.ClientSession, list[asyncio.Task[int]]]:
    """`n` idle long-polls of `url` from the loopback `address` (any 127.x.y.z is this machine)."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, local_addr=(address, 0)))

    async def poll() -> int:
        async with session.get(f"{url}/versions?after={STEP}&wait=30") as reply:
            await reply.read()
            return reply.status

    return session, [asyncio.create_task(poll()) for _ in range(n)]


def test_hundreds_of_idle_long_polls_leave_health_manifests_and_shards_to_other_clients(
    store: ShardStore, source: Path, manifest: Manifest, tmp_path: Path
) -> None:
    # 10 addresses x 30 idle long-polls, within each address's share: with long-polls counted as requests in
    # flight, the first 256 made every other request of every client answer 503
    async def scenario(s: Served) -> None:
        attackers = [await _long_polls(f"127.0.0.{10 + i}", s.url, 30) for i in range(10)]
        polls = [t for _, tasks in attackers for t in tasks]
        try:
            deadline = time.monotonic() + 10
            while s.in_flight() + sum(t.done() for t in polls) < 300:  # each one is held, or was answered
                assert time.monotonic() < deadline, f"{s.in_flight()} requests in flight"
                await asyncio.sleep(0.01)
            assert (await s.get("/health")).status == 200
            assert (await s.get(f"/v/{STEP}/manifest.json")).status == 200
            shard = await s.get(f"/v/{STEP}/shards/model.safetensors/0")
            assert shard.status == 200 and shard.body == shard_bytes(
                tmp_path / "source", manifest, "model.safetensors", 0
            )
            reply = await s.get(f"/versions?after={STEP}&wait=0.2")  # another client's long-poll is held too
            assert reply.status == 200 and reply.json()["latest"] == STEP
            text = s.server.metrics.render()
            assert sample(text, "shardcast_long_polls") == 300
            assert sample(text, "shardcast_refused_total") == 0
            await asyncio.to_thread(publish, s.server.store, make_checkpoint(tmp_path / "newer", seed=5), STEP + 1)
            await s.server.notify()
            statuses = await asyncio.wait_for(asyncio.gather(*polls), 20)
            assert statuses == [200] * 300  # all of them were held, and all answered once the step appeared
        finally:
            for task in polls:
                task.cancel()
            for session, _ in attackers:
                await session.close()

    serve(store, scenario)


def test_a_full_long_poll_pool_makes_room_for_an_address_that_holds_none(store: ShardStore, manifest: Manifest) -> None:
    async def scenario(s: Served) -> None:
        attackers = [await _long_polls(f"127.0.0.{10 + i}", s.url, 4) for i in range(2)]
        try:
            await s.until_in_flight(8)
            over = await _long_polls("127.0.0.10", s.url, 1)  # the pool is full, and this address holds its share
            attackers.append(over)
            assert await asyncio.wait_for(over[1][0], 5) == 429
            started = time.monotonic()
            reply = await s.get(f"/versions?after={STEP}&wait=0.5")  # from 127.0.0.1, which holds none
            assert reply.status == 200 and time.monotonic() - started >= 0.4  # held for its whole wait
            cut = [t for _, polls in attackers[:2] for t in polls if t.done()]
            assert len(cut) == 1 and cut[0].result() == 200  # one attacker's oldest poll answered early
            text = s.server.metrics.render()
            assert sample(text, "shardcast_long_polls_cut_total") == 1
            assert sample(text, "shardcast_refused_total", limit="long_polls_per_client") == 1
        finally:
            for session, polls in attackers:
                for task in polls:
                    task.cancel()
                await session.close()

    serve(store, scenario, limits=ServerLimits(max_long_polls=8, max_long_polls_per_client=4))


def test_idle_connections_past_the_per_address_limit_are_refused_and_the_rest_closed_after_the_header_timeout(
    store: ShardStore, manifest: Manifest
) -> None:
    """Issue 32, attack 4 at a relay: connections that never send a request held a descriptor each, for ever."""

    async def scenario(served: Served) -> None:
        port = int(served.url.rsplit(":", 1)[1])
        idle = []
        for _ in range(20):  # from another loopback address: a stranger's machine
            idle.append(await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0)))
        await asyncio.sleep(0.2)
        assert served.server.connection_guard is not None
        assert served.server.connection_guard.by_address == {"127.0.0.2": 8}  # the other 12 were closed at once
        assert (await served.get("/health")).status == 200  # another address is served meanwhile
        started = time.monotonic()
        for reader, writer in idle:
            async with asyncio.timeout(5):
                with contextlib.suppress(ConnectionResetError):  # reset: closed at once, over the limit
                    assert await reader.read(1) == b""  # closed by the server
            writer.close()
        assert time.monotonic() - started < 3
        assert served.server.connection_guard.refusals.counts == {
            "connections over the per-address limit": 12,
            "connections whose headers did not arrive in time": 8,
        }

    serve(store, scenario, connections=ConnectionLimits(max_per_address=8, header_timeout=1.0))


def test_requests_over_the_rate_get_429(store: ShardStore) -> None:
    async def scenario(s: Served) -> None:
        replies = [await s.get("/health") for _ in range(25)]
        statuses = [r.status for r in replies]
        ok, refused = statuses.count(200), statuses.count(429)
        assert ok + refused == 25
        assert statuses[:10] == [200] * 10, statuses  # a burst of twice the rate
        assert refused >= 5, statuses  # then about 5/s, far slower than loopback requests
        first_refusal = replies[statuses.index(429)]
        assert float(first_refusal.headers["Retry-After"]) > 0 and "error" in first_refusal.json()
        assert sample(s.server.metrics.render(), "shardcast_refused_total", limit="rate") == refused
        await asyncio.sleep(0.5)  # about 2.5 tokens come back
        assert (await s.get("/health")).status == 200

    serve(store, scenario, limits=ServerLimits(requests_per_s=5))


def test_client_rate_slows_transfers_shared_by_one_client(tmp_path: Path, store: ShardStore) -> None:
    """2 MiB/s with a one-second burst: two parallel 1.5 MiB shards (3 MiB) cannot finish before ~0.5 s."""
    big = make_checkpoint(tmp_path / "big", seed=9, model_bytes=3 * MIB)
    manifest = publish(store, big, STEP, shard_size=3 * MIB // 2)
    assert [s.size for s in manifest.file("model.safetensors").shards] == [3 * MIB // 2] * 2  # type: ignore[union-attr]

    async def scenario(s: Served) -> None:
        started = time.monotonic()
        replies = await asyncio.gather(*(s.get(f"/v/{STEP}/shards/model.safetensors/{i}") for i in range(2)))
        elapsed = time.monotonic() - started
        for i, reply in enumerate(replies):
            assert reply.status == 200 and reply.body == shard_bytes(big, manifest, "model.safetensors", i)
        assert 0.35 <= elapsed < 10, elapsed

    serve(store, scenario, limits=ServerLimits(client_rate=2 * MIB))


# ---- /health and /metrics ----


def test_health_reports_status_role_and_versions(store: ShardStore, manifest: Manifest) -> None:
    async def scenario(s: Served) -> None:
        reply = await s.get("/health")
        assert reply.status == 200
        body = reply.json()
        assert 0 <= body.pop("uptime_s") < 60
        assert body == {"status": "ok", "role": "relay", "latest": STEP, "versions": [{"step": STEP, "complete": True}]}

    serve(store, scenario, role="relay")


def test_metrics_count_requests_bytes_and_versions(store: ShardStore, source: Path, manifest: Manifest) -> None:
    incoming = build_manifest(source, pool_id=POOL, step=STEP + 2, shard_size=SHARD)
    store.begin_version(incoming, sign(incoming))

    async def scenario(s: Served) -> None:
        downloaded = 0
        for file, index in all_shards(manifest):
            downloaded += len((await s.get(SHARD_PATH.format(step=STEP, file=file, index=index))).body)
        ranged = await s.get(f"/v/{STEP}/shards/model.safetensors/0", headers={"Range": "bytes=10-109"})
        assert ranged.status == 206
        downloaded += len(ranged.body)
        assert (await s.get(f"/v/{STEP}/shards/nope.bin/0")).status == 404
        assert (await s.get("/no/such/endpoint")).status == 404
        assert (await s.get(f"/v/{STEP}/manifest.json")).status == 200

        reply = await s.get("/metrics")
        assert reply.status == 200 and reply.headers["Content-Type"] == CONTENT_TYPE
        text = reply.body.decode()
        check_metrics(text)
        for name, kind in [
            ("shardcast_requests_total", "counter"),
            ("shardcast_bytes_sent_total", "counter"),
            ("shardcast_refused_total", "counter"),
            ("shardcast_in_flight", "gauge"),
            ("shardcast_versions", "gauge"),
            ("shardcast_incoming_versions", "gauge"),
            ("shardcast_latest_step", "gauge"),
        ]:
            assert f"# HELP {name} " in text and f"# TYPE {name} {kind}\n" in text
        assert downloaded == manifest.total_size + 100
        assert sample(text, "shardcast_bytes_sent_total") == downloaded
        shards = "/v/{step}/shards/{file}/{index}"
        assert sample(text, "shardcast_requests_total", endpoint=shards, status="200") == len(all_shards(manifest))
        assert sample(text, "shardcast_requests_total", endpoint=shards, status="206") == 1
        assert sample(text, "shardcast_requests_total", endpoint=shards, status="404") == 1
        assert sample(text, "shardcast_requests_total", endpoint="/v/{step}/manifest.json", status="200") == 1
        assert sample(text, "shardcast_requests_total", endpoint="other", status="404") == 1
        assert sample(text, "shardcast_refused_total") == 0
        assert sample(text, "shardcast_in_flight") == 1  # this very request
        assert sample(text, "shardcast_versions") == 1
        assert sample(text, "shardcast_incoming_versions") == 1
        assert sample(text, "shardcast_latest_step") == STEP + 2

    serve(store, scenario)


def test_metrics_of_an_empty_store_report_no_latest_step(store: ShardStore) -> None:
    async def scenario(s: Served) -> None:
        text = (await s.get("/metrics")).body.decode()
        assert sample(text, "shardcast_latest_step") == -1
        assert sample(text, "shardcast_versions") == 0
        assert sample(text, "shardcast_bytes_sent_total") == 0

    serve(store, scenario)


def test_server_limits_refuse_nonsense() -> None:
    for bad in [
        {"max_connections": 0},
        {"max_per_client": 0},
        {"requests_per_s": 0},
        {"client_rate": -1},
        {"pending_wait": -1},
        {"max_wait": -0.5},
        {"max_long_polls": 0},
        {"max_long_polls_per_client": 0},
    ]:
        with pytest.raises(ValueError):
            ServerLimits(**bad)  # type: ignore[arg-type]
