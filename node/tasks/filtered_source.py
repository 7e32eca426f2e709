"""A task restricted to a listed subset of its source's problems: what the trainer's offline filter produces.

In the spec, `[source] problems = "default.filtered.txt"` names a file of problem ids, one a line, relative to the
TOML. Workers and validators both index assignment into `problem_ids()`, so the list is part of the task: its
hash enters `spec_hash` (see `canonical_spec` and docs/offline-filter.md), and two nodes with different lists
disagree on the hash instead of silently on the assignment.

File format: UTF-8, one id a line, exactly as the source names it ("basic_arithmetic/17"); a trailing "\\r" and
blank lines are ignored. The order is kept: it is the order assignment indexes into.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node.tasks.errors import TaskSpecError, UnknownProblem
from node.tasks.sources import Problem, TaskSource
from node.tasks.spec import ReasoningGymSourceSpec, SourceSpec

FIELD = "source.problems"


@dataclass(frozen=True)
class ProblemListSpec:
    """The ids a task keeps, in file order; hashed by `sha256` (of the ids), never by where the file lies."""

    path: Path = field(compare=False)  # resolved; not part of the hash
    ids: tuple[str, ...]
    sha256: bytes  # of `list_bytes(ids)`: blank lines and line endings do not change it, any id or its order does


def list_bytes(ids: Sequence[str]) -> bytes:
    """The canonical file content of a list: each id followed by "\\n", UTF-8 (ids hold no newline)."""
    return "".join(f"{problem_id}\n" for problem_id in ids).encode("utf-8")


def parse_problem_list(spec_path: Path, relative: str, source: SourceSpec) -> ProblemListSpec:
    """Read the list a spec names and check it against the source: every problem raises `TaskSpecError`."""
    path = (spec_path.parent / relative).resolve()
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise TaskSpecError(spec_path, FIELD, f"cannot read {path} ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise TaskSpecError(path, "encoding", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    known = _id_check(source)
    ids: list[str] = []
    seen: set[str] = set()
    for number, line in enumerate(text.split("\n"), start=1):
        problem_id = line.removesuffix("\r")
        if not problem_id.strip():
            continue
        if problem_id in seen:
            raise TaskSpecError(path, f"line {number}", f"duplicate id {problem_id!r}")
        if not known(problem_id):
            raise TaskSpecError(path, f"line {number}", f"the task's source has no problem {problem_id!r}")
        seen.add(problem_id)
        ids.append(problem_id)
    if not ids:
        raise TaskSpecError(path, "file", "lists no problems")
    return ProblemListSpec(path=path, ids=tuple(ids), sha256=hashlib.sha256(list_bytes(ids)).digest())


def _id_check(source: SourceSpec) -> Callable[[str], bool]:
    """Whether the source has a problem id, decided from the spec alone (no dataset is built)."""
    if isinstance(source, ReasoningGymSourceSpec):
        from node.tasks.reasoning_gym_source import ProblemIds

        ids = ProblemIds(source.dataset, source.size)
        return lambda problem_id: ids.index_of(problem_id) is not None
    rows = {row.id for row in source.problems}
    return rows.__contains__


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
