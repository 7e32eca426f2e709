"""Errors of the tasks package: each leaf carries what a person needs to fix the input."""

from __future__ import annotations

from pathlib import Path

from core.errors import NodeError


class TaskError(NodeError):
    """Base of every error raised by `protocol.tasks`."""


class TaskSpecError(TaskError):
    """A task spec (TOML) or the file it references is invalid; the message names the file and the field."""

    def __init__(self, path: Path | str, field: str, problem: str) -> None:
        self.path = str(path)
        self.field = field
        self.problem = problem
        super().__init__(f"{self.path}: {field}: {problem}")


class UnknownProblem(TaskError):
    """A problem id that the task's source does not contain (a forged or mistyped id)."""

    def __init__(self, task: str, problem_id: str) -> None:
        self.task = task
        self.problem_id = problem_id
        super().__init__(f"task {task!r} has no problem {problem_id!r}")


class AssignmentError(TaskError):
    """Arguments that no deterministic assignment exists for (bad address, more problems than the pool holds)."""


class RewardError(TaskError):
    """Reward arguments that do not fit the length mode (a missing target length, a negative length)."""


class PromptError(TaskError):
    """A target length that the task's thinking budget does not allow (given when off, or not one of its targets)."""
