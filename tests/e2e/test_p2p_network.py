"""Issue 6, gossip in the running network: the trainer is the bootstrap peer, workers and validators dial it.

anvil; the trainer with `[p2p]` (coordinator, origin, libp2p host); the pool spec lists the trainer's multiaddr
under `bootstrap`; one honest worker and one validator, each with `--p2p-port 0`. A libp2p host on the test's side,
connected to the trainer only, proves that (a) the trainer announces each new step, signed by its key, and the
worker, which hears it through the same host, prefetches that step; (b) the validator's attestation reaches the
attestations topic with the validator as its signer, forwarded by the trainer.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from eth_account import Account

from engine.model.tiny import init_model
from ledger.accounts import dev_account
from ledger.client import Ledger
from ledger.deployment import Deployment
from p2p import P2PNode, Received, Subscription, attestations_topic, checkpoints_topic
from protocol.signing import Attestation, Checkpoint, SigningDomain
from tests.e2e.running import Processes, wait_for
from tests.ledger.helpers import make_pool, onboard
from tests.network_trainer import TASK, write_trainer_config

OWNER, PROVIDER, WORKER, VALIDATOR = 0, 1, 3, 5
TOKEN = 10**18

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def next_message(subscription: Subscription, accept: Callable[[Received], bool], timeout: float) -> Received:
    async def read() -> Received:
        async for received in subscription:
            if accept(received):
                return received
        raise AssertionError(f"the subscription to {subscription.topic} ended")

    return await asyncio.wait_for(read(), timeout)


async def wait_for_log(processes: Processes, name: str, pattern: str, timeout: float) -> re.Match[str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (found := re.search(pattern, processes.log(name))) is None:
        if loop.time() > deadline:
            raise AssertionError(f"{name} never logged {pattern!r}\n{processes.logs()}")
        await asyncio.sleep(0.25)
    return found


def test_the_worker_prefetches_announced_steps_and_attestations_reach_the_gossip_topic(
    tmp_path: Path, processes: Processes, ledger_for: Callable[[int], Ledger], deployment: Deployment
) -> None:
    owner = ledger_for(OWNER)
    spec_file = tmp_path / "pool.toml"
    pool_id = make_pool(owner, spec_uri=spec_file.as_uri(), challenge_window=3600)
    owner.mint(owner.address, 1000 * TOKEN)
    owner.fund_rewards(pool_id, 1000 * TOKEN)
    onboard(owner, ledger_for(PROVIDER), dev_account(WORKER), pool_id)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    deployment.save(tmp_path / "deployment.json")
    model = init_model(tmp_path / "tiny", seed=0)
    write_trainer_config(tmp_path, model, pool_id, steps=3, rollouts_per_step=8, p2p=True, spec_file=spec_file)
    trainer = processes.start("trainer", "trainer.cli", "run", "--config", "trainer.toml", "--dev-key", "0")
    endpoints = tmp_path / "run" / "endpoints.json"
    wait_for(lambda: endpoints.exists() or trainer.poll() is not None, "the trainer's endpoints", processes, 120)
    urls = json.loads(endpoints.read_text())
    assert urls["p2p"].startswith("/ip4/127.0.0.1/tcp/") and "/p2p/16Uiu2" in urls["p2p"], urls
    spec_file.write_text(
        f'coordinator = "{urls["coordinator"]}"\ncheckpoints = ["{urls["origin"]}"]\n'
        f'task = "{TASK}"\nasync_level = 2\nbootstrap = ["{urls["p2p"]}"]\n'
    )
    domain = SigningDomain(deployment.chain_id, deployment.address("ComputePool"))

    async def observe() -> tuple[Received, Received]:
        async with P2PNode(Account.create(), domain) as observer:
            await observer.connect(urls["p2p"])
            announcements = await observer.subscribe(checkpoints_topic(pool_id))
            attestations = await observer.subscribe(attestations_topic(pool_id))
            common = ("--pool", str(pool_id), "--deployment", "deployment.json", "--p2p-port", "0")
            processes.start("validator", "validator.cli", "run", *common, "--dev-key", str(VALIDATOR), "--state", "val")
            processes.start(
                "worker", "node.cli.main", "start", *common, "--dev-key", str(WORKER), "--state", "w",
                "--threads", "1", "--submit-batch", "1",
            )  # fmt: skip
            attested = await next_message(attestations, lambda r: True, timeout=150)
            announced = await next_message(
                announcements, lambda r: isinstance(r.message.payload, Checkpoint) and r.message.payload.step >= 1, 90
            )
            # the worker heard an announcement of a newer step than it held and fetched it before being assigned it
            found = await wait_for_log(processes, "worker", r"announced: step (\d+)", timeout=60)
            await wait_for_log(processes, "worker", rf"prefetched step {found.group(1)} in", timeout=60)
            return announced, attested

    announced, attested = asyncio.run(observe())
    assert announced.signer == urls["trainer"] == dev_account(OWNER).address
    assert attested.signer == dev_account(VALIDATOR).address
    attestation = attested.message.payload
    assert isinstance(attestation, Attestation) and attestation.pool_id == pool_id
    worker_log, validator_log = processes.log("worker"), processes.log("validator")
    assert "connected to bootstrap peer" in worker_log and "connected to bootstrap peer" in validator_log
    assert f"0x{attestation.work_key.hex()[:12]}: attestation published" in validator_log
