"""The supervised warm start: masking, schedule, and that it actually learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from engine.model.loading import load_model
from engine.model.tiny import init_model
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from trainer.cli import app
from trainer.sft import SFTConfig, SFTStep, collate, encode_example, lr_at, run_sft

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TASK = REPO / "configs" / "tasks" / "default.toml"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("sft") / "tiny", seed=0)


def test_collate_scores_only_completion_tokens() -> None:
    ids, mask, labels = collate([([1, 2, 3], [4, 5]), ([6], [7, 8, 9])], pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert labels.tolist() == [[-100, -100, -100, 4, 5], [-100, 7, 8, 9, -100]]


def test_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    config = SFTConfig(steps=100, lr=1e-2, warmup_steps=10)
    assert lr_at(0, config) == pytest.approx(1e-3)
    assert lr_at(9, config) == pytest.approx(1e-2)
    assert lr_at(10, config) == pytest.approx(1e-2)
    assert lr_at(100, config) == pytest.approx(1e-3)
    assert lr_at(55, config) < lr_at(20, config)


def test_worked_example_ends_with_eos_after_the_answer(model_dir: Path) -> None:
    loaded = load_model(model_dir)
    spec = load_task_spec(DEFAULT_TASK)
    problem = open_source(spec).problem(open_source(spec).problem_ids()[0])
    prompt, completion = encode_example(loaded, spec, problem)
    assert completion[-1] == loaded.eos_token_ids[0]
    assert loaded.tokenizer.decode(completion[:-1]) == f"<answer>{problem.answer}</answer>"
    assert loaded.tokenizer.decode(prompt).endswith("assistant\n")


def test_a_short_run_lowers_the_loss_and_changes_the_weights(model_dir: Path) -> None:
    loaded = load_model(model_dir)
    spec = load_task_spec(DEFAULT_TASK)
    before = [p.detach().clone() for p in loaded.model.parameters()]
    losses: list[float] = []

    def record(step: SFTStep) -> None:
        losses.append(step.loss)

    run_sft(
        loaded, spec, open_source(spec), SFTConfig(steps=24, batch_size=16, lr=3e-3, warmup_steps=4), on_step=record
    )
    assert len(losses) == 24
    assert sum(losses[-4:]) / 4 < 0.6 * sum(losses[:4]) / 4
    assert any(not torch.equal(a, b) for a, b in zip(before, loaded.model.parameters(), strict=True))
    assert not loaded.model.training


def test_sft_command_writes_a_loadable_model_and_reports_pass_rates(tmp_path: Path, model_dir: Path) -> None:
    out = tmp_path / "sft"
    result = CliRunner().invoke(
        app,
        ["sft", "--model", str(model_dir), "--task", str(DEFAULT_TASK), "--out", str(out),
         "--steps", "3", "--batch-size", "8", "--eval", "8", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["steps"] == 3 and summary["eval_problems"] == 8
    assert 0.0 <= summary["pass_rate_after"] <= 1.0
    reloaded = load_model(out)
    assert reloaded.model_hash != load_model(model_dir).model_hash
