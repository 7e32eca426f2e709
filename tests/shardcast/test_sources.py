"""Sources kept across downloads: learned from adverts, scored by what they deliver, capped, expiring.

The rules run against a fake clock; the last test runs downloads through real servers on loopback, with two
hostile relays advertised next to the honest origin.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from aiohttp import web

from shardcast.client import fetch_checkpoint
from shardcast.sources import Source, SourcePool
from shardcast.store import ShardStore
from tests.shardcast.test_client import (
    MIB,
    POLICY,
    assert_same,
    honest,
    hostile,
    junk_versions,
    make_checkpoint,
    publish,
    serve,
)

ORIGIN = "http://origin:8700"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def relay(i: int) -> str:
    return f"http://relay-{i}:8701"


def delivered(url: str) -> Source:
    return Source(url, received=1, throughput=5e6)


def failed(url: str) -> Source:
    return Source(url, failures=1)


def test_an_advert_joins_the_pool_once_and_expires_without_fresh_adverts() -> None:
    clock = Clock()
    pool = SourcePool([ORIGIN], ttl=60, clock=clock)
    assert pool.advertise(relay(1) + "/", "peer-a")
    assert pool.advertise(relay(1), "peer-b")  # known: only its expiry moves
    assert not pool.advertise(ORIGIN, "peer-a")  # configured already
    assert not pool.advertise("ftp://relay-9", "peer-a") and not pool.advertise("http://", "peer-a")
    assert pool.urls() == [ORIGIN, relay(1)]
    clock.now += 50
    assert pool.advertise(relay(1), "peer-a")
    clock.now += 50
    assert pool.urls() == [ORIGIN, relay(1)]  # 50 s after its last advert
    clock.now += 11
    assert pool.urls() == [ORIGIN]


def test_one_advertiser_gets_only_its_share_of_the_pool() -> None:
    pool = SourcePool([ORIGIN], max_learned=8, max_per_advertiser=2, clock=Clock())
    assert [pool.advertise(relay(i), "mallory") for i in range(4)] == [True, True, False, False]
    assert pool.advertise(relay(9), "alice")
    assert pool.urls() == [ORIGIN, relay(0), relay(1), relay(9)]


def test_a_full_pool_keeps_sources_that_delivered_and_replaces_those_that_did_not() -> None:
    pool = SourcePool([ORIGIN], max_learned=2, clock=Clock())
    assert pool.advertise(relay(1), "a") and pool.advertise(relay(2), "b")
    pool.settle([delivered(relay(1)), delivered(relay(2))])
    assert not pool.advertise(relay(3), "c")  # both proved useful: a new advert waits for room
    pool.settle([failed(relay(2))])  # relay 2: +1 then -1
    assert pool.advertise(relay(3), "c")  # takes relay 2's place, never relay 1's
    assert pool.urls() == [ORIGIN, relay(1), relay(3)]


def test_an_offence_drops_a_learned_source_and_refuses_its_adverts_for_a_while() -> None:
    clock = Clock()
    pool = SourcePool([ORIGIN], ttl=60, deny_for=600, clock=clock)
    pool.advertise(relay(1), "a")
    bad = Source(relay(1))
    bad.convict("sent shard model.safetensors[3] that failed its sha256")
    origin = Source(ORIGIN)
    origin.convict("a configured source is never dropped")
    pool.settle([bad, origin])
    assert pool.urls() == [ORIGIN] and pool.denied(relay(1))
    assert not pool.advertise(relay(1), "b")
    clock.now += 601
    assert pool.advertise(relay(1), "b")


def test_a_learned_source_failing_download_after_download_is_dropped() -> None:
    clock = Clock()
    pool = SourcePool([ORIGIN], max_strikes=3, ttl=60, clock=clock)
    pool.advertise(relay(1), "a")
    for _ in range(2):
        pool.settle([failed(relay(1))])
    pool.settle([delivered(relay(1))])  # strikes count downloads in a row
    for _ in range(2):
        pool.settle([failed(relay(1))])
    assert pool.urls() == [ORIGIN, relay(1)]
    pool.settle([failed(relay(1))])
    assert pool.urls() == [ORIGIN] and not pool.advertise(relay(1), "a")
    clock.now += 61
    assert pool.advertise(relay(1), "a")


def test_a_download_starts_from_the_throughput_measured_by_the_last_one() -> None:
    pool = SourcePool([ORIGIN], clock=Clock())
    pool.advertise(relay(1), "a")
    pool.settle([Source(ORIGIN, throughput=2e6), delivered(relay(1))])
    assert {s.url: s.throughput for s in pool.checkout()} == {ORIGIN: 2e6, relay(1): 5e6}
    assert all(s.banned is None and s.failures == 0 for s in pool.checkout())


def test_pool_limits_refuse_nonsense() -> None:
    for bad in [{"max_per_advertiser": 0}, {"max_strikes": 0}, {"ttl": 0}, {"max_learned": -1}]:
        with pytest.raises(ValueError):
            SourcePool([ORIGIN], **bad)  # type: ignore[arg-type]


def test_downloads_through_a_pool_with_hostile_advertised_relays_succeed_and_drop_them(tmp_path: Path) -> None:
    # adverts joined the sources for good, and each hostile relay could fail downloads; the worker exits after
    # 20 failed iterations in a row
    async def corrupt(request: web.Request, data: bytes) -> web.StreamResponse:
        return web.Response(body=bytes([data[0] ^ 1]) + data[1:])

    async def scenario() -> tuple[list[Path], SourcePool, list[str]]:
        store = ShardStore(tmp_path / "store")
        checkpoints = [make_checkpoint(tmp_path / f"c{step}", 2 * MIB, seed=step) for step in (1, 2, 3)]
        publish(store, checkpoints[0], 1)
        origin_url, origin = await honest(store)
        corrupt_url, corrupt_runner = await serve(hostile(store, corrupt))
        junk_url, junk_runner = await serve(junk_versions(range(100, 108), store))
        pool = SourcePool([origin_url])
        assert pool.advertise(corrupt_url, "mallory") and pool.advertise(junk_url, "mallory")
        paths = []
        try:
            for step in (1, 2, 3):
                if step > 1:
                    publish(store, checkpoints[step - 1], step)
                paths.append(await fetch_checkpoint(pool, POLICY, tmp_path / "out", step=None))
            refused = [url for url in (corrupt_url, junk_url) if not pool.advertise(url, "mallory")]
        finally:
            await origin.stop()
            await corrupt_runner.cleanup()
            await junk_runner.cleanup()
        return paths, pool, refused

    random.seed(3)  # the sources are picked at random: 8 shards in parallel make missing the bad relay unlikely
    paths, pool, refused = asyncio.run(scenario())
    assert [p.name for p in paths] == ["step_1", "step_2", "step_3"]
    for step, path in enumerate(paths, start=1):
        assert_same(path, tmp_path / f"c{step}")
    assert len(pool.urls()) == 1 and len(refused) == 2  # both hostile relays out, and their adverts refused
