"""Generating rollout files from the tiny model: deterministic, assigned, scored, proven."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.generate import generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel, load_model
from engine.model.tiny import init_model
from node.cli.main import app
from protocol.plan import Job, completion_text, derived_seed, plan_rollouts
from protocol.rollouts import read_rollouts
from protocol.tasks.assignment import assign_problem_ids, assignment_key
from protocol.tasks.rewards import score_completion
from protocol.tasks.sources import TaskSource, open_source
from protocol.tasks.spec import TaskSpec, load_task_spec, spec_hash

REPO = Path(__file__).resolve().parents[3]
DEFAULT_TASK = REPO / "configs" / "tasks" / "default.toml"
NODE = "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> LoadedModel:
    return load_model(model_dir)


@pytest.fixture(scope="module")
def task() -> tuple[TaskSpec, TaskSource]:
    spec = load_task_spec(DEFAULT_TASK)
    return spec, open_source(spec)


@pytest.mark.usefixtures("one_thread")
def test_same_job_writes_byte_identical_files(
    tmp_path: Path, loaded: LoadedModel, task: tuple[TaskSpec, TaskSource]
) -> None:
    spec, source = task
    job = Job(pool_id=1, node=NODE, step=3, counter=7, prompts=3, group_size=2)
    first, second = (  # each from a backend of its own
        generate_rollouts(job, spec, source, loaded, TorchBackend.from_loaded(loaded)).write(tmp_path / name)
        for name in ("a.parquet", "b.parquet")
    )
    assert first.work_key == second.work_key
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_batch_composition_changes_no_token_or_proof(loaded: LoadedModel, task: tuple[TaskSpec, TaskSource]) -> None:
    """Log-probs may differ in the last float bits between batch sizes; what is proven and sampled may not."""
    spec, source = task
    job = Job(pool_id=1, node=NODE, step=3, counter=7, prompts=3, group_size=2)
    batched = generate_rollouts(job, spec, source, loaded, TorchBackend.from_loaded(loaded, max_batch_size=6)).rows
    alone = generate_rollouts(job, spec, source, loaded, TorchBackend.from_loaded(loaded, max_batch_size=1)).rows
    for one, other in zip(batched, alone, strict=True):
        assert one.output_tokens == other.output_tokens
        assert one.proofs == other.proofs
        assert max(abs(a - b) for a, b in zip(one.output_logprobs, other.output_logprobs, strict=True)) < 1e-5


def test_rows_follow_the_assignment_seeds_and_rewards(loaded: LoadedModel, task: tuple[TaskSpec, TaskSource]) -> None:
    spec, source = task
    job = Job(pool_id=2, node=NODE, step=5, counter=1, prompts=4, group_size=3)
    generated = generate_rollouts(job, spec, source, loaded, TorchBackend.from_loaded(loaded))
    rows = generated.rows
    assigned = assign_problem_ids(source.problem_ids(), 2, NODE, 5, 1, 4)
    assert [row.problem_id for row in rows] == [pid for pid in assigned for _ in range(3)]
    assert [row.group for row in rows] == [g for g in range(4) for _ in range(3)]
    key = assignment_key(2, NODE, 5, 1)
    assert [row.seed for row in rows] == [derived_seed(key, g, k) for g in range(4) for k in range(3)]
    assert all(row.step == 5 for row in rows)
    plan = plan_rollouts(job, spec, source, loaded.tokenizer)
    for row in rows:
        assert tuple(row.input_tokens) == plan[row.group].prompt_tokens
        text = completion_text(loaded.tokenizer, row.output_tokens)
        expected = score_completion(source, spec, plan[row.group].problem, text, len(row.output_tokens), None)
        assert (row.reward, row.task_reward) == (expected.reward, expected.task_reward)
        assert len(row.output_logprobs) == len(row.output_tokens) and row.proofs
    assert generated.meta.task_spec_hash == spec_hash(spec)
    assert generated.meta.model_hash == loaded.model_hash
    assert generated.meta.counter == 1


def test_another_counter_gets_other_problems(loaded: LoadedModel, task: tuple[TaskSpec, TaskSource]) -> None:
    spec, source = task
    plans = [plan_rollouts(Job(1, NODE, 0, c, 8, 1), spec, source, loaded.tokenizer) for c in (0, 1)]
    assert [p.problem.id for p in plans[0]] != [p.problem.id for p in plans[1]]


def test_generate_command_writes_a_readable_file(tmp_path: Path, model_dir: Path) -> None:
    """With the torch backend: a vLLM engine in the test process would bind its threads for every later test
    (tests/validator/test_vllm_files.py generates with vLLM in child processes)."""
    out = tmp_path / "rollouts.parquet"
    result = CliRunner().invoke(
        app,
        ["generate", "--model", str(model_dir), "--task", str(DEFAULT_TASK), "--node", NODE.lower(),
         "--out", str(out), "--prompts", "2", "--group", "2", "--step", "1", "--json", "--backend", "torch"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rollout = read_rollouts(out, max_bytes=1 << 24)
    assert len(rollout.rows) == 4 and rollout.meta.node == NODE
    assert f'"work_key": "0x{rollout.work_key.hex()}"' in result.output


def test_generate_command_refuses_a_bad_node_address_in_one_line(tmp_path: Path, model_dir: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--model",
            str(model_dir),
            "--task",
            str(DEFAULT_TASK),
            "--node",
            "0x1234",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert result.exit_code == 1
    assert "Traceback" not in result.output and "--node" in result.output
    assert not (tmp_path / "x").exists()


def test_generate_command_reports_a_missing_model_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--model",
            str(tmp_path / "nope"),
            "--task",
            str(DEFAULT_TASK),
            "--node",
            NODE,
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert result.exit_code == 1
    assert "Traceback" not in result.output and "nope" in result.output
