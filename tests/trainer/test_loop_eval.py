"""The training loop's held-out evaluation: which problems it measures, and from which task spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model.loading import load_model
from engine.model.tiny import init_model
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from trainer.config import load_run_config
from trainer.learner import Learner, LearnerConfig
from trainer.loop import RunPaths, TrainingLoop
from trainer.offline_filter import write_filtered_spec

TASK = Path(__file__).parents[2] / "configs" / "tasks" / "default.toml"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("eval") / "tiny", seed=0)


def make_loop(model_dir: Path, run: Path, train_task: Path, eval_task: Path | None, problems: int) -> TrainingLoop:
    loaded = load_model(model_dir)
    spec = load_task_spec(train_task)
    evaluation = None
    if eval_task is not None:
        eval_spec = load_task_spec(eval_task)
        evaluation = (eval_spec, open_source(eval_spec))
    learner = Learner(loaded.model, LearnerConfig(), pad_id=0)
    return TrainingLoop(
        learner, loaded, spec, open_source(spec), RunPaths(run), rollouts_per_step=8, max_files_per_step=4,
        eval_every=1, eval_problems=problems, eval_task=evaluation,
    )  # fmt: skip


def test_a_run_on_a_filtered_task_measures_the_held_out_problems_of_the_task_it_names(
    model_dir: Path, tmp_path: Path
) -> None:
    all_ids = list(open_source(load_task_spec(TASK)).problem_ids())
    held_out = all_ids[-16:]
    training = write_filtered_spec(TASK, all_ids[:100], tmp_path / "train.toml")  # RL never sees held_out

    plain = make_loop(model_dir, tmp_path / "a", training.path, None, problems=16)
    assert plain.eval_problem_ids() == all_ids[84:100]  # its own last problems: ones it trains on
    named = make_loop(model_dir, tmp_path / "b", training.path, TASK, problems=16)
    assert named.eval_problem_ids() == held_out
    rate = named.evaluate()
    assert rate * 16 == round(rate * 16)  # one sample of each of the 16 problems


def test_the_eval_task_is_read_relative_to_the_config(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "trainer.toml"
    path.parent.mkdir()
    path.write_text(
        "[run]\ndir='r'\nmodel='m'\ntask='t.toml'\n[eval]\nevery=5\ntask='../tasks/full.toml'\n[local]\nworkers=1\n"
    )
    assert load_run_config(path).eval_task == (tmp_path / "tasks" / "full.toml").resolve()
    path.write_text("[run]\ndir='r'\nmodel='m'\ntask='t.toml'\n[local]\nworkers=1\n")
    assert load_run_config(path).eval_task is None
