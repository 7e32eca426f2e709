"""Honest rollout files of 1, 10 and 50 MB, end to end: generated, uploaded, downloaded and judged whole.

    .venv/bin/python benchmarks/large_files.py [--sizes 1,10,50] [--max-tokens 960]

Each file is made by the worker's code (`generate_rollouts` with `TorchBackend`) for the default task, with
`sampling.max_tokens` raised so that rows are long, as a real model's are (the tiny model stops on its own after
about 100 characters). The worker then uploads it with a signed request to a real coordinator (`CoordinatorApi`,
aiohttp, on loopback), which answers with its signed receipt; the validator downloads it with its own signed
request and runs every check of `verify_file` on what came back. Before issue 17 the coordinator hashed a prefix
of any upload over about 256 KB (401 signer_mismatch), and the download of anything over about 100 KB came back
as a 64-112 KB prefix, so each of these files failed.

Rollout files move only between workers, the coordinator and validators; relays carry checkpoints (their shards
are measured in `benchmarks/shardcast.py`; a whole manifest through a relay is tested in tests/shardcast).

Prints per size: the rows, the bytes, and the seconds to generate, upload, download and verify, with the
verdict. A benchmark: it exits 1 only when an honest file is not moved whole or not accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import torch
from eth_account import Account

from engine.generate import generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel, load_model
from engine.model.tiny import init_model
from protocol.coordinator.client import CoordinatorClient
from protocol.plan import Job
from protocol.rollouts import encode_rollouts, read_rollouts, work_units
from protocol.signing import SigningDomain
from protocol.tasks.sources import TaskSource, open_source
from protocol.tasks.spec import TaskSpec, load_task_spec
from validator.verify import Expected, verify_file

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the loopback coordinator is the tests' (tests/loopback_coordinator.py)

from tests.loopback_coordinator import coordinator_service, serving  # noqa: E402

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
WORKER, VALIDATOR, TRAINER = (Account.from_key(bytes([n]) * 32) for n in (0x31, 0x32, 0x33))
GROUP = 16
BATCH = 64
MAX_BYTES = 64 << 20  # the coordinator's and the validator's default limit


@dataclass(frozen=True)
class Outcome:
    megabytes: int
    rows: int
    size: int
    generate_s: float
    upload_s: float
    download_s: float
    verify_s: float
    whole: bool
    verdict: str
    accepted: bool


def generate(spec: TaskSpec, source: TaskSource, model: LoadedModel, counter: int, prompts: int) -> bytes:
    job = Job(pool_id=0, node=WORKER.address, step=0, counter=counter, prompts=prompts, group_size=GROUP)
    backend = TorchBackend.from_loaded(model, max_batch_size=BATCH)
    generated = generate_rollouts(job, spec, source, model, backend)
    return encode_rollouts(generated.meta, generated.rows)


async def move(tmp: Path, data: bytes) -> tuple[bytes | None, float, float]:
    """Uploads `data` as the worker to a real coordinator on loopback; returns what the validator downloads."""
    service = coordinator_service(tmp, DOMAIN, trainer=TRAINER, worker=WORKER.address, validator=VALIDATOR.address)
    async with serving(service) as (_, url), aiohttp.ClientSession() as session:
        key = hashlib.sha256(data).digest()
        started = time.perf_counter()
        uploaded = await CoordinatorClient(session, url, WORKER, DOMAIN).upload(key, data)
        upload_s = time.perf_counter() - started
        if not uploaded.created:
            raise SystemExit(f"the coordinator did not store the {len(data):,}-byte file")
        started = time.perf_counter()
        downloaded = await CoordinatorClient(session, url, VALIDATOR, DOMAIN).download(key, MAX_BYTES)
        return downloaded, upload_s, time.perf_counter() - started


def run_size(megabytes: int, spec: TaskSpec, source: TaskSource, model: LoadedModel, bytes_per_row: float) -> Outcome:
    prompts = math.ceil(megabytes * 1_000_000 * 1.08 / bytes_per_row / GROUP)
    started = time.perf_counter()
    data = generate(spec, source, model, counter=megabytes, prompts=prompts)
    generate_s = time.perf_counter() - started
    while len(data) < megabytes * 1_000_000:  # the estimate fell short: a few more prompts, same counter
        prompts = math.ceil(prompts * megabytes * 1_000_000 * 1.05 / len(data))
        data = generate(spec, source, model, counter=megabytes, prompts=prompts)
        generate_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="large-files-") as tmp:
        downloaded, upload_s, download_s = asyncio.run(move(Path(tmp), data))
    whole = downloaded == data
    rows = prompts * GROUP
    started = time.perf_counter()
    if downloaded is None:
        verdict, accepted = "the coordinator did not have the file", False
    else:
        key = hashlib.sha256(downloaded).digest()
        units = work_units(read_rollouts(downloaded, max_bytes=MAX_BYTES).rows)
        result = verify_file(
            downloaded,
            spec=spec,
            checkpoint=model,
            expected=Expected(work_key=key, node=WORKER.address, pool_id=0, units=units),
            source=source,
        )
        verdict, accepted = (
            ("accepted" if result.accepted else f"REJECTED {result.check}: {result.detail}"),
            result.accepted,
        )
    verify_s = time.perf_counter() - started
    return Outcome(megabytes, rows, len(data), generate_s, upload_s, download_s, verify_s, whole, verdict, accepted)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,10,50", help="file sizes in MB (10^6 bytes), comma-separated")

    parser.add_argument("--max-tokens", type=int, default=960, help="the task's sampling.max_tokens (prompt fits)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    base = load_task_spec(REPO / "configs" / "tasks" / "default.toml")
    spec = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, max_tokens=args.max_tokens))
    source = open_source(spec)
    with tempfile.TemporaryDirectory(prefix="large-files-model-") as tmp:
        model = load_model(init_model(Path(tmp) / "m0", seed=0))
        return run(sizes, spec, source, model, args.max_tokens)


def run(sizes: list[int], spec: TaskSpec, source: TaskSource, model: LoadedModel, max_tokens: int) -> int:
    sample = generate(spec, source, model, counter=0, prompts=8)
    bytes_per_row = len(sample) / (8 * GROUP)
    print(f"task {spec.name}, max_tokens {max_tokens}: about {bytes_per_row:,.0f} bytes per row")
    header = f"{'size':>6}{'rows':>8}{'bytes':>13}{'generate s':>12}{'upload s':>10}{'download s':>12}{'verify s':>10}"
    print(header + "  whole  verdict")
    failed = False
    for megabytes in sizes:
        o = run_size(megabytes, spec, source, model, bytes_per_row)
        failed |= not (o.whole and o.accepted)
        print(
            f"{o.megabytes:>4}MB{o.rows:>8,}{o.size:>13,}{o.generate_s:>12.1f}{o.upload_s:>10.2f}{o.download_s:>12.2f}"
            f"{o.verify_s:>10.1f}  {'yes' if o.whole else 'NO':<5}  {o.verdict}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
