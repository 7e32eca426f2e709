"""Problem sources: where a task's problems come from and how an extracted answer is scored.

Callers see only `TaskSource` and `open_source(spec)`; a new kind of source (the Docker-sandboxed "code" source)
is one more spec dataclass and one more entry in `_FACTORIES`, with no change to workers or validators.

Every source must be deterministic (`protocol.tasks.problem` says how).
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.tasks.problem import Problem, TaskSource, clamp_score
from protocol.tasks.spec import TaskSpec

__all__ = ["Problem", "TaskSource", "clamp_score", "open_source"]  # the first three are `protocol.tasks.problem`'s


def _open_reasoning_gym(spec: TaskSpec) -> TaskSource:
    from protocol.tasks.reasoning_gym_source import ReasoningGymSource

    return ReasoningGymSource(spec)


def _open_math_jsonl(spec: TaskSpec) -> TaskSource:
    from protocol.tasks.math_source import MathSource

    return MathSource(spec)


def _open_code(spec: TaskSpec) -> TaskSource:
    from protocol.tasks.code_source import CodeSource

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
    from protocol.tasks.filtered_source import FilteredSource

    return FilteredSource(source, spec.name, spec.problem_list.ids)
