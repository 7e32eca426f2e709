"""reasoning-gym datasets as a task source: procedural problems regenerated from (dataset, seed, size, config).

Problem i of a dataset is a pure function of its seed and i (reasoning-gym seeds a `Random(seed + i)` per item),
so a worker and a validator that load the same spec see the same problem behind the id "basic_arithmetic/17"
without shipping any data. Scoring uses the dataset's own `score_answer`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from protocol.tasks.errors import UnknownProblem
from protocol.tasks.problem import Problem, clamp_score
from protocol.tasks.reasoning_gym_dataset import ProblemIds
from protocol.tasks.spec import ReasoningGymSourceSpec, TaskSpec

logger = logging.getLogger(__name__)

# Longer answers score 0 without reaching the dataset's scorer, which may do quadratic work on them.
MAX_ANSWER_CHARS = 8192


class ReasoningGymSource:
    """A `TaskSource` over one reasoning-gym dataset."""

    def __init__(self, spec: TaskSpec) -> None:
        import reasoning_gym

        source = spec.source
        assert isinstance(source, ReasoningGymSourceSpec)  # open_source dispatches on source.type
        self.task = spec.name
        self._dataset = reasoning_gym.create_dataset(
            source.dataset, seed=source.seed, size=source.size, **source.config_kwargs()
        )
        self._ids = ProblemIds(source.dataset, source.size)

    def problem_ids(self) -> Sequence[str]:
        return self._ids

    def problem(self, problem_id: str) -> Problem:
        entry = self._entry(problem_id)
        return Problem(
            id=problem_id,
            question=str(entry["question"]),
            answer=str(entry["answer"]),
            metadata=entry.get("metadata", {}),
        )

    def score(self, problem: Problem, answer_text: str) -> float:
        if len(answer_text) > MAX_ANSWER_CHARS:
            return 0.0
        # The dataset's own entry, not one rebuilt from `problem`: some scorers read typed fields of it.
        entry = self._entry(problem.id)
        try:
            value = float(self._dataset.score_answer(answer_text, entry))
        except Exception:  # a third-party scorer on hostile text: any failure is a wrong answer, not a crash
            logger.warning("scorer of %s failed on problem %s; scored 0", self.task, problem.id, exc_info=True)
            return 0.0
        return clamp_score(value)

    def _entry(self, problem_id: str) -> dict[str, Any]:
        index = self._ids.index_of(problem_id)
        if index is None:
            raise UnknownProblem(self.task, problem_id)
        entry: dict[str, Any] = self._dataset[index]
        return entry
