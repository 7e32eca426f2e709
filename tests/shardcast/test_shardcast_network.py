"""SHARDCAST end to end: origin, relays and clients as separate processes on loopback, through the CLI.

These pin the acceptance list of the SHARDCAST issue: a corrupting relay is caught and routed around, a
manifest of another signer is refused, a SIGKILLed client resumes without re-fetching what it verified
and never exposes a partial directory, a relay killed mid-download leaves the client finishing from the
others, and a new version crosses a tree of relays by long-poll, not by polling intervals.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcast.rebuild import SIGNED_MANIFEST_NAME
from tests.anvil_deployment import write_anvil_deployment

REPO = Path(__file__).resolve().parents[2]
TRAINER = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"  # anvil dev key 0, the origin's signer
OTHER = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"  # anvil dev key 1
MIB = 1024 * 1024
SHARD = MIB

pytestmark = pytest.mark.slow


class Network:
    """Processes started by one test, all killed at its end; logs under `root/logs`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir()
        self.deployment = write_anvil_deployment(root / "deployment.json")
        self.watch = root / "checkpoints"
        self.watch.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (the child holds it)
        proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli.main", *args, "--deployment", str(self.deployment)],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )
        self.procs.append(proc)
        return proc

    def url_of(self, name: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
        """The URL a server printed on start-up (it listens on port 0)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"on (http://127\.0\.0\.1:[0-9]+)", self.log(name))
            if match:
                return match.group(1)
            assert proc.poll() is None, f"{name} exited: {self.log(name)}"
            time.sleep(0.05)
        raise AssertionError(f"{name} did not start: {self.log(name)}")

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def origin(self, *extra: str) -> str:
        proc = self.spawn(
            "origin",
            "origin",
            "--data",
            str(self.root / "origin"),
            "--watch",
            str(self.watch),
            "--pool",
            "0",
            "--dev-key",
            "0",
            "--port",
            "0",
            "--shard-size",
            str(SHARD),
            "--delta-min-mib",  # every step of any size also as a delta, where one is smaller (issue 36)
            "0",
            *extra,
        )
        return self.url_of("origin", proc)

    def relay(self, name: str, *upstreams: str, extra: tuple[str, ...] = ()) -> tuple[str, subprocess.Popen[bytes]]:
        ups = [a for u in upstreams for a in ("--upstream", u)]
        proc = self.spawn(
            name, "relay", "--data", str(self.root / name), *ups, "--trainer", TRAINER, "--port", "0", *extra
        )
        return self.url_of(name, proc), proc

    def fetch(
        self, name: str, out: Path, *sources: str, trainer: str = TRAINER, extra: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        srcs = [a for s in sources for a in ("--source", s)]
        return self.spawn(
            name, "fetch-weights", *srcs, "--trainer", trainer, "--out", str(out), "--quiet", "--parallel", "4", *extra
        )

    def publish(self, step: int, size: int, seed: int) -> Path:
        """Write a checkpoint elsewhere and rename it into the watched folder, as a trainer must."""
        staging = self.root / f"staging_{step}"
        staging.mkdir()
        (staging / "model.safetensors").write_bytes(random_bytes(size, seed))
        (staging / "config.json").write_text(json.dumps({"step": step}))
        final = self.watch / f"step_{step}"
        os.rename(staging, final)
        return final

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def random_bytes(size: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * (MIB // 32)
    return b"".join(hashlib.sha256(block + i.to_bytes(4, "big")).digest() + block[32:] for i in range(-(-size // MIB)))[
        :size
    ]


def get_json(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=40) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def wait_complete(url: str, step: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if {"step": step, "complete": True} in get_json(f"{url}/versions")["versions"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"{url} did not complete step {step}")


def journal_lines(partial: Path) -> int:
    try:
        return (partial / ".shardcast-journal").read_text().count("\n")
    except FileNotFoundError:
        return 0


def wait_journal(partial: Path, lines: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = journal_lines(partial)
        if count >= lines:
            return count
        assert proc.poll() is None, "the download ended before it could be interrupted"
        time.sleep(0.01)
    raise AssertionError(f"{partial} never had {lines} shards")


def assert_same_checkpoint(got: Path, want: Path) -> None:
    # fetch_checkpoint's folder also keeps the manifest it was fetched by, as the base of a later step's delta
    assert sorted(p.name for p in got.iterdir() if p.name != SIGNED_MANIFEST_NAME) == sorted(
        p.name for p in want.iterdir()
    )
    for p in want.iterdir():
        assert (got / p.name).read_bytes() == p.read_bytes(), p.name


def corrupt_shards(
    net: Network, relay: str, *, first: int, every: int, at: int, step: int = 1, file: str = "model.safetensors"
) -> None:
    """Flip byte `at` of shards first, first + every, ... of `file` of `step` on `relay`'s disk, after it verified
    them: from then on it serves those shards wrong."""
    stored = net.root / relay / "v" / str(step) / file
    data = bytearray(stored.read_bytes())
    for offset in range(first * SHARD, len(data), every * SHARD):
        data[offset + at] ^= 0xFF
    stored.write_bytes(bytes(data))


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Network]:
    network = Network(tmp_path)
    try:
        yield network
    finally:
        network.close()


@pytest.mark.parametrize(("manifest_format", "shard_hash"), [("2", "blake3"), ("1", "sha256")])
def test_a_corrupting_relay_is_caught_and_the_checkpoint_is_byte_identical(
    net: Network, manifest_format: str, shard_hash: str
) -> None:
    """In either manifest format the origin signs (`--manifest-format 1` for a pool of nodes older than format 2),
    a relay mirrors it and a client catches the relay's bad bytes by that format's shard hash."""
    origin = net.origin("--manifest-format", manifest_format)
    source = net.publish(1, 12 * MIB, seed=1)
    relay, _ = net.relay("relay", origin)
    wait_complete(relay, 1)
    corrupt_shards(net, "relay", first=0, every=1, at=7)  # its disk goes bad after it verified the version

    out = net.root / "out"
    proc = net.fetch("client", out, relay, origin, extra=("--step", "1"))
    assert proc.wait(timeout=120) == 0, net.log("client")
    assert_same_checkpoint(out / "step_1", source)
    log = net.log("client")
    assert f"dropping source {relay}" in log and f"failed its {shard_hash}" in log
    assert metric(origin, "shardcast_bytes_sent_total") >= 12 * MIB - SHARD  # the origin carried nearly all


def test_with_deltas_a_corrupting_relay_is_caught_and_the_client_rebuilds_the_step_byte_identical(net: Network) -> None:
    """Issue 36 through the processes a pool runs: the origin publishes step 2 whole and as a delta against step 1,
    a relay mirrors both, its disk then corrupts both step 2's delta and its model, and a client holding step 1
    fetches step 2 from the relay and the origin: it drops the relay, rebuilds from the origin's copy of the delta,
    and has the trainer's bytes."""
    origin = net.origin()
    source = net.publish(1, 12 * MIB, seed=1)
    out = net.root / "out"
    first = net.fetch("first", out, origin, extra=("--step", "1"))
    assert first.wait(timeout=120) == 0, net.log("first")
    words = bytearray((source / "model.safetensors").read_bytes())
    # one byte in 4 changed, to random values: a delta of 3 shards or more, so that the client's 4 transfers (2 at
    # most a source) take shards of it from both sources
    words[::4] = os.urandom(len(words[::4]))
    staging = net.root / "staging_2"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(bytes(words))
    (staging / "config.json").write_text(json.dumps({"step": 1}))
    os.rename(staging, net.watch / "step_2")
    relay, _ = net.relay("relay", origin)
    wait_complete(relay, 2)
    delta = "model.safetensors.scdelta"
    assert 3 * SHARD < (net.root / "relay" / "v" / "2" / delta).stat().st_size < 12 * MIB // 2  # beside the step
    corrupt_shards(net, "relay", first=0, every=1, at=7, step=2, file=delta)
    corrupt_shards(net, "relay", first=0, every=1, at=7, step=2)

    before = metric(origin, "shardcast_bytes_sent_total")  # the relay's mirroring included
    proc = net.fetch("client", out, relay, origin, extra=("--step", "2"))
    assert proc.wait(timeout=120) == 0, net.log("client")
    assert_same_checkpoint(out / "step_2", net.watch / "step_2")
    log = net.log("client")
    assert f"dropping source {relay}" in log and "failed its blake3" in log
    assert metric(origin, "shardcast_bytes_sent_total") - before < 12 * MIB // 2  # the delta, not step 2 whole


def test_a_manifest_not_signed_by_the_expected_trainer_is_refused(net: Network) -> None:
    origin = net.origin()
    net.publish(1, 2 * MIB, seed=2)
    wait_complete(origin, 1)
    out = net.root / "out"
    proc = net.fetch("client", out, origin, trainer=OTHER)
    assert proc.wait(timeout=60) == 1
    assert f"signed by {TRAINER}, not by the trainer {OTHER}" in net.log("client")
    assert not out.exists() or list(out.iterdir()) == []

    # a relay told to trust OTHER does not mirror the version at all
    relay, _ = net.relay("relay", origin, extra=("--trainer", OTHER))
    time.sleep(1.5)
    assert get_json(f"{relay}/versions")["versions"] == []
    assert "untrusted manifest" in net.log("relay")


def test_a_sigkilled_client_resumes_and_never_exposes_a_partial_directory(net: Network) -> None:
    origin = net.origin("--client-rate", "6")  # MB/s: slow enough to interrupt
    source = net.publish(1, 16 * MIB, seed=3)
    wait_complete(origin, 1)
    out = net.root / "out"
    final, partial = out / "step_1", out / "step_1.partial"

    first = net.fetch("first", out, origin)
    wait_journal(partial, 4, first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    journal = (partial / ".shardcast-journal").read_text().splitlines()
    done_bytes = SHARD * sum(line.endswith("\tmodel.safetensors") for line in journal)  # whole MiB shards
    assert not final.exists() and partial.is_dir()
    while metric(origin, "shardcast_in_flight") > 1:  # the origin notices the dead connections (1: this request)
        time.sleep(0.05)
    sent_before = metric(origin, "shardcast_bytes_sent_total")

    seen_partial_final = []

    def watch_final() -> None:  # the final path is either absent or the whole checkpoint
        while second.poll() is None:
            if final.exists():
                sizes = {p.name: p.stat().st_size for p in final.iterdir() if p.name != SIGNED_MANIFEST_NAME}
                if sizes != {p.name: p.stat().st_size for p in source.iterdir()}:
                    seen_partial_final.append(sizes)
            time.sleep(0.002)

    second = net.fetch("second", out, origin)
    watcher = threading.Thread(target=watch_final)
    watcher.start()
    assert second.wait(timeout=120) == 0, net.log("second")
    watcher.join()
    assert seen_partial_final == []
    assert_same_checkpoint(final, source)
    assert not partial.exists()
    resent = metric(origin, "shardcast_bytes_sent_total") - sent_before
    assert done_bytes > 0
    assert resent <= 16 * MIB + 100 - done_bytes  # the shards verified before the kill were not fetched again


def test_killing_the_relay_a_client_downloads_from_leaves_the_others_to_finish(net: Network) -> None:
    origin = net.origin()
    source = net.publish(1, 16 * MIB, seed=4)
    relay1, proc1 = net.relay("relay1", origin, extra=("--client-rate", "4"))
    relay2, _ = net.relay("relay2", origin, extra=("--client-rate", "4"))
    wait_complete(relay1, 1)
    wait_complete(relay2, 1)
    out = net.root / "out"
    client = net.fetch("client", out, relay1, relay2)
    wait_journal(out / "step_1.partial", 3, client)
    assert metric(relay1, "shardcast_bytes_sent_total") > 0  # it was serving this client
    proc1.send_signal(signal.SIGKILL)
    assert client.wait(timeout=120) == 0, net.log("client")
    assert_same_checkpoint(out / "step_1", source)


def test_a_new_version_crosses_a_relay_tree_to_leaf_clients_without_polling_delays(net: Network) -> None:
    origin = net.origin()
    net.publish(1, 2 * MIB, seed=5)
    relay_a, _ = net.relay("relay_a", origin)
    relay_b, _ = net.relay("relay_b", origin)
    leaf, _ = net.relay("relay_c", relay_a, relay_b)
    wait_complete(leaf, 1)

    clients = [
        net.fetch(f"client{i}", net.root / f"out{i}", leaf, extra=("--after", "1", "--wait", "60")) for i in range(2)
    ]
    seen: list[float] = []
    poller = threading.Thread(
        target=lambda: (get_json(f"{leaf}/versions?after=1&wait=30"), seen.append(time.monotonic()))
    )
    poller.start()
    time.sleep(3.0)  # clients and the poller are parked in their long-polls

    published = time.monotonic()
    source = net.publish(2, 4 * MIB, seed=6)
    poller.join(timeout=30)
    assert seen, "the leaf relay never announced step 2"
    latency = seen[0] - published
    assert latency < 1.0, f"step 2 reached the leaf relay after {latency:.2f} s"  # two hops of long-poll
    for i, client in enumerate(clients):
        assert client.wait(timeout=120) == 0, net.log(f"client{i}")
        assert_same_checkpoint(net.root / f"out{i}" / "step_2", source)
    assert metric(leaf, "shardcast_mirror_failures_total") == 0


@pytest.mark.parametrize("memory_when", ["pressed", "always"])
def test_a_relay_killed_while_serving_cut_through_never_serves_an_unverified_byte(
    net: Network, memory_when: str
) -> None:
    """Issue 23: a relay serves each shard once it verified it, while later shards still arrive. Here its upstream
    sends a wrong byte in shards 9, 11, 13 and 15: those bytes land where the relay receives (its partial file, or
    with `--memory-when always` its memory window), unverified, and must never leave it. Readers ask the relay for
    every shard as soon as it lists the version and compare each byte (a shard not yet written would read as
    zeros); then the relay is SIGKILLed while readers and a client wait on it, and the client finishes from the
    origin."""
    origin = net.origin()
    source = net.publish(1, 16 * MIB, seed=6)
    corrupt, _ = net.relay("corrupt", origin, extra=("--client-rate", "4"))  # MB/s: the relay mirrors for seconds
    wait_complete(corrupt, 1)
    corrupt_shards(net, "corrupt", first=9, every=2, at=11)  # wrong from their 12th byte on
    truth = (source / "model.safetensors").read_bytes()
    served: list[int] = []  # shards the relay sent whole
    wrong: list[int] = []  # shards of which the relay sent a byte that is not the checkpoint's

    def read_shard(index: int) -> None:
        url = f"{relay}/v/1/shards/model.safetensors/{index}"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    got = response.read()
            except urllib.error.HTTPError as exc:
                if exc.code not in (404, 429, 503):  # no such version here yet; busy; not mirrored yet
                    wrong.append(index)
                    return
                time.sleep(0.05)
                continue
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException):
                return  # the relay was killed
            if got != truth[index * SHARD : index * SHARD + len(got)]:
                wrong.append(index)
            elif len(got) == SHARD:
                served.append(index)
            return

    relay, proc = net.relay("relay", corrupt, extra=("--memory-when", memory_when))
    readers = [threading.Thread(target=read_shard, args=(i,)) for i in range(16)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 60
    while f"dropping source {corrupt}" not in net.log("relay") and time.monotonic() < deadline:
        time.sleep(0.02)  # until the bad bytes of shard 9 are in its partial file, refused
    assert wrong == []
    assert len(served) >= 4 and not {9, 11, 13, 15} & set(served), served  # verified shards, while it had not all
    out = net.root / "out"
    client = net.fetch("client", out, relay, origin)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)  # the readers of shards it never verified, and the client, are waiting on it
    for reader in readers:
        reader.join(timeout=60)
    assert wrong == []
    assert client.wait(timeout=120) == 0, net.log("client")
    assert_same_checkpoint(out / "step_1", source)
    if memory_when == "always":  # every shard it served came from memory: none was written behind, or journalled
        assert journal_lines(net.root / "relay" / "v" / "1.partial") == 0
