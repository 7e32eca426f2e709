"""FSDP2 under torchrun: two gloo processes on CPU train like one, through `prime-train replay`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from engine.model.loading import load_model
from engine.model.tiny import init_model
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from tests.trainer.rollout_factory import make_file
from trainer.cli import app
from trainer.distributed import DistributedError, init_distributed

ROOT = Path(__file__).parents[2]
DEFAULT_TASK = ROOT / "configs" / "tasks" / "default.toml"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model and a folder of rollout files: two of step 0 with 32 completions, one of step 1 with 16."""
    root = tmp_path_factory.mktemp("fsdp")
    model_dir = init_model(root / "tiny", seed=0)
    spec = load_task_spec(DEFAULT_TASK)
    source, loaded = open_source(spec), load_model(model_dir)
    folder = root / "rollouts"
    folder.mkdir()
    for name, step, counter, prompts in [("a", 0, 0, 8), ("b", 0, 1, 8), ("c", 1, 2, 4)]:
        make_file(folder / f"{name}.parquet", loaded, spec, source, step=step, counter=counter, prompts=prompts)
    return model_dir, folder


def replay_args(model_dir: Path, folder: Path, out: Path) -> list[str]:
    # 32 completions a step: policy 0 trains on one step-0 file; policy 1 on the step-1 file (on-policy) and the
    # other step-0 file (off-policy: scored against policy 0's kept weights); then the folder has run out.
    # 300 tokens give several micro-batches a step. --device cpu: gloo and float32 on every rank, even where CUDA is
    # present (auto would train the single process in bfloat16 on the GPU).
    return [
        "replay", "--model", str(model_dir), "--task", str(DEFAULT_TASK), "--rollouts", str(folder),
        "--out", str(out), "--rollouts-per-step", "32", "--lr", "1e-3", "--micro-batch-tokens", "300",
        "--device", "cpu", "--json",
    ]  # fmt: skip


def torchrun(args: list[str]) -> dict[str, object]:
    """`prime-train` on two gloo processes; the JSON summary that rank 0 alone prints."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [*command, "-m", "trainer.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary: dict[str, object] = json.loads(done.stdout)  # one JSON document: rank 1 prints nothing
    return summary


def records(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_gloo_processes_train_like_one_including_after_a_resume(
    tmp_path: Path, recorded: tuple[Path, Path]
) -> None:
    model_dir, folder = recorded
    single = CliRunner().invoke(app, replay_args(model_dir, folder, tmp_path / "one"))
    assert single.exit_code == 0, single.output
    assert json.loads(single.stdout)["world_size"] == 1  # the JSON on stdout; logs go to stderr

    sharded_args = replay_args(model_dir, folder, tmp_path / "two")
    first = torchrun([*sharded_args, "--steps", "1"])
    assert first["world_size"] == 2 and first["final_step"] == 1
    resumed = torchrun(sharded_args)  # a new pair of processes: the saved full state, loaded into the shards
    assert resumed["start_step"] == 1 and resumed["final_step"] == 2 and "has 0 left" in str(resumed["stopped"])

    one, two = records(tmp_path / "one"), records(tmp_path / "two")  # rank 0 alone appends to metrics.jsonl
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    assert two[1]["files"] == 2 and two[1]["oldest_policy_step"] == 0  # policies 1 and 0 in one step
    assert abs(two[1]["mean_ratio"] - 1) > 1e-4
    for a, b in zip(one, two, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["mean_ratio"] == pytest.approx(a["mean_ratio"], rel=1e-5)
        assert b["trained_tokens"] == a["trained_tokens"]
        assert math.ceil(a["micro_batches"] / 2) <= b["micro_batches"] <= a["micro_batches"]  # rank 0's share
    assert any(b["micro_batches"] < a["micro_batches"] for a, b in zip(one, two, strict=True))  # really dealt out

    weights_one = load_file(tmp_path / "one" / "checkpoints" / "step_2" / "model.safetensors")
    weights_two = load_file(tmp_path / "two" / "checkpoints" / "step_2" / "model.safetensors")
    assert sorted(weights_one) == sorted(weights_two)
    for name, tensor in weights_one.items():  # Adam magnifies rounding of tiny gradients (see test_learner)
        torch.testing.assert_close(weights_two[name], tensor, rtol=0, atol=2e-5, msg=name)


def test_replay_of_a_folder_too_small_for_one_step_fails_with_one_line(
    tmp_path: Path, recorded: tuple[Path, Path]
) -> None:
    model_dir, folder = recorded
    args = replay_args(model_dir, folder, tmp_path / "run")
    args[args.index("--rollouts-per-step") + 1] = "65"
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "nothing to train on: policy step 0 needs 65 completions of steps [0, 0]" in result.output
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_one_process_needs_no_process_group() -> None:
    assert init_distributed({}).size == 1
    assert init_distributed({"WORLD_SIZE": "1", "RANK": "0"}).size == 1


def test_several_ranks_without_torchrun_variables_are_refused() -> None:
    with pytest.raises(DistributedError, match="MASTER_ADDR, MASTER_PORT unset"):
        init_distributed({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
