"""A task restricted to a listed subset of its source's problems, in the list's order: the list and its format are
`protocol.tasks.problem_list`'s."""

from __future__ import annotations

from collections.abc import Sequence

from protocol.tasks.errors import UnknownProblem
from protocol.tasks.problem import Problem, TaskSource


class FilteredSource:
    """A `TaskSource` that shows only the listed problems of another; problems and scores come from it."""

    def __init__(self, inner: TaskSource, task: str, ids: Sequence[str]) -> None:
        self.inner = inner
        self.task = task
        self._ids = tuple(ids)
        self._kept = frozenset(self._ids)

    def problem_ids(self) -> Sequence[str]:
        return self._ids

    def problem(self, problem_id: str) -> Problem:
        self._check(problem_id)
        return self.inner.problem(problem_id)

    def score(self, problem: Problem, answer_text: str) -> float:
        self._check(problem.id)
        return self.inner.score(problem, answer_text)

    def _check(self, problem_id: str) -> None:
        if problem_id not in self._kept:
            raise UnknownProblem(self.task, problem_id)
