"""Rewards: the task reward from the verifier, and the length term of the thinking budget (DESIGN section 8).

Workers write `reward`, `task_reward` and `length_penalty` into every rollout row and validators recompute them
with this same code (reason 6, reward mismatch), so the arithmetic is float32 op by op (numpy scalars, no fused
multiply-add) and the results are float32 values returned as Python floats: equal bits on every machine, and
exactly what a float32 Parquet column stores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protocol.tasks.errors import RewardError
from protocol.tasks.prompts import extract_answer
from protocol.tasks.sources import Problem, TaskSource
from protocol.tasks.spec import LENGTH_MODES, TaskSpec

_F0, _F1 = np.float32(0.0), np.float32(1.0)


@dataclass(frozen=True)
class RewardBreakdown:
    """`reward = task_reward - length_penalty`, each a float32 value."""

    task_reward: float
    length_penalty: float
    reward: float


def compute_reward(
    task_reward: float, length: int, target_length: int | None, mode: str, alpha: float, delta: float
) -> RewardBreakdown:
    """The reward of one completion of `length` output tokens that was asked to think for `target_length`.

    Modes, with r_task the task reward in [0, 1]:
      none:  r = r_task                                                (target_length ignored, may be None)
      exact: r = r_task - alpha * |target - length|                    (L1-Exact; can go below 0)
      max:   r = r_task * clip(alpha * (target - length) + delta, 0, 1)  (L1-Max: a soft cap, full credit
             while length <= target - (1 - delta) / alpha, none once length >= target + delta / alpha)
      clip:  r = r_task if length <= target else 0                     (a hard cap)
    and length_penalty = r_task - r (>= 0 in every mode).

    Raises `RewardError` for an unknown mode, a negative length, a task reward outside [0, 1], or a missing
    target in a length mode.
    """
    if mode not in LENGTH_MODES:
        raise RewardError(f"unknown length mode {mode!r}; expected one of {', '.join(LENGTH_MODES)}")
    if not 0.0 <= task_reward <= 1.0:
        raise RewardError(f"task reward must lie in [0, 1], got {task_reward}")
    if length < 0:
        raise RewardError(f"length must be >= 0, got {length}")
    r_task = np.float32(task_reward)
    if mode == "none":
        reward = r_task
    elif target_length is None:
        raise RewardError(f"length mode {mode!r} needs a target length")
    elif mode == "exact":
        reward = r_task - np.float32(alpha) * np.float32(abs(target_length - length))
    elif mode == "max":
        scale = np.float32(alpha) * np.float32(target_length - length) + np.float32(delta)
        reward = r_task * min(max(scale, _F0), _F1)
    else:  # clip
        reward = r_task if length <= target_length else _F0
    reward = np.float32(reward)
    return RewardBreakdown(
        task_reward=float(r_task), length_penalty=float(np.float32(r_task - reward)), reward=float(reward)
    )


def score_completion(
    source: TaskSource,
    spec: TaskSpec,
    problem: Problem,
    completion_text: str,
    output_length: int,
    target_length: int | None,
) -> RewardBreakdown:
    """Extract the answer, score it with the task's verifier, apply the spec's length term.

    This one function is what a worker calls to fill a rollout row and what a validator calls to check it, so
    both must derive the arguments alike: `completion_text = tokenizer.decode(output_tokens)` (special tokens
    kept) and `output_length = len(output_tokens)` of the row.
    """
    answer = extract_answer(completion_text)
    task_reward = 0.0 if answer is None else source.score(problem, answer)
    reward = spec.reward
    return compute_reward(task_reward, output_length, target_length, reward.length_mode, reward.alpha, reward.delta)
