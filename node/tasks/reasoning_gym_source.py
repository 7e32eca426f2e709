"""reasoning-gym datasets as a task source: procedural problems regenerated from (dataset, seed, size, config).

Problem i of a dataset is a pure function of its seed and i (reasoning-gym seeds a `Random(seed + i)` per item),
so a worker and a validator that load the same spec see the same problem behind the id "basic_arithmetic/17"
without shipping any data. Scoring uses the dataset's own `score_answer`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, overload

from node.tasks.errors import UnknownProblem
from node.tasks.sources import Problem, clamp_score
from node.tasks.spec import ReasoningGymSourceSpec, TaskSpec

logger = logging.getLogger(__name__)

# Longer answers score 0 without reaching the dataset's scorer, which may do quadratic work on them.
MAX_ANSWER_CHARS = 8192


class ProblemIds(Sequence[str]):
    """The ids "<dataset>/<i>" for i in range(size), made on demand (sizes can be millions)."""

    def __init__(self, dataset: str, size: int) -> None:
        self.prefix = f"{dataset}/"
        self.size = size

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        if not -self.size <= index < self.size:
            raise IndexError(index)
        return f"{self.prefix}{index % self.size}"

    def index_of(self, problem_id: str) -> int | None:
        """The i of a canonical id ("x/17", never "x/017" or "x/+17"), or None."""
        if not problem_id.startswith(self.prefix):
            return None
        digits = problem_id[len(self.prefix) :]
        if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
            return None
        index = int(digits)
        return index if index < self.size else None


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


def config_error(dataset: str, seed: int, size: int, config: dict[str, Any]) -> tuple[str, str] | None:
    """(spec field, why) reasoning-gym would refuse this dataset config, or None when it accepts it."""
    import reasoning_gym  # noqa: F401  # registers every dataset
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        return "source.dataset", f"unknown reasoning-gym dataset {dataset!r}"
    config_cls = DATASETS[dataset][1]
    known = {f.name for f in dataclasses.fields(config_cls)} - {"seed", "size"}
    unknown = sorted(set(config) - known)
    if unknown:
        return "source.config", f"{dataset} has no key(s) {', '.join(unknown)}; it knows {', '.join(sorted(known))}"
    try:
        made = config_cls(**config, seed=seed, size=size)
        if hasattr(made, "validate"):
            made.validate()
    except (AssertionError, TypeError, ValueError) as exc:
        return "source.config", f"{dataset} rejects it: {exc}"
    return None
