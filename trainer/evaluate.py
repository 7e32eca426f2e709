"""Measuring a model's pass rate on a task: the fraction of sampled completions whose task reward is 1."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.generate import sampling_params
from engine.inference.base import GenerationRequest
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel
from protocol.plan import completion_text, prompt_tokens
from protocol.tasks.prompts import build_messages, target_length_for
from protocol.tasks.rewards import RewardBreakdown, score_completion
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec


@dataclass(frozen=True)
class PassRate:
    passed: int
    total: int
    mean_reward: float

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @classmethod
    def of(cls, rewards: Sequence[Sequence[RewardBreakdown]]) -> PassRate:
        """The completions `sample_rewards` scored, counted: one passes when its task reward is 1."""
        scored = [r for group in rewards for r in group]
        passed = sum(r.task_reward >= 1.0 for r in scored)
        return cls(passed, len(scored), sum(r.reward for r in scored) / max(1, len(scored)))


def sample_rewards(
    loaded: LoadedModel,
    spec: TaskSpec,
    source: TaskSource,
    problem_ids: Sequence[str],
    *,
    samples: int,
    seed: int = 0,
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> list[list[RewardBreakdown]]:
    """`samples` completions per problem with the task's own sampling parameters, scored: `[problem][sample]`.

    Completion k of problem i uses seed `seed + i * samples + k`, so a measurement is reproducible; a task with a
    thinking budget asks each problem for the target `target_length_for(spec, id, seed)`.
    """
    problems = [source.problem(pid) for pid in problem_ids]
    targets = [target_length_for(spec, problem.id, seed) for problem in problems]
    requests = [
        GenerationRequest(
            list(prompt_tokens(loaded.tokenizer, build_messages(spec, problem, target))), seed + i * samples + k
        )
        for i, (problem, target) in enumerate(zip(problems, targets, strict=True))
        for k in range(samples)
    ]
    backend = TorchBackend.from_loaded(loaded, max_batch_size=batch_size)
    completions = backend.generate(requests, sampling_params(spec), progress=progress)
    rewards: list[list[RewardBreakdown]] = [[] for _ in problems]
    for index, completion in enumerate(completions):
        i = index // samples
        text = completion_text(loaded.tokenizer, completion.output_tokens)
        rewards[i].append(score_completion(source, spec, problems[i], text, len(completion.output_tokens), targets[i]))
    return rewards


def held_out_pass_rate(model: Path, task: Path, *, problems: int, samples: int, seed: int) -> PassRate:
    """The pass rate of the model folder on the task's last `problems` problems: the ones SFT holds out, and the
    measure `prime-train eval`, `prime-devnet up` and `benchmarks/learning.py` compare before and after RL."""
    from engine.model.loading import load_model
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec

    spec = load_task_spec(task)
    source = open_source(spec)
    ids = list(source.problem_ids())[-problems:]
    return PassRate.of(sample_rewards(load_model(model), spec, source, ids, samples=samples, seed=seed))
