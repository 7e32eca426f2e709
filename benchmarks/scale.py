"""The real coordinator under N simulated workers: requests/s, latency per route, errors, CPU and memory per N.

Run: `.venv/bin/python benchmarks/scale.py` (N = 10, 100, 1,000 in one invocation, one file per worker every 30 s,
a GPU worker's pace on a 7B-32B model), or `--quick` for a short run; `--sizes`, `--file-every`, `--duration`,
`--ramp-steps`, `--ramp-seconds` and `--json PATH` change what is run and where the figures go.
`--validators K[,K...]` measures validators sharing a pool instead (benchmarks/scale_validators.py).

What runs, and why so:
- anvil with one pool and max(N) registered, staked member nodes (`benchmarks/scale_pool.py`, batched so that 1,000
  members take seconds), and validators appointed on chain;
- one `prime-train run` in network mode, a process of its own: its CPU (with its parsing children) is read from
  /proc before and after each phase, so the load generator's CPU never counts as the coordinator's;
- in this process, N workers on one event loop, each with its own key, its own client session and its own source
  address on loopback (127.0.x.y: the coordinator limits requests per address, and real workers have one each),
  each going through the worker's protocol with the real client
  (`protocol.coordinator.client.CoordinatorClient`): ask for a
  task (the trainer's signed assignment), "generate" for `--file-every` seconds, upload a rollout file made for that
  assignment (node, counter, signature, step) and held back and retried as a worker is (429 with Retry-After, 503
  `no_work`). The files are re-encoded from rows the tiny model generated once before the run: no model runs while
  the load does;
- appointed validators accept every stored file (`POST /v1/attestations`), so the trainer trains and publishes steps
  as it does in a pool, in the coordinator's process: training's share of the event loop shows in the latencies;
- after each N's steady phase, a ramp doubles the pool's file rate every `--ramp-seconds` until a route's p99 passes
  200 ms, a request fails, or the load falls short of its target: the last step that held is where it saturates.

The machine has 2 cores: the load generator, anvil and the coordinator share them, so every figure is contended;
the load generator's own CPU is printed beside the coordinator's. A benchmark, not a test: it exits 0 whatever the
figures (tests/test_scale_benchmark.py runs its machinery briefly so that it cannot rot).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests/ holds the trainer.toml writer and the rollout factory

from benchmarks.scale_pool import Pool, setup_pool  # noqa: E402
from protocol.coordinator.client import (  # noqa: E402
    ClientLimits,
    CoordinatorBusy,
    CoordinatorClient,
    CoordinatorRefused,
    CoordinatorUnavailable,
    NoWorkYet,
)
from protocol.plan import Job  # noqa: E402
from protocol.rollouts import RolloutRow, encode_rollouts, read_rollouts  # noqa: E402
from protocol.rollouts.meta import RolloutMeta  # noqa: E402
from protocol.signing import Attestation, SigningDomain  # noqa: E402

P99_LIMIT = 0.200  # seconds: the goal's p99, and where the ramp stops
PROMPTS, GROUP = 8, 8  # an assignment's shape: a pool's default terms (protocol.terms), 64 completions a file
TASKS, UPLOAD, ATTEST = "POST /v1/tasks", "PUT /v1/rollouts", "POST /v1/attestations"
HELD = "503 no_work"  # the coordinator holding a worker over its step's assignments: by design, not an error
T = TypeVar("T")


# --- the rollout files ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileMaker:
    """Rollout files for any assignment from one generated file: its rows, with the assignment's node, counter,
    signature and step. The coordinator checks the node and pool in the file against the signer; a validator would
    also check the problems against the assignment, which this never meets."""

    meta: RolloutMeta
    rows: tuple[RolloutRow, ...]

    @classmethod
    def generate(cls, root: Path) -> FileMaker:
        """Generates one file with the tiny model (the only time a model runs), returns its maker."""
        from engine.model.loading import load_model
        from engine.model.tiny import init_model
        from protocol.tasks.sources import open_source
        from protocol.tasks.spec import load_task_spec
        from tests.network_trainer import TASK
        from tests.trainer.rollout_factory import make_file

        model = init_model(root / "tiny", seed=0)
        spec = load_task_spec(TASK)
        path = make_file(
            root / "template.parquet", load_model(model), spec, open_source(spec), step=0, counter=0,
            prompts=PROMPTS, group_size=GROUP,
        )  # fmt: skip
        read = read_rollouts(path, max_bytes=1 << 26)
        return cls(read.meta, tuple(read.rows))

    def make(self, job: Job) -> bytes:
        meta = dataclasses.replace(
            self.meta, pool_id=job.pool_id, node=job.node, counter=job.counter, assignment_signature=job.signature,
            assignment_issued_at=job.issued_at,
        )  # fmt: skip
        return encode_rollouts(meta, [dataclasses.replace(row, step=job.step) for row in self.rows])


# --- what the load saw ------------------------------------------------------------------------------------------


@dataclass
class Recorder:
    """Latencies of answered requests per route, and every outcome per route ("ok", "429 rate_limited" ...)."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)

    async def call(self, route: str, action: Awaitable[T]) -> T | Exception:
        """Runs one client call; its answer, or the exception it raised (recorded by its code)."""
        started = time.perf_counter()
        try:
            result = await action
        except (CoordinatorRefused, CoordinatorUnavailable) as exc:
            self.outcomes[route, outcome_of(exc)] += 1
            self.latencies.setdefault(route, []).append(time.perf_counter() - started)
            return exc
        self.outcomes[route, "ok"] += 1
        self.latencies.setdefault(route, []).append(time.perf_counter() - started)
        return result

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    def answered(self) -> int:
        return sum(n for (_, code), n in self.outcomes.items() if code == "ok")

    def errors(self) -> Counter[str]:
        """Every outcome but success and a hold, by route and code."""
        return Counter({f"{r}: {c}": n for (r, c), n in self.outcomes.items() if c not in ("ok", HELD)})

    def held(self) -> int:
        return sum(n for (_, code), n in self.outcomes.items() if code == HELD)


def outcome_of(exc: Exception) -> str:
    if isinstance(exc, NoWorkYet):
        return HELD
    if isinstance(exc, CoordinatorBusy):
        return f"429 {exc.code}"
    if isinstance(exc, CoordinatorRefused):
        return f"{exc.status} {exc.code}"
    return f"unavailable ({str(exc)[:60]})"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the coordinator's process ----------------------------------------------------------------------------------


@dataclass
class Usage:
    """CPU seconds and resident memory of a process and its children (the trainer's upload parsers)."""

    cpu: float
    cpu_with_children: float
    rss: int
    rss_with_children: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        main_cpu, main_rss = _proc_stat(pid)
        cpu, rss = main_cpu, main_rss
        for child in _children(pid):
            with contextlib.suppress(OSError):
                child_cpu, child_rss = _proc_stat(child)
                cpu, rss = cpu + child_cpu, rss + child_rss
        return cls(main_cpu, cpu, main_rss, rss)


def _proc_stat(pid: int) -> tuple[float, int]:
    """(user + system CPU seconds, RSS bytes) of `pid`, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


@dataclass
class Coordinator:
    process: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def write_trainer_toml(root: Path, model: Path, pool: Pool, rollouts_per_step: int) -> Path:
    """A network-mode trainer.toml for `pool`: free ports, the pool's terms and its own derived
    limits (assignments per node and step, the stored-upload quota), steps enough never to end."""
    from tests.network_trainer import TomlValue, trainer_toml

    path = root / "trainer.toml"
    coordinator: dict[str, TomlValue] = {"port": 0}  # the assignment's shape is the pool's (PROMPTS x GROUP)
    path.write_text(
        trainer_toml(
            model,
            steps=1_000_000,
            async_level=2,
            rollouts_per_step=rollouts_per_step,
            coordinator=coordinator,
            shardcast={"port": 0},
            pool={"id": pool.pool_id, "deployment": "deployment.json"},
        )
    )
    return path


def start_coordinator(root: Path, pool: Pool, rollouts_per_step: int, *, timeout: float = 180.0) -> Coordinator:
    """`prime-train run` in network mode in its own process group; returns once it serves. With
    PRIME_SCALE_PROFILE=PATH in the environment it runs under cProfile, written to PATH when it stops (SIGTERM)."""
    write_trainer_toml(root, root / "tiny", pool, rollouts_per_step)
    profile = os.environ.get("PRIME_SCALE_PROFILE")
    runner = [sys.executable, "-m", "cProfile", "-o", profile] if profile else [sys.executable]
    command = [*runner, "-m", "trainer.cli", "run", "--config", "trainer.toml", "--dev-key", "0"]
    log = open(root / "trainer.log", "wb")  # noqa: SIM115 - lives with the process
    env = os.environ | {"PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    endpoints = root / "run" / "endpoints.json"
    deadline = time.monotonic() + timeout
    while not endpoints.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            Coordinator(process, "").stop()
            raise RuntimeError(f"the trainer did not start: {(root / 'trainer.log').read_text()[-3000:]}")
        time.sleep(0.1)
    return Coordinator(process, json.loads(endpoints.read_text())["coordinator"])


# --- the simulated workers --------------------------------------------------------------------------------------


@dataclass
class Pace:
    """Seconds between one worker's files; the ramp lowers it while the workers run."""

    file_every: float


@dataclass
class Load:
    """What every worker of one run shares."""

    url: str
    domain: SigningDomain
    pool_id: int
    maker: FileMaker
    pace: Pace
    recorder: Recorder
    attest: Callable[[bytes], Awaitable[None]] | None
    stop: asyncio.Event


def source_address(index: int) -> str:
    """Worker `index`'s own address on loopback, 127.0.x.y from 127.0.0.2 on (127.0.0.1 is the validators')."""
    k = index + 2
    return f"127.{(k >> 16) & 255}.{(k >> 8) & 255}.{k & 255}"


@contextlib.asynccontextmanager
async def client_for(load: Load, account: Any, address: str) -> Any:
    """The worker's client on a session of its own, its connections from `address`."""
    limits = ClientLimits(call_timeout=30.0, transfer_timeout=60.0, concurrency=2)
    connector = aiohttp.TCPConnector(limit=2, local_addr=(address, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield CoordinatorClient(session, load.url, account, load.domain, pool_id=load.pool_id, limits=limits)


async def _pause(load: Load, seconds: float) -> bool:
    """Sleeps `seconds` unless the run stops first; False once it has."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(load.stop.wait(), max(0.0, seconds))
    return not load.stop.is_set()


async def worker(load: Load, account: Any, index: int) -> None:
    """One node: ask, generate (a pause of `file_every`), upload (retried while busy), as `WorkerDaemon` does."""
    async with client_for(load, account, source_address(index)) as client:
        if not await _pause(load, random.uniform(0, load.pace.file_every)):  # workers start spread out
            return
        while not load.stop.is_set():
            asked = time.monotonic()
            job = await load.recorder.call(TASKS, client.request_task())
            if isinstance(job, Exception):
                if not await _pause(load, getattr(job, "retry_after", 1.0)):
                    return
                continue
            data = load.maker.make(job)
            if not await _pause(load, asked + load.pace.file_every - time.monotonic()):
                return
            await upload(load, client, data)


async def upload(load: Load, client: CoordinatorClient, data: bytes) -> None:
    """Uploads until stored or refused for good; a 429 or an unavailable coordinator keeps the file for later."""
    work_key = hashlib.sha256(data).digest()
    while True:
        stored = await load.recorder.call(UPLOAD, client.upload(work_key, data))
        if not isinstance(stored, Exception):
            if load.attest is not None:
                await load.attest(work_key)
            return
        if isinstance(stored, CoordinatorRefused) or not await _pause(load, getattr(stored, "retry_after", 1.0)):
            return


@contextlib.asynccontextmanager
async def attesters(load: Load, pool: Pool) -> Any:
    """`attest(work_key)`: an acceptance signed by the pool's validators in turn (one session, on 127.0.0.1)."""
    validators = pool.validators
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as session:
        clients = [CoordinatorClient(session, load.url, v, load.domain, pool_id=load.pool_id) for v in validators]
        turn = iter(range(1 << 62))

        async def attest(work_key: bytes) -> None:
            client = clients[next(turn) % len(clients)]
            verdict = Attestation(load.pool_id, work_key, True, 0)
            await load.recorder.call(ATTEST, client.attest(verdict))

        yield attest


# --- one phase: N workers at one pace for a while ---------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """The figures of one phase of a run."""

    workers: int
    file_every: float
    seconds: float
    requests: int
    answered: int
    uploads: int  # files stored
    held: int
    errors: dict[str, int]
    latency_ms: dict[str, tuple[int, float, float]]  # route -> (count, p50, p99)
    coordinator_cpu: float  # seconds, its main process
    coordinator_cpu_all: float  # with its children (the upload parsers)
    coordinator_rss: int  # bytes, at the end
    coordinator_rss_all: int
    load_cpu: float  # the load generator's own CPU seconds

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def target_rate(self) -> float:
        """Files a second the workers were asked for."""
        return self.workers / self.file_every

    @property
    def worst_p99(self) -> float:
        return max((p99 for _, _, p99 in self.latency_ms.values()), default=float("nan"))

    def cpu_ms_per_request(self) -> float:
        return 1000 * self.coordinator_cpu_all / max(1, self.requests)


def summarize(load: Load, workers: int, seconds: float, before: Usage, after: Usage, load_cpu: float) -> Phase:
    recorder = load.recorder
    latency = {
        route: (len(values), 1000 * statistics.median(values), 1000 * percentile(values, 0.99))
        for route, values in sorted(recorder.latencies.items())
    }
    return Phase(
        workers, load.pace.file_every, seconds, recorder.requests, recorder.answered(),
        recorder.outcomes[UPLOAD, "ok"], recorder.held(),
        dict(recorder.errors()), latency, after.cpu - before.cpu, after.cpu_with_children - before.cpu_with_children,
        after.rss, after.rss_with_children, load_cpu,
    )  # fmt: skip


async def run_phase(
    pool: Pool, coordinator: Coordinator, maker: FileMaker, workers: int, file_every: float, seconds: float,
    *, attest: bool = True,
) -> Phase:  # fmt: skip
    """`workers` workers, one file each every `file_every` seconds, for `seconds` (plus their start, spread over
    one `file_every`, which is not counted)."""
    domain = SigningDomain(pool.deployment.chain_id, pool.deployment.address("ComputePool"))
    load = Load(coordinator.url, domain, pool.pool_id, maker, Pace(file_every), Recorder(), None, asyncio.Event())
    async with attesters(load, pool) as attest_one:
        load.attest = attest_one if attest else None
        tasks = [asyncio.create_task(worker(load, pool.members[i], i)) for i in range(workers)]
        await asyncio.sleep(min(file_every, seconds))  # the workers' spread start: not measured
        load.recorder = Recorder()
        before, load_before, started = Usage.of(coordinator.process.pid), time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        elapsed, after, load_cpu = time.monotonic() - started, Usage.of(coordinator.process.pid), time.process_time()
        recorder = load.recorder
        load.stop.set()
        await asyncio.gather(*tasks)
    load.recorder = recorder
    return summarize(load, workers, elapsed, before, after, load_cpu - load_before)


def saturated(phase: Phase) -> str:
    """Why a ramp step did not hold ("" when it did)."""
    if phase.worst_p99 > 1000 * P99_LIMIT:
        return f"p99 {phase.worst_p99:.0f} ms > {1000 * P99_LIMIT:.0f} ms"
    if phase.errors:
        return f"errors {sum(phase.errors.values())}"
    achieved = phase.uploads / phase.seconds
    if achieved < 0.7 * phase.target_rate:
        return f"{achieved:.1f} files/s of {phase.target_rate:.1f} asked"
    return ""


@dataclass(frozen=True)
class SizeResult:
    steady: Phase
    ramp: list[Phase]

    def saturation(self) -> str:
        held = [p for p in self.ramp if not saturated(p)]
        failed = next((p for p in self.ramp if saturated(p)), None)
        last = held[-1] if held else self.steady
        text = f"held {last.rate:.0f} req/s ({last.target_rate:.1f} files/s)"
        if failed is None:
            return text + f"; not saturated within {len(self.ramp)} ramp steps"
        return text + f"; at {failed.target_rate:.1f} files/s: {saturated(failed)}"


async def run_size(
    pool: Pool, coordinator: Coordinator, maker: FileMaker, workers: int, args: argparse.Namespace
) -> SizeResult:
    steady = await run_phase(pool, coordinator, maker, workers, args.file_every, args.duration, attest=args.attest)
    print_phase(f"N={workers} steady", steady)
    ramp: list[Phase] = []
    file_every = args.file_every
    for _ in range(args.ramp_steps):
        file_every /= 2
        step = await run_phase(pool, coordinator, maker, workers, file_every, args.ramp_seconds, attest=args.attest)
        ramp.append(step)
        print_phase(f"N={workers} ramp", step)
        if saturated(step):
            break
    return SizeResult(steady, ramp)


# --- printing ---------------------------------------------------------------------------------------------------


def print_phase(label: str, phase: Phase) -> None:
    routes = ", ".join(f"{r} {n} p50 {p50:.1f} p99 {p99:.1f} ms" for r, (n, p50, p99) in phase.latency_ms.items())
    print(
        f"  {label}: {phase.target_rate:.2f} files/s asked, {phase.rate:.1f} req/s, {routes}; held {phase.held}, "
        f"errors {phase.errors or 0}; coordinator {phase.cpu_ms_per_request():.2f} ms CPU/req, "
        f"{phase.coordinator_rss / 2**20:.0f} MiB RSS; load CPU {phase.load_cpu / phase.seconds:.0%}",
        flush=True,
    )


def print_table(results: dict[int, SizeResult], setup: dict[str, float]) -> None:
    print("\nsetup: " + ", ".join(f"{what} {s:.1f} s" for what, s in setup.items()))
    for workers, result in results.items():
        s = result.steady
        print(f"\nN = {workers}: one file per worker every {s.file_every:g} s, {s.seconds:.0f} s measured")
        print(f"  requests/s sustained   {s.rate:.1f} ({s.requests} requests, {s.held} held)")
        for route, (count, p50, p99) in s.latency_ms.items():
            print(f"  {route:<22} {count:>6} requests  p50 {p50:7.1f} ms  p99 {p99:7.1f} ms")
        errors = ", ".join(f"{code} x{n}" for code, n in sorted(s.errors.items())) or "none"
        print(f"  errors                 {errors}")
        print(
            f"  coordinator CPU        {s.cpu_ms_per_request():.2f} ms/request with its parsers "
            f"({1000 * s.coordinator_cpu / max(1, s.requests):.2f} ms main process), "
            f"{s.coordinator_cpu_all / s.seconds:.0%} of a core"
        )
        print(
            f"  coordinator memory     {s.coordinator_rss / 2**20:.0f} MiB RSS main process, "
            f"{s.coordinator_rss_all / 2**20:.0f} MiB with its parsers"
        )
        print(f"  load generator CPU     {s.load_cpu / s.seconds:.0%} of a core")
        print(f"  saturation             {result.saturation()}")


def as_json(results: dict[int, SizeResult], setup: dict[str, float]) -> dict[str, Any]:
    def phase(p: Phase) -> dict[str, Any]:
        return dataclasses.asdict(p) | {"rate": p.rate, "cpu_ms_per_request": p.cpu_ms_per_request()}

    sizes = {
        str(n): {"steady": phase(r.steady), "ramp": [phase(p) for p in r.ramp], "saturation": r.saturation()}
        for n, r in results.items()
    }
    return {"setup_seconds": setup, "sizes": sizes}


# --- the run ----------------------------------------------------------------------------------------------------


def raise_file_limit() -> None:
    """1,000 workers hold 1,000 connections, and the coordinator (a child: it inherits this) as many."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def benchmark(root: Path, args: argparse.Namespace) -> tuple[dict[int, SizeResult], dict[str, float]]:
    raise_file_limit()
    started = time.perf_counter()
    maker = FileMaker.generate(root)
    pool = setup_pool(root, max(args.sizes), validators=args.attesters)
    setup = {"rollout file generated": time.perf_counter() - started - sum(pool.seconds.values()), **pool.seconds}
    print("setup: " + ", ".join(f"{what} {s:.1f} s" for what, s in setup.items()), flush=True)
    try:
        begun = time.perf_counter()
        coordinator = start_coordinator(root, pool, args.rollouts_per_step)
        setup["coordinator started"] = time.perf_counter() - begun
        try:
            results = {n: await run_size(pool, coordinator, maker, n, args) for n in args.sizes}
        finally:
            coordinator.stop()
    finally:
        pool.stop()
    return results, setup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000], help="worker counts N, in order")
    parser.add_argument("--file-every", type=float, default=30.0, help="seconds between one worker's files")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds each N's steady phase is measured")
    parser.add_argument("--ramp-steps", type=int, default=6, help="doublings of the file rate after each steady phase")
    parser.add_argument("--ramp-seconds", type=float, default=20.0, help="seconds each ramp step is measured")
    parser.add_argument("--rollouts-per-step", type=int, default=256, help="the trainer's [data] rollouts_per_step")
    parser.add_argument("--attesters", type=int, default=4, help="validator keys that accept every stored file")
    parser.add_argument("--no-attest", dest="attest", action="store_false", help="no attestations: no training")
    parser.add_argument("--quick", action="store_true", help="a short run: N = 10, 100; 2 s pace; brief phases")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (logs, inbox) instead of a temp one")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = [n for n in args.sizes if n <= 100] if args.sizes != [10, 100, 1000] else [10, 100]
        args.file_every, args.duration, args.ramp_steps, args.ramp_seconds = 2.0, 8.0, 2, 5.0
    return args


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if any(a == "--validators" or a.startswith("--validators=") for a in arguments):
        from benchmarks.scale_validators import main as validators_main  # K validators sharing a pool

        return validators_main(arguments)
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            root = args.keep
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-")))
        results, setup = asyncio.run(benchmark(root, args))
    print_table(results, setup)
    if args.json is not None:
        args.json.write_text(json.dumps(as_json(results, setup), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
