"""What a rollout file must contain, derived from public inputs only.

Worker and validator both call `plan_rollouts`: the problems come from the deterministic assignment, the
prompt tokens from the task's prompt builder and the model's chat template, and every sample's seed from
the assignment key. A worker therefore cannot pick easy problems, reword a prompt, or re-roll seeds until
it likes the samples, and a validator checks all of that by comparing, without running the model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.tasks.assignment import assign_problem_ids, assignment_key
from protocol.tasks.prompts import build_messages, target_length_for
from protocol.tasks.sources import Problem, TaskSource
from protocol.tasks.spec import TaskSpec
from protocol.work import AssignedWork

_SEED_MASK = (1 << 63) - 1  # seeds are stored as int64


@dataclass(frozen=True)
class Job(AssignedWork):
    """One file's worth of work: which assignment, and how many prompts and samples per prompt."""

    signature: bytes | None = None  # the coordinator's `Assignment` signature; None for work nobody assigned
    issued_at: int | None = None  # the issue time that signature covers (unix seconds, the trainer's clock)

    def __post_init__(self) -> None:
        if self.prompts < 1 or self.group_size < 1:
            raise ValueError(f"prompts and group size must be at least 1, got {self.prompts} and {self.group_size}")


@dataclass(frozen=True)
class PlannedPrompt:
    """One prompt of the file: the row group `group` holds `len(seeds)` samples of it."""

    group: int
    problem: Problem
    prompt_tokens: tuple[int, ...]
    target_length: int | None
    seeds: tuple[int, ...]


def derived_seed(key: bytes, *parts: int) -> int:
    """A non-negative int64 from the assignment key and indices (sha256, so no party can steer it)."""
    digest = hashlib.sha256(key + b"".join(part.to_bytes(8, "big", signed=True) for part in parts)).digest()
    return int.from_bytes(digest[:8], "big") & _SEED_MASK


def prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[int, ...]:
    """The chat template's token ids for `messages`, ending with the assistant's turn opening."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):  # some tokenizers return a BatchEncoding
        encoded = encoded["input_ids"]
    return tuple(int(token) for token in encoded)


def completion_text(tokenizer: Any, output_tokens: Sequence[int]) -> str:
    """The text a reward is computed from (special tokens kept): one definition for worker and validator."""
    return str(tokenizer.decode(list(output_tokens), skip_special_tokens=False))


def plan_rollouts(job: Job, spec: TaskSpec, source: TaskSource, tokenizer: Any) -> list[PlannedPrompt]:
    key = assignment_key(job.pool_id, job.node, job.step, job.counter)
    problem_ids = assign_problem_ids(source.problem_ids(), job.pool_id, job.node, job.step, job.counter, job.prompts)
    planned = []
    for group, problem_id in enumerate(problem_ids):
        problem = source.problem(problem_id)
        target = target_length_for(spec, problem_id, derived_seed(key, group))
        tokens = prompt_tokens(tokenizer, build_messages(spec, problem, target))
        seeds = tuple(derived_seed(key, group, sample) for sample in range(job.group_size))
        planned.append(PlannedPrompt(group, problem, tokens, target, seeds))
    return planned
