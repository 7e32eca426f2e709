"""`prime-validate file`: the verdict as JSON on stdout, exit 0 accept, 1 reject, 2 bad input (one line)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from engine.generate import Generated
from protocol.rollouts import encode_rollouts, work_units
from validator.cli import app

runner = CliRunner()
NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"
VERDICT_KEYS = {"accepted", "reason", "reason_name", "check", "detail", "evidence", "timings"}


@pytest.fixture(scope="module")
def honest(generate: Callable[..., Generated]) -> Generated:
    return generate(counter=3, prompts=2, group=2, step=4, node=NODE)


@pytest.fixture
def files(tmp_path: Path, honest: Generated, model_dirs: dict[str, Path]) -> dict[str, Path]:
    good, faked, swapped = (tmp_path / f"{name}.parquet" for name in ("good", "faked", "swapped"))
    good.write_bytes(encode_rollouts(honest.meta, honest.rows))
    rows = list(honest.rows)
    rows[1] = dataclasses.replace(rows[1], reward=1.0, task_reward=1.0)
    faked.write_bytes(encode_rollouts(honest.meta, rows))
    rows = list(honest.rows)  # two rows whose proofs have the same size, so toploc compares them
    a, b = next((i, j) for i in range(4) for j in range(i + 1, 4) if len(rows[i].proofs) == len(rows[j].proofs))
    rows[a], rows[b] = (
        dataclasses.replace(rows[a], proofs=rows[b].proofs),
        dataclasses.replace(rows[b], proofs=rows[a].proofs),
    )
    swapped.write_bytes(encode_rollouts(honest.meta, rows))
    task = Path(__file__).resolve().parents[2] / "configs" / "tasks" / "default.toml"
    return {"good": good, "faked": faked, "swapped": swapped, "checkpoint": model_dirs["m0"], "task": task}


def _validate(files: dict[str, Path], name: str, *extra: str) -> Result:
    args = ["file", str(files[name]), "--checkpoint", str(files["checkpoint"]), "--task", str(files["task"])]
    return runner.invoke(app, [*args, *extra], env={"PRIME_DEBUG": None})


def test_an_honest_file_exits_0_with_an_accepting_verdict(files: dict[str, Path], honest: Generated) -> None:
    work_key = "0x" + hashlib.sha256(files["good"].read_bytes()).hexdigest()
    result = _validate(
        files, "good", "--node", NODE.lower(), "--step", "5", "--pool", "0", "--work-key", work_key,
        "--units", str(work_units(honest.rows)),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert set(verdict) == VERDICT_KEYS
    assert verdict["accepted"] is True and verdict["reason"] is None and verdict["check"] == "all"
    assert verdict["evidence"]["work_key"] == work_key
    assert list(verdict["timings"])[-1] == "model"


def test_a_faked_reward_exits_1_with_reason_6_and_its_evidence(files: dict[str, Path]) -> None:
    result = _validate(files, "faked")
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)
    assert set(verdict) == VERDICT_KEYS
    assert (verdict["accepted"], verdict["reason"], verdict["reason_name"]) == (False, 6, "reward_mismatch")
    assert verdict["evidence"]["row"] == 1 and verdict["evidence"]["claimed"] == 1.0


@pytest.mark.parametrize(
    ("flags", "expected_reason"),
    [
        (["--step", "9"], 4),  # the file is from step 4; async level 2
        (["--step", "9", "--async-level", "5"], None),
        (["--work-key", "0x" + "00" * 32], 1),
        (["--units", "1"], 2),
    ],
    ids=["stale-step", "wider-async-window", "work-key", "units"],
)
def test_flags_reach_the_checks(files: dict[str, Path], flags: list[str], expected_reason: int | None) -> None:
    result = _validate(files, "good", *flags)
    assert json.loads(result.stdout)["reason"] == expected_reason, result.output
    assert result.exit_code == (0 if expected_reason is None else 1)


@pytest.mark.parametrize(
    ("flags", "limits"),
    [([], [8, 0.1, 1.0, 4]), (["--thresholds", "gpu-bf16", "--max-exp-mismatches", "3"], [3, 10.0, 8.0, 4])],
    ids=["cpu-fp32-default", "gpu-bf16-overridden"],
)
def test_threshold_flags_reach_the_proof_check(files: dict[str, Path], flags: list[str], limits: list[float]) -> None:
    result = _validate(files, "swapped", *flags)
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)
    assert verdict["reason"] == 7
    assert list(verdict["evidence"]["thresholds"].values()) == limits


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"good": Path("/nonexistent/file.parquet")}, "No such file"),
        ({"checkpoint": Path("/nonexistent/model")}, "cannot load the model"),
        ({"task": Path("/nonexistent/task.toml")}, "not found"),
    ],
    ids=["missing-file", "missing-checkpoint", "missing-task"],
)
def test_bad_input_exits_2_with_one_line(files: dict[str, Path], change: dict[str, Path], message: str) -> None:
    result = _validate(files | change, "good")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


@pytest.mark.parametrize(
    "flags",
    [["--work-key", "abc"], ["--node", "0x1234"], ["--max-exp-mismatches", "500"]],
    ids=["work-key", "node", "threshold-over-top-k"],
)
def test_malformed_flags_exit_2_with_one_line(files: dict[str, Path], flags: list[str]) -> None:
    result = _validate(files, "good", *flags)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")


def test_an_unloadable_checkpoint_exits_2(files: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"garbage")
    result = _validate(files | {"checkpoint": broken}, "good")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: cannot load the model")


def test_help_answers_without_loading_torch() -> None:
    code = "import sys; from validator.cli import app; print('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"
