"""The reasoning-gym source: stable ids, the dataset's own problems and scorer, forged ids refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import reasoning_gym

from protocol.tasks import TaskSource, UnknownProblem, load_task_spec, open_source
from protocol.tasks.spec import TaskSpec

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "tasks"


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    return load_task_spec(CONFIGS / "default.toml")


@pytest.fixture(scope="module")
def source(spec: TaskSpec) -> TaskSource:
    return open_source(spec)


def test_ids_are_dataset_slash_index_in_order(source: TaskSource) -> None:
    ids = source.problem_ids()
    assert len(ids) == 10_000
    assert (ids[0], ids[17], ids[-1]) == ("basic_arithmetic/0", "basic_arithmetic/17", "basic_arithmetic/9999")
    assert list(ids[3:6]) == ["basic_arithmetic/3", "basic_arithmetic/4", "basic_arithmetic/5"]
    with pytest.raises(IndexError):
        ids[10_000]


def test_problem_is_the_datasets_entry(source: TaskSource) -> None:
    dataset = reasoning_gym.create_dataset(
        "basic_arithmetic",
        seed=0,
        size=10_000,
        min_terms=2,
        max_terms=2,
        min_digits=1,
        max_digits=2,
        operators=["+", "-"],
        allow_parentheses=False,
        allow_negation=False,
    )
    for index in (0, 17, 9999):
        problem = source.problem(f"basic_arithmetic/{index}")
        assert (problem.question, problem.answer) == (dataset[index]["question"], dataset[index]["answer"])


def test_two_opens_of_one_spec_give_the_same_problems(spec: TaskSpec, source: TaskSource) -> None:
    again = open_source(spec)
    for index in range(0, 10_000, 997):
        problem_id = f"basic_arithmetic/{index}"
        assert again.problem(problem_id) == source.problem(problem_id)


def test_default_answers_are_short_integers(source: TaskSource) -> None:
    ids = source.problem_ids()
    answers = [source.problem(ids[i]).answer for i in range(0, 10_000, 5)]
    assert all(int(a) == int(a.strip()) and len(a) <= 4 for a in answers)
    assert min(int(a) for a in answers) < 0 < max(int(a) for a in answers)


def test_right_answer_scores_one_and_wrong_scores_zero(source: TaskSource) -> None:
    problem = source.problem("basic_arithmetic/1")  # Calculate 4 - 1.
    assert source.score(problem, problem.answer) == 1.0
    assert source.score(problem, str(int(problem.answer) + 1)) == 0.0
    assert source.score(problem, "") == 0.0


def test_score_uses_the_dataset_entry_not_the_callers_copy(source: TaskSource) -> None:
    """A forged `Problem` with the right id but another reference answer cannot change the score."""
    problem = source.problem("basic_arithmetic/1")
    forged = type(problem)(id=problem.id, question=problem.question, answer="999")
    assert source.score(forged, "999") == 0.0
    assert source.score(forged, problem.answer) == 1.0


@pytest.mark.parametrize(
    "problem_id",
    ["basic_arithmetic/10000", "basic_arithmetic/-1", "basic_arithmetic/017", "basic_arithmetic/+1",
     "basic_arithmetic/", "basic_arithmetic/1.0", "basic_arithmetic/\u0661", "other/1", "1", ""],
)  # fmt: skip
def test_unknown_problem_ids_are_refused(source: TaskSource, problem_id: str) -> None:
    with pytest.raises(UnknownProblem) as caught:
        source.problem(problem_id)
    assert caught.value.problem_id == problem_id


def test_hostile_answers_score_zero_quickly(source: TaskSource) -> None:
    problem = source.problem("basic_arithmetic/1")  # answer "3"
    started = time.perf_counter()
    for hostile in ("3" * 10_000_000, "\u202e\u0000\ufeff\u0663", "\u0301" * 1000, "\ud800", "-" * 5000):
        assert source.score(problem, hostile) == 0.0
    assert time.perf_counter() - started < 10.0  # a hang guard, not a speed test


def test_answer_containing_the_reference_gets_the_datasets_partial_credit(source: TaskSource) -> None:
    """reasoning-gym's rule: len(reference) / len(answer); spamming numbers earns little and less the longer."""
    problem = source.problem("basic_arithmetic/1")  # answer "3"
    assert source.score(problem, "x = 3") == pytest.approx(1 / 5)
    assert source.score(problem, " ".join(str(i) for i in range(-100, 201))) < 0.003
