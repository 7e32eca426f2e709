"""Reward modes against hand-computed values (boundaries included), float32 exactness, and score_completion."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.tasks import RewardBreakdown, RewardError, compute_reward, load_task_spec, open_source, score_completion
from protocol.tasks.spec import RewardSpec, TaskSpec

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "tasks"


def breakdown(task: float, penalty: float, reward: float) -> RewardBreakdown:
    return RewardBreakdown(task_reward=task, length_penalty=penalty, reward=reward)


# Powers of two keep the hand-computed values exact in float32.
@pytest.mark.parametrize(
    ("task", "length", "target", "mode", "alpha", "delta", "expected"),
    [
        (1.0, 500, None, "none", 0.0, 0.0, breakdown(1.0, 0.0, 1.0)),
        (0.25, 5, 10, "none", 0.5, 0.5, breakdown(0.25, 0.0, 0.25)),
        # exact: r_task - alpha * |target - length|, on both sides of the target
        (1.0, 100, 100, "exact", 0.125, 0.0, breakdown(1.0, 0.0, 1.0)),
        (1.0, 96, 100, "exact", 0.125, 0.0, breakdown(1.0, 0.5, 0.5)),
        (1.0, 104, 100, "exact", 0.125, 0.0, breakdown(1.0, 0.5, 0.5)),
        (0.0, 104, 100, "exact", 0.125, 0.0, breakdown(0.0, 0.5, -0.5)),
        # max: r_task * clip(alpha * (target - length) + delta, 0, 1)
        (1.0, 98, 100, "max", 0.25, 0.5, breakdown(1.0, 0.0, 1.0)),  # scale exactly 1
        (1.0, 10, 100, "max", 0.25, 0.5, breakdown(1.0, 0.0, 1.0)),  # scale 23, clipped to 1
        (1.0, 99, 100, "max", 0.25, 0.5, breakdown(1.0, 0.25, 0.75)),
        (1.0, 100, 100, "max", 0.25, 0.5, breakdown(1.0, 0.5, 0.5)),  # at the target: delta
        (0.5, 101, 100, "max", 0.25, 0.5, breakdown(0.5, 0.375, 0.125)),
        (1.0, 102, 100, "max", 0.25, 0.5, breakdown(1.0, 1.0, 0.0)),  # scale exactly 0
        (1.0, 900, 100, "max", 0.25, 0.5, breakdown(1.0, 1.0, 0.0)),  # scale negative, clipped to 0
        (0.0, 10, 100, "max", 0.25, 0.5, breakdown(0.0, 0.0, 0.0)),
        # clip: r_task while length <= target
        (1.0, 100, 100, "clip", 0.0, 0.0, breakdown(1.0, 0.0, 1.0)),
        (1.0, 101, 100, "clip", 0.0, 0.0, breakdown(1.0, 1.0, 0.0)),
        (0.75, 0, 100, "clip", 0.0, 0.0, breakdown(0.75, 0.0, 0.75)),
    ],
)
def test_reward_modes_match_hand_computed_values(
    task: float, length: int, target: int | None, mode: str, alpha: float, delta: float, expected: RewardBreakdown
) -> None:
    assert compute_reward(task, length, target, mode, alpha, delta) == expected


def test_exact_mode_rounds_through_float32() -> None:
    """0.01 is not a float32: the reward is the float32 result, not the float64 one (0.8 exactly)."""
    result = compute_reward(1.0, 80, 100, "exact", 0.01, 0.0)
    expected = np.float32(1.0) - np.float32(0.01) * np.float32(20)
    assert result.reward == float(expected) and result.reward != 0.8
    assert result.length_penalty == float(np.float32(1.0) - expected)


@given(
    task=st.floats(0.0, 1.0),
    length=st.integers(0, 100_000),
    target=st.integers(1, 100_000),
    mode=st.sampled_from(["none", "exact", "max", "clip"]),
    alpha=st.floats(0.0, 1.0),
    delta=st.floats(0.0, 1.0),
)
def test_rewards_are_float32_and_consistent(
    task: float, length: int, target: int, mode: str, alpha: float, delta: float
) -> None:
    result = compute_reward(task, length, target, mode, alpha, delta)
    for value in (result.task_reward, result.length_penalty, result.reward):
        assert float(np.float32(value)) == value and math.isfinite(value)
    assert result.length_penalty == float(np.float32(np.float32(result.task_reward) - np.float32(result.reward)))
    assert result.length_penalty >= 0.0 and result.reward <= result.task_reward
    if mode in ("max", "clip"):
        assert result.reward >= 0.0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1.0, 10, 10, "square", 0.1, 0.0), "unknown length mode"),
        ((1.0, 10, None, "exact", 0.1, 0.0), "needs a target"),
        ((1.0, 10, None, "max", 0.1, 0.5), "needs a target"),
        ((1.0, 10, None, "clip", 0.0, 0.0), "needs a target"),
        ((1.0, -1, 10, "exact", 0.1, 0.0), "length"),
        ((1.5, 10, 10, "none", 0.0, 0.0), "task reward"),
        ((math.nan, 10, 10, "none", 0.0, 0.0), "task reward"),
    ],
)
def test_bad_reward_arguments_are_refused(args: tuple[float, int, int | None, str, float, float], match: str) -> None:
    with pytest.raises(RewardError, match=match):
        compute_reward(*args)


@pytest.fixture(scope="module")
def default_spec() -> TaskSpec:
    return load_task_spec(CONFIGS / "default.toml")


def test_score_completion_rewards_the_right_answer_only(default_spec: TaskSpec) -> None:
    source = open_source(default_spec)
    problem = source.problem("basic_arithmetic/0")  # Calculate 5 - 33.
    assert problem.answer == "-28"
    right = score_completion(source, default_spec, problem, "5-33 is <answer>-28</answer>", 30, None)
    assert right == breakdown(1.0, 0.0, 1.0)
    assert score_completion(source, default_spec, problem, "<answer>28</answer>", 20, None).reward == 0.0
    assert score_completion(source, default_spec, problem, "-28", 3, None).reward == 0.0  # no tags, no answer
    assert score_completion(source, default_spec, problem, "<answer>-28", 11, None).reward == 0.0  # unclosed


def test_score_completion_applies_the_spec_length_mode(default_spec: TaskSpec) -> None:
    spec = dataclasses.replace(default_spec, reward=RewardSpec(length_mode="clip"))
    source = open_source(spec)
    problem = source.problem("basic_arithmetic/0")
    assert score_completion(source, spec, problem, "<answer>-28</answer>", 32, 32).reward == 1.0
    assert score_completion(source, spec, problem, "<answer>-28</answer>", 33, 32) == breakdown(1.0, 1.0, 0.0)
