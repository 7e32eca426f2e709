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
from pathlib import Path
from urllib.parse import urlparse

import pytest
from typer.testing import CliRunner
from web3 import Web3

from ledger.errors import ContractRevert
from ledger.types import WorkStatus
from ledger.units import parse_amount
from node.cli.devnet import app
from node.devnet.lifecycle import LifecycleReport, Role, explain_refusal, run_lifecycle

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


def test_lifecycle_slashes_provider_2_by_the_slash_amount(lifecycle_run: Run) -> None:
    report, _ = lifecycle_run
    slash = parse_amount(report.config.slash_amount, report.decimals)
    before, after = report.before.holdings[Role.PROVIDER_2], report.after.holdings[Role.PROVIDER_2]
    assert report.slashed == slash
    assert before.active_stake - after.active_stake == slash
    assert after.balance == before.balance  # nothing paid for invalidated work


def test_lifecycle_escrow_is_funded_plus_slashed_minus_claimed(lifecycle_run: Run) -> None:
    report, _ = lifecycle_run
    assert report.funded == parse_amount(report.config.pool_funding, report.decimals)
    assert report.before.escrow == report.funded
    assert report.after.escrow == report.funded + report.slashed - report.claimed
    # One pool on the chain: the WorkLedger's token balance is exactly this pool's escrow.
    assert report.after.holdings[Role.ESCROW].balance == report.after.escrow


def test_lifecycle_refuses_the_invalidated_claim_and_ejects_node_2(
    lifecycle_run: Run,
) -> None:
    report, steps = lifecycle_run
    assert report.refusal.error == "WorkNotPending"
    assert report.refusal.values["status"] == WorkStatus.INVALIDATED
    assert report.refusal.explanation == "refused: the work was invalidated"
    node_1, node_2 = report.addresses[Role.NODE_1], report.addresses[Role.NODE_2]
    assert set(report.before.members) == {node_1, node_2}
    assert report.after.members == (node_1,)
    assert [number for number, _ in steps] == list(range(1, len(steps) + 1))


@pytest.mark.parametrize(
    ("status", "words"),
    [(WorkStatus.INVALIDATED, "the work was invalidated"), (WorkStatus.CLAIMED, "the work was already claimed")],
)
def test_explain_refusal_names_the_work_status(status: WorkStatus, words: str) -> None:
    revert = ContractRevert("WorkNotPending", {"poolId": 1, "workKey": b"\x01" * 32, "status": int(status)})
    assert explain_refusal(revert) == f"refused: {words}"


def test_lifecycle_cli_prints_steps_refusal_and_table() -> None:
    result = runner.invoke(app, ["lifecycle"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "anvil development key (public, never use on a real chain)" in out
    assert " 1. started anvil at http://127.0.0.1:" in out
    assert "provider 1 claimed 15 tokens (1,500 units x 0.01)" in out
    assert "WorkNotPending(poolId=1, workKey=0x" in out and "status=2)" in out
    assert "refused: the work was invalidated" in out
    for line in ("provider 1  │ 300 → 315 (+15)", "200 → 150 (-50)", "1,000 → 1,035 (+35)", "node 1, node 2 │ node 1"):
        assert line in out, line
    assert "escrow 1,000 + 50 - 15 = 1,035" in out


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
        [sys.executable, "-m", "node.cli.devnet", "chain", "--out", str(out)],
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
