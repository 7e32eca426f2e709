"""Measuring a model's pass rate on a task: the fraction of sampled completions whose task reward is 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node.generation.generate import sampling_params
from node.generation.plan import completion_text, prompt_tokens
from node.inference.base import GenerationRequest
from node.inference.torch_backend import TorchBackend
from node.model.loading import LoadedModel
from node.tasks.prompts import build_messages
from node.tasks.rewards import score_completion
from node.tasks.sources import TaskSource
from node.tasks.spec import TaskSpec


@dataclass(frozen=True)
class PassRate:
    passed: int
    total: int
    mean_reward: float

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


def pass_rate(
    loaded: LoadedModel,
    spec: TaskSpec,
    source: TaskSource,
    problem_ids: Sequence[str],
    *,
    samples: int = 1,
    seed: int = 0,
    batch_size: int = 64,
) -> PassRate:
    """Samples `samples` completions per problem with the task's own sampling parameters and scores them."""
    problems = [source.problem(pid) for pid in problem_ids]
    requests = [
        GenerationRequest(
            list(prompt_tokens(loaded.tokenizer, build_messages(spec, problem, None))), seed + i * samples + k
        )
        for i, problem in enumerate(problems)
        for k in range(samples)
    ]
    backend = TorchBackend.from_loaded(loaded, max_batch_size=batch_size)
    completions = backend.generate(requests, sampling_params(spec))
    passed, total_reward = 0, 0.0
    for index, completion in enumerate(completions):
        problem = problems[index // samples]
        text = completion_text(loaded.tokenizer, completion.output_tokens)
        reward = score_completion(source, spec, problem, text, len(completion.output_tokens), None)
        passed += reward.task_reward >= 1.0
        total_reward += reward.reward
    return PassRate(passed, len(completions), total_reward / max(1, len(completions)))
