"""Members upload signed files to a real coordinator while a stranger (or a member) attacks it: issue 32's acceptance.

    .venv/bin/python benchmarks/hostile_load.py [--seconds 30] [--connections 500] [--json PATH]

The coordinator runs in a process of its own (`tests.loopback_coordinator`: `CoordinatorService` behind
`CoordinatorApi`, served by `core.serving` as `prime-train run` serves it; its roles are a static member list, not a
chain: the attacks are on the server, which asks the chain nothing more for a known member). In this process, four
member workers upload a fresh, valid rollout file each every 0.25 s with the real client
(`protocol.coordinator.client.CoordinatorClient`, from 127.0.0.1), and a validator attests each stored file. In a third
process, the attacker runs one pattern at a time for `--seconds`, with at most `--connections` connections, from
eight loopback addresses (127.0.0.2-9) and reopening each connection the server closes:

- `baseline`: no attacker;
- `idle`: connections that send nothing;
- `slow_headers`: a request line, then one header byte a second;
- `slow_bodies`: unsigned `POST /v1/tasks` declaring 64 KiB, sent one byte a second;
- `unsigned_60mib`: unsigned `PUT /v1/rollouts/<hash>` declaring 60 MiB - 1, sent as fast as the server reads;
- `nonce_flood`: four member keys, each at its signer rate, asking for tasks and uploading junk (422), with the
  coordinator's nonce cache at 2,000 so that they fill it within the run.

Per pattern: the members' upload p50 and p99 (and the ratio to the baseline's), failed uploads and attestations, the
coordinator's RSS (peak during, and 5 s after the attacker stopped), its open descriptors (peak and after), and the
lines its log gained (tracebacks apart). The goals (issue 32): every upload succeeds with p99 under 1 s; peak RSS
under the baseline + 256 MiB and back to the baseline + 64 MiB after; no traceback storm. The machine's cores are
shared by the three processes, so every figure is contended. A benchmark: it exits 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the loopback coordinator is the tests' (tests/loopback_coordinator.py)

from eth_account import Account  # noqa: E402
from eth_account.signers.local import LocalAccount  # noqa: E402

from protocol.coordinator.client import ClientLimits, CoordinatorClient, CoordinatorError  # noqa: E402
from protocol.rollouts import NO_TARGET_LENGTH, RolloutMeta, RolloutRow, SamplingMeta, encode_rollouts  # noqa: E402
from protocol.signing import Attestation, SigningDomain, sign_request  # noqa: E402
from tests.loopback_coordinator import coordinator_process  # noqa: E402

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
POOL = 7
TRAINER = Account.from_key(b"\x41" * 32)
VALIDATOR = Account.from_key(b"\x42" * 32)
MEMBERS = [Account.from_key(bytes([0x50 + i]) * 32) for i in range(4)]
FLOODERS = [Account.from_key(bytes([0x60 + i]) * 32) for i in range(4)]
PATTERNS = ("baseline", "idle", "slow_headers", "slow_bodies", "unsigned_60mib", "nonce_flood")
ATTACKER_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 10)]
UPLOAD_EVERY = 0.25  # seconds between one member's uploads
MIB = 1024 * 1024


def member_file(node: str, counter: int) -> bytes:
    """A valid rollout file of `node`, about 100 KB, different for each counter."""
    rng = random.Random(counter)
    meta = RolloutMeta(
        pool_id=POOL,
        node=node,
        manifest_hash=b"\x01" * 32,
        sampling=SamplingMeta(temperature=1.0, top_p=1.0, max_tokens=16),
        task_spec_hash=b"\x02" * 32,
        model_hash=b"\x03" * 32,
        counter=counter,
        created_by="benchmarks/hostile_load.py",
    )
    rows = [
        RolloutRow(
            problem_id=f"p/{i // 2}",
            group=i // 2,
            input_tokens=[rng.randrange(96) for _ in range(4)],
            output_tokens=[rng.randrange(96) for _ in range(3)],
            output_logprobs=[-0.5, -0.25, -1.0],
            finish_reason="stop",
            reward=float(i % 2),
            task_reward=float(i % 2),
            length_penalty=0.0,
            target_length=NO_TARGET_LENGTH,
            seed=i,
            step=0,
            proofs=rng.randbytes(12_000),
        )
        for i in range(8)
    ]
    return encode_rollouts(meta, rows)


# --- the coordinator, seen from outside ----------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Sampler:
    """The coordinator's RSS and descriptors, sampled every 0.2 s while `running`."""

    pid: int
    peak_rss: float = 0.0
    peak_fds: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.peak_rss = max(self.peak_rss, rss_mib(self.pid))
            self.peak_fds = max(self.peak_fds, descriptors(self.pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)


# --- the members ---------------------------------------------------------------------------------------------------


@dataclass
class MemberLoad:
    latencies: list[float]
    failures: list[str]
    attest_failures: list[str]


async def members_upload(url: str, seconds: float, first_counter: int) -> MemberLoad:
    load = MemberLoad([], [], [])
    limits = ClientLimits(call_timeout=10.0, transfer_timeout=10.0)
    deadline = time.monotonic() + seconds
    async with contextlib.AsyncExitStack() as stack:
        validator = await stack.enter_async_context(
            CoordinatorClient.connect(url, VALIDATOR, DOMAIN, pool_id=POOL, limits=limits)
        )

        async def member(account: LocalAccount, index: int) -> None:
            client = await stack.enter_async_context(
                CoordinatorClient.connect(url, account, DOMAIN, pool_id=POOL, limits=limits)
            )
            counter = first_counter
            while time.monotonic() < deadline:
                data = member_file(account.address, counter * 16 + index)
                counter += 1
                work_key = hashlib.sha256(data).digest()
                started = time.monotonic()
                try:
                    await client.upload(work_key, data)
                except CoordinatorError as exc:
                    load.failures.append(str(exc)[:200])
                else:
                    load.latencies.append(time.monotonic() - started)
                    try:
                        await validator.attest(Attestation(POOL, work_key, True, 0))
                    except CoordinatorError as exc:
                        load.attest_failures.append(str(exc)[:200])
                await asyncio.sleep(max(0.0, UPLOAD_EVERY - (time.monotonic() - started)))

        await asyncio.gather(*(member(account, i) for i, account in enumerate(MEMBERS)))
    return load


# --- the attacker (a process of its own: `--attack PATTERN URL SECONDS CONNECTIONS`) ----------------------------


async def attack(pattern: str, url: str, seconds: float, connections: int) -> None:
    host_port = url.removeprefix("http://")
    host, port = host_port.split(":")
    deadline = time.monotonic() + seconds
    if pattern == "nonce_flood":
        await asyncio.gather(*(flood(url, account, deadline) for account in FLOODERS))
        return

    async def one(slot: int) -> None:
        source = ATTACKER_ADDRESSES[slot % len(ATTACKER_ADDRESSES)]
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
            except OSError:
                await asyncio.sleep(0.5)
                continue
            try:
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    await hold(pattern, host_port, reader, writer)
            except (TimeoutError, OSError):  # the pattern's deadline, or the server closed it: open the next one
                continue
            finally:
                writer.close()

    await asyncio.gather(*(one(slot) for slot in range(connections)))


async def hold(pattern: str, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One hostile connection, until the server closes it."""
    if pattern == "idle":
        await reader.read(1)
        return
    if pattern == "slow_headers":
        writer.write(f"PUT /v1/rollouts/{'0' * 64} HTTP/1.1\r\nHost: {host}\r\n".encode())
        for byte in b"X-Slow: " + b"a" * 10_000:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(1.0)
        return
    if pattern == "slow_bodies":
        writer.write(f"POST /v1/tasks HTTP/1.1\r\nHost: {host}\r\nContent-Length: 65536\r\n\r\n".encode())
        for _ in range(65536):
            writer.write(b"{")
            await writer.drain()
            if reader.at_eof():
                return
            await asyncio.sleep(1.0)
        return
    if pattern == "unsigned_60mib":
        size = 60 * MIB - 1
        path = f"/v1/rollouts/{secrets.token_hex(32)}"
        writer.write(f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = b"\0" * MIB
        for sent in range(0, size, MIB):
            writer.write(chunk[: min(MIB, size - sent)])
            await writer.drain()
        await reader.read()  # then hold, until the server closes
        return
    raise ValueError(f"unknown pattern {pattern}")


async def flood(url: str, account: LocalAccount, deadline: float) -> None:
    """A member's signed requests as fast as its signer rate lets them in: tasks (200) and junk uploads (422)."""
    import aiohttp

    host = url.removeprefix("http://")
    connector = aiohttp.TCPConnector(local_addr=(ATTACKER_ADDRESSES[FLOODERS.index(account)], 0), limit=8)
    async with aiohttp.ClientSession(connector=connector) as session:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            if i % 4:
                path, method, body = "/v1/tasks", "POST", b"{}"
            else:
                body = b"junk %d" % i
                path, method = f"/v1/rollouts/{hashlib.sha256(body).hexdigest()}", "PUT"
            headers = sign_request(account, DOMAIN, method, path, body, pool_id=POOL, host=host)
            try:
                async with session.request(method, url + path, data=body, headers=headers) as response:
                    await response.read()
                    if response.status == 429:
                        await asyncio.sleep(float(response.headers.get("Retry-After", "0.02")))
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)


# --- one pattern, and the run --------------------------------------------------------------------------------------


@dataclass
class Figures:
    pattern: str
    uploads: int
    failed_uploads: int
    failed_attestations: int
    p50_s: float
    p99_s: float
    peak_rss_mib: float
    after_rss_mib: float
    peak_fds: int
    after_fds: int
    log_lines: int
    tracebacks: int
    first_failure: str
    log_sample: list[str]


async def run_pattern(
    pattern: str, url: str, pid: int, log: Path, seconds: float, connections: int, counter: int
) -> Figures:
    lines_before = len(log.read_text(errors="replace").splitlines())
    stop = asyncio.Event()
    sampler = Sampler(pid)
    sampling = asyncio.create_task(sampler.run(stop))
    attacker = None
    if pattern != "baseline":
        attacker = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--attack", pattern, url, str(seconds), str(connections)
        )
        await asyncio.sleep(2.0)  # the attack in place before the members start
    load = await members_upload(url, seconds - (2.0 if attacker else 0.0), counter)
    if attacker is not None:
        await attacker.wait()
    stop.set()
    await sampling
    await asyncio.sleep(5.0)  # the server lets go of what the attack held
    text = log.read_text(errors="replace").splitlines()[lines_before:]
    latencies = sorted(load.latencies) or [float("nan")]
    return Figures(
        pattern=pattern,
        uploads=len(load.latencies),
        failed_uploads=len(load.failures),
        failed_attestations=len(load.attest_failures),
        p50_s=statistics.median(latencies),
        p99_s=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        peak_rss_mib=sampler.peak_rss,
        after_rss_mib=rss_mib(pid),
        peak_fds=sampler.peak_fds,
        after_fds=descriptors(pid),
        log_lines=len(text),
        tracebacks=sum("Traceback" in line for line in text),
        first_failure=(load.failures or load.attest_failures or [""])[0],
        log_sample=text[:6],
    )


def report(rows: list[Figures]) -> None:
    base = rows[0]
    print(
        f"{'pattern':<15} {'uploads':>7} {'failed':>6} {'p50 s':>7} {'p99 s':>7} {'p99/base':>8} "
        f"{'RSS peak':>9} {'RSS after':>9} {'fds peak':>8} {'fds after':>9} {'log':>5} {'tb':>4}  goals"
    )
    for row in rows:
        ok = (
            row.failed_uploads == 0
            and row.failed_attestations == 0
            and row.p99_s < 1.0
            and row.peak_rss_mib < base.peak_rss_mib + 256
            and row.after_rss_mib < base.after_rss_mib + 64
            and row.tracebacks == 0
        )
        print(
            f"{row.pattern:<15} {row.uploads:>7} {row.failed_uploads + row.failed_attestations:>6} "
            f"{row.p50_s:>7.3f} {row.p99_s:>7.3f} {row.p99_s / base.p99_s:>8.2f} {row.peak_rss_mib:>8.0f}M "
            f"{row.after_rss_mib:>8.0f}M {row.peak_fds:>8} {row.after_fds:>9} {row.log_lines:>5} {row.tracebacks:>4}  "
            f"{'met' if ok else 'NOT met'}"
        )
        if row.first_failure:
            print(f"    first failure: {row.first_failure}")
        for line in row.log_sample if row.tracebacks else []:
            print(f"    log: {line[:200]}")


async def run_all(root: Path, seconds: float, connections: int, patterns: list[str]) -> list[Figures]:
    """Each pattern in turn against one coordinator (its files under `root`), after a warm-up."""
    with coordinator_process(
        root / "coordinator",
        DOMAIN,
        trainer=TRAINER,
        members=[m.address for m in MEMBERS + FLOODERS],
        validator=VALIDATOR.address,
        pool_id=POOL,
        config={"max_nonces": 2000},
    ) as server:
        print(f"coordinator {server.url} (pid {server.pid}); {seconds:g} s a pattern, {connections} connections")
        warm = await members_upload(server.url, 5.0, 1_000_000)  # the parsing processes started, the code paths run
        print(f"  warm-up: {len(warm.latencies)} uploads, {len(warm.failures)} failed", flush=True)
        rows = []
        for n, pattern in enumerate(patterns):
            rows.append(
                await run_pattern(pattern, server.url, server.pid, server.log, seconds, connections, n * 10_000)
            )
            print(f"  {pattern}: done", flush=True)
        return rows


def main(seconds: float, connections: int, patterns: list[str], json_path: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(run_all(Path(tmp), seconds, connections, patterns))
    report(rows)
    if json_path is not None:
        json_path.write_text(json.dumps([asdict(row) for row in rows], indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each pattern runs (default 30)")
    parser.add_argument("--connections", type=int, default=500, help="the attacker's connections (default 500)")
    parser.add_argument("--patterns", default=",".join(PATTERNS), help="which patterns, baseline first")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.add_argument(
        "--attack", nargs=4, metavar=("PATTERN", "URL", "SECONDS", "CONNECTIONS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.attack:
        pattern, url, attack_seconds, attack_connections = args.attack
        asyncio.run(attack(pattern, url, float(attack_seconds), int(attack_connections)))
    else:
        chosen = args.patterns.split(",")
        if chosen[0] != "baseline" or any(p not in PATTERNS for p in chosen):
            parser.error(f"--patterns: baseline first, then any of {', '.join(PATTERNS[1:])}")
        if args.seconds < 5 or not 1 <= args.connections <= 500:
            parser.error("--seconds must be at least 5 and --connections 1 to 500")
        main(args.seconds, args.connections, chosen, args.json)
