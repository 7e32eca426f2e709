"""A real coordinator on loopback: `CoordinatorService` behind `CoordinatorApi` (aiohttp) on a free port, as the
tests and benchmarks that move files through one start it (tests/trainer/test_api.py,
tests/validator/test_large_honest_files.py, benchmarks/large_files.py), started as the trainer starts it
(`core.serving.serve`).

`python -m tests.loopback_coordinator` runs one in a process of its own (`coordinator_process`), so that a test or a
benchmark can hold it to a descriptor limit and read its memory, descriptors and log lines from outside
(tests/trainer/test_hostile_clients.py, benchmarks/hostile_load.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import resource
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount

from core.serving import ConnectionLimits, serve
from protocol.signing import SigningDomain
from trainer.api import CoordinatorApi
from trainer.coordinator import ApiConfig, CoordinatorService, PoolState
from trainer.inbox import RolloutInbox
from trainer.roles import StaticRoles
from trainer.verdicts import VerdictStore


def coordinator_service(
    root: Path,
    domain: SigningDomain,
    *,
    trainer: LocalAccount,
    worker: str,
    validator: str,
    pool_id: int = 0,
    verdicts: VerdictStore | None = None,
    members: Sequence[str] = (),
    **options: Any,
) -> CoordinatorService:
    """Pool `pool_id` at step 0, signed for by `trainer`, with one member (`worker`, and any `members` more) and one
    validator; uploads go to `root/inbox`, verdicts to `verdicts` (in memory unless given). `options` are
    CoordinatorService's others (`config`, `task_spec_hash` ...)."""
    return CoordinatorService(
        domain=domain,
        state=PoolState(pool_id=pool_id, trainer=trainer.address),
        roles=StaticRoles(members=frozenset({worker, *members}), validators=frozenset({validator})),
        inbox=RolloutInbox(root / "inbox"),
        verdicts=VerdictStore() if verdicts is None else verdicts,
        signer=trainer,
        **options,
    )


@asynccontextmanager
async def serving(service: CoordinatorService) -> AsyncIterator[tuple[CoordinatorApi, str]]:
    """The service's API listening on a free loopback port, and its base URL; stopped on leaving."""
    api = CoordinatorApi(service)
    served = await serve(api.app, "127.0.0.1", 0, service.config.connections, name="coordinator")
    try:
        yield api, f"http://127.0.0.1:{served.port}"
    finally:
        await served.stop()


@dataclass(frozen=True)
class CoordinatorProcess:
    """A coordinator running in a process of its own: its URL, its pid, and the file its log goes to."""

    url: str
    pid: int
    log: Path

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


@contextlib.contextmanager
def coordinator_process(
    root: Path,
    domain: SigningDomain,
    *,
    trainer: LocalAccount,
    members: Sequence[str],
    validator: str,
    pool_id: int,
    nofile: int | None = None,
    config: dict[str, Any] | None = None,
    connections: dict[str, Any] | None = None,
) -> Iterator[CoordinatorProcess]:
    """`python -m tests.loopback_coordinator` under a descriptor limit of `nofile` (the operator's `ulimit -n`), with
    ApiConfig fields `config` and ConnectionLimits fields `connections`; stopped (SIGTERM) on leaving."""
    root.mkdir(parents=True, exist_ok=True)
    log = root / "coordinator.log"
    spec = {
        "root": str(root),
        "chain_id": domain.chain_id,
        "contract": domain.verifying_contract,
        "trainer_key": trainer.key.hex(),
        "members": list(members),
        "validator": validator,
        "pool_id": pool_id,
        "config": config or {},
        "connections": connections or {},
    }

    def limit_descriptors() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    with log.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.loopback_coordinator", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            preexec_fn=limit_descriptors,
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line.startswith("http://"):
                raise RuntimeError(f"the coordinator did not start: {line!r}\n{log.read_text()}")
            yield CoordinatorProcess(line.strip(), process.pid, log)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def _serve_until_stopped(spec: dict[str, Any]) -> None:
    config = dataclasses.replace(ApiConfig(), **spec["config"])
    config = dataclasses.replace(config, connections=ConnectionLimits(**spec["connections"]))
    members: list[str] = spec["members"]
    service = coordinator_service(
        Path(spec["root"]),
        SigningDomain(spec["chain_id"], spec["contract"]),
        trainer=Account.from_key(spec["trainer_key"]),
        worker=members[0],
        members=members[1:],
        validator=spec["validator"],
        pool_id=spec["pool_id"],
        config=config,
        task_spec_hash=bytes(32),
    )
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    async with serving(service) as (_, url):
        print(url, flush=True)
        await stopped.wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(description="One loopback coordinator in a process of its own (a JSON spec).")
    parser.add_argument("spec", help="JSON: root, chain_id, contract, trainer_key, members, validator, pool_id ...")
    asyncio.run(_serve_until_stopped(json.loads(parser.parse_args().spec)))
