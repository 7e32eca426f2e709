"""K validators sharing one pool: files verified per second, and the backlog while a burst drains.

Run: `.venv/bin/python benchmarks/scale_validators.py` (K = 1 and 2, 48 files; or `benchmarks/scale.py
--validators K`); `--validators 1,2,3`, `--files N`, `--batch-size N`, `--prompts`, `--group-size` and `--json PATH`
change it.

For each K, on a fresh anvil: a pool whose spec names the coordinator, the origin, `replication = 1` and the K
validators' libp2p addresses (how they find each other); a network-mode `prime-train run` that never trains (step
0 stays, so every file is judged against one checkpoint); K `prime-validate run` processes, started together, each
waiting until it hears the others. Then the whole burst is made available (every file, then each batch's leaf list:
each member's files in batches of `--batch-size`) and the batch roots are submitted at once, faster than any
validator checks, and every 0.25 s the benchmark reads each validator's `validator_open_files` (the batches it has
still to list and the files of its share not yet judged). It prints, per K:

- files judged per second, from the first batch's submission to the last attestation the coordinator recorded;
- the backlog (open batches and files, summed over the validators) over the drain, and its peak;
- how long the last file waited for its attestation, against the pool's challenge window;
- whether each validator judged its share oldest first (inversions of chain order, batch by batch and leaf by leaf,
  in the coordinator's journal);
- how many files were verified more than once (attestations per key beyond one): it must be 0.

The files are real: generated once, before any K runs, by the tiny model, with assignments signed by the pool's
trainer key, so each validator downloads, recomputes and attests as in a pool. A benchmark, not a test: it exits 0
whatever the figures. The machine's cores are shared by anvil, the trainer and the K validators, so K = 2 on 2
cores measures contention as much as sharing; a validator on a GPU box has its own device.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests/ holds the trainer.toml writer and the rollout factory

from ledger.accounts import dev_account  # noqa: E402
from ledger.chain import LocalChain, free_port  # noqa: E402
from ledger.client import Ledger  # noqa: E402
from ledger.merkle import BatchTree, Leaf  # noqa: E402
from p2p import peer_id_of  # noqa: E402
from protocol.coordinator.client import CoordinatorClient  # noqa: E402
from protocol.signing import SigningDomain  # noqa: E402
from shardcast.client import new_session  # noqa: E402

WINDOW = 3600  # the pool's challenge window, seconds
OWNER, FIRST_VALIDATOR, MEMBERS = 0, 2, ((1, 5), (4, 6), (7, 9))  # dev accounts: owner, validators, (provider, node)
ENV = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}


@dataclass(frozen=True)
class File:
    node: str
    data: bytes
    key: bytes
    units: int

    @property
    def leaf(self) -> Leaf:
        return Leaf(self.key, self.units)


@dataclass
class Result:
    validators: int
    files: int
    seconds: float
    peak_backlog: int
    backlog: list[tuple[float, int]]  # (seconds since the burst, open batches and files over all validators)
    longest_wait: float  # seconds from the burst's submission to the last file's attestation
    inversions: dict[str, int]  # validator -> pairs of its attestations out of chain order
    verified_twice: int
    per_validator: dict[str, int] = field(default_factory=dict)  # validator -> files it attested

    @property
    def files_per_second(self) -> float:
        return self.files / self.seconds if self.seconds else 0.0


_GENERATED: dict[tuple[int, SigningDomain], list[File]] = {}  # every K's fresh chain has the same pool and domain


def generate_files(root: Path, count: int, prompts: int, group_size: int, pool_id: int, domain: SigningDomain,
                   ) -> list[File]:  # fmt: skip
    """`count` honest files spread over the members, signed by the trainer (dev account 0) as the coordinator does;
    made once per pool and domain."""
    if (pool_id, domain) in _GENERATED:
        return _GENERATED[(pool_id, domain)]
    from engine.model.loading import load_model
    from engine.model.tiny import init_model
    from protocol.rollouts import read_rollouts, work_units
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from tests.network_trainer import TASK
    from tests.trainer.rollout_factory import make_file

    model = root / "tiny"
    if not model.exists():
        init_model(model, seed=0)
    spec = load_task_spec(TASK)
    loaded, source = load_model(model), open_source(spec)
    files = []
    for i in range(count):
        node = dev_account(MEMBERS[i % len(MEMBERS)][1]).address
        path = make_file(
            root / f"file-{i}.parquet", loaded, spec, source, step=0, counter=i // len(MEMBERS), prompts=prompts,
            group_size=group_size, pool_id=pool_id, node=node, signed_by=(dev_account(OWNER), domain),
            reward_of=lambda row: row.reward,
        )  # fmt: skip
        data = path.read_bytes()
        rows = read_rollouts(data, max_bytes=len(data)).rows
        files.append(File(node, data, hashlib.sha256(data).digest(), work_units(rows)))
    _GENERATED[(pool_id, domain)] = files
    return files


def _start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=ENV,
                                start_new_session=True)  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait(condition: Any, what: str, processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if any(p.poll() is not None for p in processes):
            raise RuntimeError(f"a process exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout:g} s")
        time.sleep(0.1)


def _metrics(state: Path) -> dict[str, float]:
    from core.metrics import scrape

    return scrape(json.loads((state / "endpoints.json").read_text())["metrics"])


def _inversions(keys_in_order: list[bytes], position: dict[bytes, int]) -> int:
    """Pairs judged in the opposite of their chain order."""
    seq = [position[k] for k in keys_in_order if k in position]
    return sum(1 for i in range(len(seq)) for j in range(i + 1, len(seq)) if seq[i] > seq[j])


def run_k(root: Path, k: int, args: argparse.Namespace, model: Path) -> Result:
    """One K: a fresh chain, pool, trainer and K validators; the burst; the figures."""
    from tests.ledger.helpers import make_pool, onboard
    from tests.network_trainer import write_trainer_config

    root.mkdir(parents=True)
    chain = LocalChain(log_path=root / "anvil.log").start()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        deployment = chain.deploy()
        deployment.save(root / "deployment.json")
        owner = Ledger(chain.w3, deployment, dev_account(OWNER))
        spec_file = root / "pool.toml"
        pool_id = make_pool(owner, spec_uri=str(spec_file), challenge_window=WINDOW)
        nodes: dict[str, Ledger] = {}
        for provider, node in MEMBERS:
            account = dev_account(node)
            nodes[account.address] = onboard(owner, Ledger(chain.w3, deployment, dev_account(provider)), account,
                                             pool_id)  # fmt: skip
        validators = [dev_account(FIRST_VALIDATOR + i) for i in range(k)]
        for validator in validators:
            owner.set_validator(pool_id, validator.address)
        domain = SigningDomain(deployment.chain_id, deployment.address("ComputePool"))
        files = generate_files(args.cache, args.files, args.prompts, args.group_size, pool_id, domain)

        write_trainer_config(root, model, pool_id, steps=5, rollouts_per_step=10**6, spec_file=spec_file)
        trainer = _start(["trainer.cli", "run", "--config", "trainer.toml", "--dev-key", "0"], root, root / "t.log")
        processes.append(trainer)
        _wait(lambda: (root / "run" / "endpoints.json").exists(), "trainer endpoints", processes, 180)
        coordinator = json.loads((root / "run" / "endpoints.json").read_text())["coordinator"]
        ports = {v.address: free_port() for v in validators}
        peers = [f"/ip4/127.0.0.1/tcp/{ports[v.address]}/p2p/{peer_id_of(v)}" for v in validators]
        spec_file.write_text(spec_file.read_text() + f"replication = 1\nbootstrap = {json.dumps(peers)}\n")
        states: dict[str, Path] = {}
        for i, validator in enumerate(validators):
            states[validator.address] = state = root / f"state-{i}"
            processes.append(_start([
                "validator.cli", "run", "--pool", str(pool_id), "--dev-key", str(FIRST_VALIDATOR + i),
                "--deployment", "deployment.json", "--state", str(state), "--metrics-port", "0",
                "--p2p-port", str(ports[validator.address]), "--poll", "0.2", "--threads", "1",
            ], root, root / f"validator-{i}.log"))  # fmt: skip
        for state in states.values():  # every validator hears the others before the burst
            _wait(lambda s=state: (s / "endpoints.json").exists() and _metrics(s).get("validator_peers_heard") == k - 1,
                  "the other validators' heartbeats", processes, 120)  # fmt: skip

        return _burst(root, k, files, args.batch_size, nodes, pool_id, domain, coordinator, states, processes)
    finally:
        for process in processes:
            _stop(process)
        chain.stop()


def batches_of(files: list[File], size: int) -> list[list[File]]:
    """Each member's files, in their order, in batches of at most `size`; the batches in the order of their first
    file (the order they are submitted in)."""
    by_node: dict[str, list[File]] = {}
    for f in files:
        by_node.setdefault(f.node, []).append(f)
    batches = [mine[i : i + size] for mine in by_node.values() for i in range(0, len(mine), size)]
    first = {f.key: i for i, f in enumerate(files)}
    return sorted(batches, key=lambda batch: first[batch[0].key])


def _burst(root: Path, k: int, files: list[File], batch_size: int, nodes: dict[str, Ledger], pool_id: int,
           domain: SigningDomain, coordinator: str, states: dict[str, Path],
           processes: list[subprocess.Popen[bytes]]) -> Result:  # fmt: skip
    batches = batches_of(files, batch_size)

    async def make_available() -> None:
        """Every file, then each batch's leaf list (the coordinator takes a list once it holds its files)."""
        async with new_session() as session:
            clients = {}
            for address, ledger in nodes.items():
                assert ledger.account is not None
                clients[address] = CoordinatorClient(session, coordinator, ledger.account, domain)
            for f in files:
                await clients[f.node].upload(f.key, f.data)
            for batch in batches:
                await clients[batch[0].node].upload_batch([f.leaf for f in batch])

    asyncio.run(make_available())
    journal = root / "run" / "attestations.jsonl"
    started = time.monotonic()
    slots: dict[str, int] = {}  # each node's next batch slot: none is settled during a burst, so none is reused
    for batch in batches:  # one transaction a batch, as fast as anvil takes them: faster than any validator checks
        tree = BatchTree([f.leaf for f in batch])
        node = batch[0].node
        slot = slots.get(node, 0)
        slots[node] = slot + 1
        nodes[node].submit_batch(pool_id, tree.root, tree.count, tree.total_units, slot=slot)
    backlog: list[tuple[float, int]] = []

    def attested() -> list[dict[str, Any]]:
        return [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []

    while len({a["work_key"] for a in attested()}) < len(files):
        if any(p.poll() is not None for p in processes):
            raise RuntimeError("a process exited during the burst")
        if time.monotonic() - started > 60 + 10 * len(files):
            raise RuntimeError(f"only {len(attested())} of {len(files)} files attested")
        open_files = sum(int(_metrics(s).get("validator_open_files", 0)) for s in states.values())
        backlog.append((time.monotonic() - started, open_files))
        time.sleep(0.25)
    seconds = time.monotonic() - started
    records = attested()
    position = {f.key: i for i, f in enumerate(f for batch in batches for f in batch)}  # chain order, leaf by leaf
    by_validator: dict[str, list[bytes]] = {}
    counts: dict[str, int] = {}
    for record in records:
        key = bytes.fromhex(record["work_key"][2:])
        by_validator.setdefault(record["validator"], []).append(key)
        counts[record["work_key"]] = counts.get(record["work_key"], 0) + 1
    return Result(
        validators=k,
        files=len(files),
        seconds=seconds,
        peak_backlog=max((n for _, n in backlog), default=0),
        backlog=backlog,
        longest_wait=seconds,
        inversions={v: _inversions(keys, position) for v, keys in by_validator.items()},
        verified_twice=sum(n - 1 for n in counts.values()),
        per_validator={v: len(keys) for v, keys in by_validator.items()},
    )


def print_result(result: Result) -> None:
    print(f"\nK = {result.validators}: {result.files} files judged in {result.seconds:.1f} s "
          f"= {result.files_per_second:.2f} files/s")  # fmt: skip
    print(f"  per validator: {', '.join(f'{v[:10]} {n}' for v, n in sorted(result.per_validator.items()))}")
    series = result.backlog[:: max(1, len(result.backlog) // 12)]
    print("  backlog (open batches and files, all validators) over the drain: "
          + ", ".join(f"{t:.0f}s:{n}" for t, n in series))  # fmt: skip
    print(
        f"  peak backlog {result.peak_backlog}; the last file waited {result.longest_wait:.1f} s of a {WINDOW} s window"
    )
    print(f"  judged out of chain order (inversions): {result.inversions}; verified more than once: "
          f"{result.verified_twice}")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--validators", default="1,2", help="comma-separated K to run (default 1,2)")
    parser.add_argument("--files", type=int, default=48, help="files in the burst (default 48)")
    parser.add_argument("--batch-size", type=int, default=16, help="files per batch, at most (default 16)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per file (the default terms: 8)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (default 8)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(k) for k in args.validators.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="prime-scale-validators-") as tmp:
        root = Path(tmp)
        args.cache = root / "files"
        args.cache.mkdir()
        from engine.model.tiny import init_model

        model = init_model(root / "files" / "tiny", seed=0)
        for k in sizes:
            result = run_k(root / f"k{k}", k, args, model)
            print_result(result)
            results.append(result)
    if len(results) > 1:
        base = results[0].files_per_second
        for r in results[1:]:
            print(f"\nK = {r.validators} vs K = {results[0].validators}: "
                  f"{r.files_per_second / base if base else 0:.2f}x the files per second")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
