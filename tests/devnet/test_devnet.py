"""`prime-devnet`: the lifecycle demo's accounting on a real anvil, and `chain` as a real process."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pytest
from typer.testing import CliRunner
from web3 import Web3

from devnet.cli import app
from devnet.lifecycle import LifecycleReport, Role, explain_refusal, rollout_work_key, run_lifecycle
from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert
from ledger.types import BatchStatus, Reason
from ledger.units import parse_amount
from tests.ledger.helpers import make_pool, onboard

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = {"StakeToken", "NodeRegistry", "ComputePool", "WorkLedger"}

runner = CliRunner()
Run = tuple[LifecycleReport, list[tuple[int, str]]]  # the report, and the (number, text) steps it reported


@pytest.fixture(scope="module")
def lifecycle_run() -> Run:
    steps: list[tuple[int, str]] = []
    report = run_lifecycle(lambda number, text: steps.append((number, text)))
    return report, steps


def test_lifecycle_pays_provider_1_exactly_units_times_reward(lifecycle_run: Run) -> None:
    report, _ = lifecycle_run
    config = report.config
    expected = config.units[0] * parse_amount(config.reward_per_unit, report.decimals)
    assert report.claimed == expected
    before, after = report.before.holdings[Role.PROVIDER_1], report.after.holdings[Role.PROVIDER_1]
    assert after.balance - before.balance == expected
    assert after.active_stake == before.active_stake


def test_lifecycle_burns_the_slash_from_node_2s_lock_in_the_pool(lifecycle_run: Run) -> None:
    report, _ = lifecycle_run
    slash = parse_amount(report.config.slash_amount, report.decimals)
    min_stake = parse_amount(report.config.min_stake_per_node, report.decimals)
    before, after = report.before.holdings[Role.PROVIDER_2], report.after.holdings[Role.PROVIDER_2]
    assert report.slashed == slash
    assert before.active_stake - after.active_stake == slash
    assert after.balance == before.balance  # nothing paid for invalidated work
    # taken from node 2's lock in this pool, which is held on after the ejection
    assert report.before.locks[Role.NODE_2].amount == min_stake
    lock = report.lock_after_slash
    assert (lock.amount, lock.member, lock.open) == (min_stake - slash, False, True)
    assert lock.release_at == report.releases[Role.NODE_2].ended_at + report.config.challenge_window
    # burned: counted by the registry, which keeps the tokens; nobody's balance rose by them
    assert (report.before.burned, report.after.burned) == (0, report.slashed)
    registry = report.after.holdings[Role.REGISTRY]
    assert registry.balance == report.before.holdings[Role.REGISTRY].balance
    staked = sum(h.active_stake + h.unbonding for h in report.after.holdings.values())
    assert registry.balance == staked + report.after.burned
    for role, held in report.after.holdings.items():
        gained = held.balance - report.before.holdings[role].balance
        assert gained == (report.claimed if role == Role.PROVIDER_1 else -report.claimed if role == Role.ESCROW else 0)


def test_lifecycle_escrow_is_funded_minus_claimed(lifecycle_run: Run) -> None:
    report, _ = lifecycle_run
    assert report.funded == parse_amount(report.config.pool_funding, report.decimals)
    assert report.before.escrow == report.funded
    assert report.after.escrow == report.funded - report.claimed  # slashes are no longer credited to it
    # One pool on the chain: the WorkLedger's token balance is exactly this pool's escrow.
    assert report.after.holdings[Role.ESCROW].balance == report.after.escrow


def test_lifecycle_refuses_the_void_work_of_ejected_node_2_and_a_second_claim(lifecycle_run: Run) -> None:
    report, steps = lifecycle_run
    node_1, node_2 = report.addresses[Role.NODE_1], report.addresses[Role.NODE_2]
    ejected = report.ejected_claim
    assert (ejected.error, ejected.values) == ("NodeEjected", {"poolId": report.pool_id, "node": node_2})
    assert ejected.explanation == (
        "refused: an invalidation ejected the node from the pool, so its pending batches are void and never paid"
    )
    repeat = report.repeat_claim
    assert repeat.error == "BatchNotPending" and repeat.values["node"] == node_1
    assert repeat.values["status"] == BatchStatus.CLAIMED and repeat.values["root"] == report.roots[0]
    assert repeat.explanation == "refused: the batch was already claimed"
    committed = [text for _, text in steps if "committed a batch" in text]
    assert len(committed) == 2 and "batch of 2 files" in committed[1]  # node 2's two files, one record
    shown = next(text for _, text in steps if "with its Merkle proof" in text)
    assert "the whole batch is void, its good second file too" in shown
    assert set(report.before.members) == {node_1, node_2}
    assert report.after.members == ()  # node 2 ejected, node 1 left
    assert [number for number, _ in steps] == list(range(1, len(steps) + 1))


def test_lifecycle_holds_each_lock_one_window_after_the_membership_then_releases_it(lifecycle_run: Run) -> None:
    report, _ = lifecycle_run
    window = report.config.challenge_window
    min_stake = parse_amount(report.config.min_stake_per_node, report.decimals)
    early = report.early_release
    assert early.error == "LockHeld" and early.values["member"] is False
    left = report.releases[Role.NODE_1]
    assert early.values["releaseAt"] == left.held_until == left.ended_at + window
    assert left.released_at >= left.held_until
    assert (left.amount, left.provider_locked) == (min_stake, (min_stake, 0))
    ejected = report.releases[Role.NODE_2]
    assert ejected.held_until == ejected.ended_at + window and ejected.released_at >= ejected.held_until
    assert (ejected.amount, ejected.provider_locked) == (min_stake - report.slashed, (min_stake - report.slashed, 0))
    for provider in (Role.PROVIDER_1, Role.PROVIDER_2):
        assert (report.before.holdings[provider].locked, report.after.holdings[provider].locked) == (min_stake, 0)
    for node in (Role.NODE_1, Role.NODE_2):
        assert report.before.locks[node].member and not report.after.locks[node].open


def test_explain_refusal_says_an_ejected_nodes_work_is_void_and_when_a_lock_frees() -> None:
    node = "0x" + "11" * 20
    ejected = explain_refusal(ContractRevert("NodeEjected", {"poolId": 1, "node": node}))
    assert "ejected" in ejected and "pending batches are void" in ejected
    held = ContractRevert("LockHeld", {"poolId": 1, "node": node, "member": False, "releaseAt": 1234})
    assert explain_refusal(held).startswith("refused: the lock is held until block time 1234")
    member = ContractRevert("LockHeld", {"poolId": 1, "node": node, "member": True, "releaseAt": 0})
    assert "still a member" in explain_refusal(member)


def test_lifecycle_cli_prints_steps_refusals_and_tables() -> None:
    result = runner.invoke(app, ["lifecycle"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "anvil development key (public, never use on a real chain)" in out
    assert " 1. started anvil at http://127.0.0.1:" in out
    assert "provider 1 claimed 15 tokens for node 1's batch (1,500 units x 0.01)" in out
    assert "50 tokens taken from node 2's lock in pool #1 (100 -> 50) and burned" in out
    assert "(burned 0 -> 50)" in out
    assert "BatchNotPending(poolId=1, node=0x" in out and "status=3)" in out
    assert "NodeEjected(poolId=1, node=0x" in out
    assert (
        "refused: an invalidation ejected the node from the pool, so its pending batches are void and never paid" in out
    )
    assert "LockHeld(poolId=1, node=0x" in out and "member=False, releaseAt=" in out
    assert "provider 1 locked 100 -> 0" in out and "provider 2 locked 50 -> 0" in out
    for line in (
        "provider 1   │ 300 → 315 (+15)",
        "200 → 150 (-50)",
        "1,000 → 985 (-15)",
        "100 → 0 (-100)",
        "burned (NodeRegistry) │ 0              │ 50",
        "node 2's lock         │ 100 (member)   │ none (released)",
        "node 1, node 2 │ none",
    ):
        assert line in out, line
    assert "escrow = funded - claimed: 1,000 - 15 = 985" in out
    assert "burned 0 → 50, its token balance 400 → 400); nobody's balance rose by it" in out


# --- `prime-devnet up`'s report, from a made-up run -----------------------------------------------------------


def test_the_devnet_report_says_where_the_slashed_tokens_went(tmp_path: Path) -> None:
    from rich.console import Console

    from devnet.cli import _print_devnet_report
    from devnet.network import TOKEN, DevnetReport, NodeView

    honest, cheater = "0x" + "aa" * 20, "0x" + "bb" * 20
    nodes = (
        NodeView("worker-1", honest, "0x" + "01" * 20, False, "exited 0", True, False, 10, 0, 0, 100 * TOKEN,
                 lock=100 * TOKEN),
        NodeView("worker-2", cheater, "0x" + "02" * 20, True, "exited 1", False, True, 3, 2, 100 * TOKEN, 0 * TOKEN,
                 lock=0, lock_release_at=0),
    )  # fmt: skip
    report = DevnetReport(
        root=tmp_path, logs=tmp_path / "logs", model=tmp_path / "model", steps=5, seconds=10.0, idle_seconds=2.0,
        pass_rate_before=0.2, pass_rate_after=0.3, eval_problems=8, eval_samples=2, trained_files=10, submitted=13,
        accepted=10, rejected={"reward_mismatch (6)": 2}, nodes=nodes, stake_before={nodes[1].provider: 100 * TOKEN},
        claimed={nodes[0].provider: 3 * TOKEN}, burned=100 * TOKEN, slashed={cheater: 100 * TOKEN},
        void={cheater: 1}, funded=1000 * TOKEN, escrow=997 * TOKEN,
    )  # fmt: skip
    console = Console(record=True, width=200, highlight=False, soft_wrap=True)
    _print_devnet_report(console, report)
    out = console.export_text()
    slashed = f"slashed         worker-2 {cheater}: 100 tokens burned from its lock (2 invalidations; its 1 other"
    assert slashed + " pending files are void: ejected, never paid)" in out
    assert "burned          100 tokens in all (NodeRegistry.burned)" in out
    assert "escrow          1,000 funded - 3 claimed = 997 (slashes are not credited to it)" in out
    saved = report.as_json()
    assert saved["burned"] == 100 * TOKEN and saved["slashed"] == {cheater: 100 * TOKEN}
    assert saved["escrow"] == saved["funded"] - sum(saved["claimed"].values())
    assert saved["nodes"][0]["lock"] == 100 * TOKEN


def test_the_devnet_follows_batches_per_node_claims_per_node_and_leaves_void_work_unclaimed(
    tmp_path: Path, chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    """`Devnet`'s chain bookkeeping on a real anvil, without its processes: batches by (node, root), their files
    counted, invalidations by the node they name, one claim per honest node, and an ejected node's other pending
    batches counted as void files."""
    from devnet import network
    from devnet.network import Devnet, DevnetSettings
    from ledger.events import EventFollower
    from ledger.merkle import BatchTree, Leaf

    owner = ledger_for(network.OWNER)
    pool_id = make_pool(owner)  # window 3600 s, 100 per node, slash 50
    owner.mint(owner.address, 1000 * network.TOKEN)
    owner.fund_rewards(pool_id, 1000 * network.TOKEN)
    validator = ledger_for(network.VALIDATOR)
    owner.set_validator(pool_id, validator.address)
    nodes = []
    for i in range(2):
        nodes.append(onboard(owner, ledger_for(network.PROVIDERS[i]), dev_account(network.NODES[i]), pool_id))
    honest, cheat = nodes
    shared = rollout_work_key("shared")  # the same batch from both nodes: two records
    first = BatchTree([Leaf(shared, 1000), Leaf(rollout_work_key("honest"), 2000)])
    later = BatchTree([Leaf(rollout_work_key("cheat"), 4000)])
    honest.submit_batch(pool_id, first.root, first.count, first.total_units)
    cheat.submit_batch(pool_id, first.root, first.count, first.total_units)
    cheat.submit_batch(pool_id, later.root, later.count, later.total_units)
    validator.invalidate_batch(pool_id, cheat.address, first.root, first.proof(0), Reason.REWARD_MISMATCH)

    devnet = Devnet(DevnetSettings(root=tmp_path, workers=2, cheater=True), lambda _: None, lambda _: None)
    devnet.chain, devnet.pool_id = chain, pool_id
    devnet._follower = EventFollower(owner, pool_id=pool_id, events=("BatchSubmitted", "BatchInvalidated"))
    view = {n.name: n for n in devnet._snapshot(owner, {}, 0.0).nodes}
    assert (view["worker-1"].submitted, view["worker-1"].invalidated, view["worker-1"].slashed) == (2, 0, 0)
    assert (view["worker-2"].submitted, view["worker-2"].invalidated) == (3, 1)  # files; invalidated batches
    assert view["worker-2"].slashed == 50 * network.TOKEN and view["worker-2"].ejected
    assert view["worker-1"].lock == 100 * network.TOKEN and view["worker-2"].lock == 50 * network.TOKEN
    assert view["worker-2"].lock_release_at > 0  # held one window after the ejection

    claimed, void = devnet._claim(owner)
    assert claimed == {dev_account(network.PROVIDERS[0]).address: 3000 * 10**15}  # 1000 + 2000 units x 1e15
    assert void == {cheat.address: 1}  # its later batch's one file: never invalidated, never paid
    assert owner.escrow_of(pool_id) == 1000 * network.TOKEN - 3 * network.TOKEN
    assert owner.burned() == 50 * network.TOKEN


# --- `prime-devnet chain` as a real process ------------------------------------------------------


def _read_first_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The first stdout line, or a test failure after `timeout` seconds (readline alone could block forever)."""
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"prime-devnet chain printed no line within {timeout} s")


def _port_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_chain_serves_the_deployment_until_signalled(stop_signal: signal.Signals, tmp_path: Path) -> None:
    out = tmp_path / "deployment.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "devnet.cli", "chain", "--out", str(out)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group, so cleanup after a failure reaches anvil too
    )
    try:
        deployment = json.loads(_read_first_line(process, timeout=60))
        assert json.loads(out.read_text()) == deployment
        w3 = Web3(Web3.HTTPProvider(deployment["rpc_url"], request_kwargs={"timeout": 5}))
        assert w3.eth.chain_id == deployment["chain_id"] == 31337
        assert set(deployment["contracts"]) == CONTRACTS
        for name, address in deployment["contracts"].items():
            assert len(w3.eth.get_code(address)) > 0, f"no code at {name} {address}"

        process.send_signal(stop_signal)
        _, stderr = process.communicate(timeout=10)
        assert process.returncode == 0, stderr
        assert f"{stop_signal.name}: anvil stopped" in stderr
        port = urlparse(deployment["rpc_url"]).port
        assert port is not None and _port_closed(port)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


def test_chain_refuses_a_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["chain", "--port", str(port)])
    assert result.exit_code == 1
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr
    assert result.stdout == ""


def test_explain_refusal_names_the_batch_status() -> None:
    values = {"poolId": 1, "node": "0x" + "11" * 20, "root": b"\x01" * 32}
    void = explain_refusal(ContractRevert("BatchNotPending", values | {"status": int(BatchStatus.INVALIDATED)}))
    assert void == "refused: the batch was invalidated: one of its files was shown bad, and none of it is paid"
    assert explain_refusal(ContractRevert("BatchNotFound", values)) == "refused: no such batch was submitted"
