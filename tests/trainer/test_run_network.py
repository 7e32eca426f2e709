"""`prime-train run` in network mode against a real anvil: members from ComputePool, training only on attested files."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount

from engine.model.loading import load_model
from engine.model.tiny import init_model
from ledger.accounts import dev_account
from ledger.client import Ledger
from ledger.deployment import Deployment
from protocol.coordinator.client import CoordinatorClient, CoordinatorRefused
from protocol.signing import Attestation, SigningDomain
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from shardcast.client import new_session
from tests.ledger.helpers import make_pool, onboard
from tests.trainer.rollout_factory import make_file
from trainer.config import CoordinatorSettings, DataSettings, PoolLink, RunSettings, ShardcastSettings, TrainerSettings

TASK = Path(__file__).parents[2] / "configs" / "tasks" / "default.toml"

pytestmark = pytest.mark.slow


def call(
    url: str, account: LocalAccount, domain: SigningDomain, action: Callable[[CoordinatorClient], object]
) -> object:
    async def run() -> object:
        async with new_session() as session:
            return await action(CoordinatorClient(session, url, account, domain))  # type: ignore[misc]

    return asyncio.run(run())


def test_network_mode_admits_members_and_trains_only_on_attested_files(
    tmp_path: Path, ledger_for: Callable[[int], Ledger], deployment: Deployment
) -> None:
    owner, provider = ledger_for(0), ledger_for(1)
    pool_id = make_pool(owner)
    node, validator, stranger = dev_account(3), dev_account(2), dev_account(4)
    onboard(owner, provider, node, pool_id)
    owner.set_validator(pool_id, validator.address)
    deployment.save(tmp_path / "deployment.json")
    domain = SigningDomain(deployment.chain_id, deployment.address("ComputePool"))

    model = init_model(tmp_path / "tiny", seed=0)
    spec = load_task_spec(TASK)
    loaded, source = load_model(model), open_source(spec)
    files = [
        make_file(
            tmp_path / f"{name}.parquet", loaded, spec, source, step=0, counter=i, node=node.address, pool_id=pool_id
        )
        for i, name in enumerate(("attested", "silent"))
    ]
    settings = TrainerSettings(
        run=RunSettings(dir=tmp_path / "run", model=model, task=TASK, steps=1, threads=1),
        data=DataSettings(rollouts_per_step=16),
        coordinator=CoordinatorSettings(port=0),
        shardcast=ShardcastSettings(port=0),
        pool=PoolLink(id=pool_id, deployment=tmp_path / "deployment.json"),
    )
    (tmp_path / "trainer.toml").write_text(settings.to_toml())
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "run", "--config", "trainer.toml", "--dev-key", "0", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    run = tmp_path / "run"
    try:
        deadline = time.monotonic() + 120
        while not (run / "endpoints.json").exists():
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        url = json.loads((run / "endpoints.json").read_text())["coordinator"]
        data = [f.read_bytes() for f in files]
        keys = [hashlib.sha256(d).digest() for d in data]

        with pytest.raises(CoordinatorRefused) as refused:
            call(url, stranger, domain, lambda c: c.upload(keys[0], data[0]))
        assert refused.value.status == 403 and refused.value.code == "not_member"
        with pytest.raises(CoordinatorRefused) as refused:  # only validators attest
            call(url, node, domain, lambda c: c.attest(Attestation(pool_id, keys[0], True, 0)))
        assert refused.value.code == "not_validator"

        for key, body in zip(keys, data, strict=True):
            assert call(url, node, domain, lambda c, k=key, b=body: c.upload(k, b)).created  # type: ignore[attr-defined]
        time.sleep(2.0)
        assert process.poll() is None and not (run / "metrics.jsonl").exists(), "trained before any attestation"

        call(url, validator, domain, lambda c: c.attest(Attestation(pool_id, keys[0], True, 0)))
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    trained = [json.loads(line) for line in (run / "trained.jsonl").read_text().splitlines()]
    assert trained == [{"step": 1, "work_keys": ["0x" + keys[0].hex()]}]
    assert json.loads(out)["final_step"] == 1
