"""Problem sources: where a task's problems come from and how an extracted answer is scored.

Callers see only `TaskSource` and `open_source(spec)`; a new kind of source (the Docker-sandboxed "code" source)
is one more spec dataclass and one more entry in `_FACTORIES`, with no change to workers or validators.

Every source must be deterministic: the same spec gives the same ids in the same order, the same problem for an
id, and the same score for an answer on every machine, because a validator recomputes the worker's rewards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from node.tasks.spec import TaskSpec


@dataclass(frozen=True)
class Problem:
    """One problem: `answer` is the reference the scorer compares with; `metadata` is what the source's scorer
    needs besides it (reasoning-gym entries keep theirs here)."""

    id: str
    question: str
    answer: str
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


class TaskSource(Protocol):
    """The problems of one task and its verifier."""

    def problem_ids(self) -> Sequence[str]:
        """All problem ids in a stable order (the order assignment indexes into)."""
        ...

    def problem(self, problem_id: str) -> Problem:
        """The problem with this id; raises `UnknownProblem` for an id the task does not contain."""
        ...

    def score(self, problem: Problem, answer_text: str) -> float:
        """Task reward in [0, 1] for an extracted answer; never raises on hostile text, scores it 0 instead."""
        ...


def _open_reasoning_gym(spec: TaskSpec) -> TaskSource:
    from node.tasks.reasoning_gym_source import ReasoningGymSource

    return ReasoningGymSource(spec)


def _open_math_jsonl(spec: TaskSpec) -> TaskSource:
    from node.tasks.math_source import MathSource

    return MathSource(spec)


def _open_code(spec: TaskSpec) -> TaskSource:
    from node.tasks.code_source import CodeSource

    return CodeSource.from_spec(spec)


# Imports stay inside the factories: reasoning-gym and sympy each take about a second to import.
_FACTORIES: dict[str, Callable[[TaskSpec], TaskSource]] = {
    "reasoning_gym": _open_reasoning_gym,
    "math_jsonl": _open_math_jsonl,
    "code": _open_code,
}


def open_source(spec: TaskSpec) -> TaskSource:
    """The source for a spec, chosen by its `source.type` (the spec loader has already validated it).

    A spec with a problem list gets the source restricted to those problems, in the list's order.
    """
    source = _FACTORIES[spec.source.type](spec)
    if spec.problem_list is None:
        return source
    from node.tasks.filtered_source import FilteredSource  # lazy: it imports this module

    return FilteredSource(source, spec.name, spec.problem_list.ids)


def clamp_score(value: float) -> float:
    """Scores outside [0, 1] (or NaN) from a third-party scorer become the nearest bound (NaN becomes 0)."""
    if not value >= 0.0:  # also catches NaN
        return 0.0
    return min(float(value), 1.0)
