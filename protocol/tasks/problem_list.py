"""The list of problem ids a task keeps (`[source] problems`), read with the spec: what the trainer's offline filter
produces. `protocol.tasks.filtered_source` restricts a source to it.

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

from protocol.tasks.errors import TaskSpecError

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


def parse_problem_list(spec_path: Path, relative: str, known: Callable[[str], bool]) -> ProblemListSpec:
    """Read the list a spec names and check each id with `known` (whether the task's source has it, decided from the
    spec alone): every problem raises `TaskSpecError`."""
    path = (spec_path.parent / relative).resolve()
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise TaskSpecError(spec_path, FIELD, f"cannot read {path} ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise TaskSpecError(path, "encoding", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
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
