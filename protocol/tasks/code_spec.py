"""The `[source]` of a code task (`type = "code"`): the JSONL rows, read and checked once, when the spec loads.
The format and the scoring rules are `protocol.tasks.code_source`'s docstring."""

from __future__ import annotations

import hashlib
import keyword
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from protocol.sandbox.runner import MAX_STDIN_BYTES
from protocol.tasks.errors import TaskSpecError
from protocol.tasks.fields import Fields, parse_problem_rows

MAX_TESTS = 64


@dataclass(frozen=True)
class CodeTest:
    stdin: str
    stdout: str


@dataclass(frozen=True)
class CodeProblemRow:
    """One line of a code JSONL file."""

    id: str
    question: str
    tests: tuple[CodeTest, ...]
    entry: str | None = None
    solution: str = ""


@dataclass(frozen=True)
class CodeSourceSpec:
    """Code problems from a JSONL file; the rows are read and checked once, at load."""

    path: Path  # resolved; not part of the hash
    problems: tuple[CodeProblemRow, ...]
    content_sha256: bytes  # of the file's bytes, as read
    type: Literal["code"] = "code"


def parse_code_source(path: Path, fields: Fields) -> CodeSourceSpec:
    """The `[source]` table of a code task (`type` already taken): `path` is the JSONL, relative to the TOML."""
    jsonl = (path.parent / fields.text("path", nonempty=True)).resolve()
    try:
        data = jsonl.read_bytes()
    except OSError as exc:
        raise TaskSpecError(path, "source.path", f"cannot read {jsonl} ({exc.strerror})") from None
    return CodeSourceSpec(
        path=jsonl, problems=parse_code_jsonl(jsonl, data), content_sha256=hashlib.sha256(data).digest()
    )


def parse_code_jsonl(path: Path, data: bytes) -> tuple[CodeProblemRow, ...]:
    """Rows of the format above; blank lines are skipped, ids must be unique, every problem needs a test."""

    def parse_row(row: Fields, where: str) -> CodeProblemRow:
        problem = CodeProblemRow(
            id=row.text("id", nonempty=True),
            question=row.text("question", nonempty=True),
            tests=_parse_tests(path, where, row.raw("tests")),
            entry=_parse_entry(row, row.raw("entry", default=None)),
            solution=row.text("solution", default=""),
        )
        row.done()
        return problem

    return parse_problem_rows(path, data, parse_row)


def _parse_tests(path: Path, where: str, raw: object) -> tuple[CodeTest, ...]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_TESTS:
        raise TaskSpecError(path, f"{where}.tests", f"must be a list of 1 to {MAX_TESTS} tests")
    tests = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise TaskSpecError(path, f"{where}.tests[{i}]", "must be an object with stdin and stdout")
        test = Fields(path, f"{where}.tests[{i}]", item)
        case = CodeTest(stdin=test.text("stdin", default=""), stdout=test.text("stdout"))
        test.done()
        if len(case.stdin.encode("utf-8")) > MAX_STDIN_BYTES:
            test.fail("stdin", f"longer than the sandbox's {MAX_STDIN_BYTES} bytes")
        tests.append(case)
    return tuple(tests)


def _parse_entry(row: Fields, entry: object) -> str | None:
    if entry is not None and (not isinstance(entry, str) or not entry.isidentifier() or keyword.iskeyword(entry)):
        row.fail("entry", f"must be a Python function name, got {entry!r}")
    return entry
