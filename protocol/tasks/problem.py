"""What every task source is: its problems (`Problem`) and the interface a source gives (`TaskSource`), apart from
the sources themselves, which import this and nothing of each other (`protocol.tasks.sources` opens them).

Every source must be deterministic: the same spec gives the same ids in the same order, the same problem for an
id, and the same score for an answer on every machine, because a validator recomputes the worker's rewards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


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


def clamp_score(value: float) -> float:
    """Scores outside [0, 1] (or NaN) from a third-party scorer become the nearest bound (NaN becomes 0)."""
    if not value >= 0.0:  # also catches NaN
        return 0.0
    return min(float(value), 1.0)
