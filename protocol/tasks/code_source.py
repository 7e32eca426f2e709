"""Code problems: the answer is a Python 3 program, run against the problem's tests in the Docker sandbox.

JSONL rows (configs/tasks/code-sample.jsonl):

    {"id": "sum-two", "question": "...", "tests": [{"stdin": "1 2\\n", "stdout": "3\\n"}, ...],
     "entry": "solve" (optional), "solution": "reference program" (optional; the problem's `answer`, used by SFT)}

Choices, and why:

- Program: the answer text (the inside of the last <answer>...</answer>, as for every task) is the program; when it
  holds a fenced block (```python ... ```) the last such block is, so a model may fence its code or not.
- Entry: with `entry`, the program defines that function instead of reading stdin itself; a driver appended to it
  calls `entry(stdin_text)` and prints the result unless it is None.
- A test passes when the program exits 0 within every limit and its stdout equals the expected output, compared
  line by line with trailing whitespace and trailing empty lines ignored. stderr is ignored.
- Score is all or nothing: 1.0 when every test passes, else 0.0. Tests run in order and the first failure ends
  the run. Partial credit would reward hard-coding the visible cases, and stopping early bounds the cost of a
  hostile program to one container and one wall-time limit.
- Timeout, OOM kill, crash, too much output, a program too large to pass in: all score 0. A missing Docker
  engine or an engine failure is raised (SandboxUnavailable, SandboxError), never scored: a 0 that only means
  "this machine has no Docker" would be a wrong reward, and a validator with Docker would reject it.

Determinism: worker and validator agree as long as programs stay far from the limits (SandboxLimits defaults: 10 s,
256 MiB); a program that needs about 10 s may pass on one machine and time out on another.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from protocol.sandbox import SandboxInputError, SandboxLimits, SandboxResult, run_code
from protocol.tasks.code_spec import CodeProblemRow, CodeSourceSpec
from protocol.tasks.errors import UnknownProblem
from protocol.tasks.problem import Problem

if TYPE_CHECKING:
    import docker

    from protocol.tasks.spec import TaskSpec

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_DRIVER = """

if __name__ == "__main__":
    import sys as _prime_sys

    _prime_result = {entry}(_prime_sys.stdin.read())
    if _prime_result is not None:
        print(_prime_result)
"""


class CodeSource:
    """A `TaskSource` over code problems. Docker is reached lazily, on the first `score`."""

    def __init__(
        self,
        task: str,
        problems: Sequence[CodeProblemRow],
        *,
        limits: SandboxLimits = SandboxLimits(),
        client: docker.DockerClient | None = None,
    ) -> None:
        self.task = task
        self.limits = limits
        self._client = client
        self._rows = {row.id: row for row in problems}
        self._ids = tuple(row.id for row in problems)

    @classmethod
    def from_spec(cls, spec: TaskSpec, *, client: docker.DockerClient | None = None) -> CodeSource:
        source = spec.source
        assert isinstance(source, CodeSourceSpec)  # open_source dispatches on source.type
        return cls(spec.name, source.problems, client=client)

    def problem_ids(self) -> Sequence[str]:
        return self._ids

    def problem(self, problem_id: str) -> Problem:
        row = self._row(problem_id)
        tests = [{"stdin": t.stdin, "stdout": t.stdout} for t in row.tests]
        return Problem(
            id=row.id, question=row.question, answer=row.solution, metadata={"tests": tests, "entry": row.entry}
        )

    def score(self, problem: Problem, answer_text: str) -> float:
        """1.0 if the program passes every test of the problem, else 0.0 (tests from our rows, never the caller's)."""
        row = self._row(problem.id)
        program = build_program(extract_program(answer_text), row.entry)
        for test in row.tests:
            try:
                result = run_code(program, test.stdin, limits=self.limits, client=self._connected())
            except SandboxInputError:
                return 0.0
            if not passes(result, test.stdout):
                return 0.0
        return 1.0

    def _row(self, problem_id: str) -> CodeProblemRow:
        row = self._rows.get(problem_id)
        if row is None:
            raise UnknownProblem(self.task, problem_id)
        return row

    def _connected(self) -> docker.DockerClient:
        if self._client is None:
            from protocol.sandbox import connect

            self._client = connect()
        return self._client


def extract_program(answer_text: str) -> str:
    """The last fenced code block of the answer, or the whole answer when it has none."""
    blocks = _FENCE.findall(answer_text)
    return blocks[-1] if blocks else answer_text


def build_program(program: str, entry: str | None) -> str:
    """The program as run: with an entry function, followed by the driver that calls it on stdin."""
    return program if entry is None else program + _DRIVER.format(entry=entry)


def passes(result: SandboxResult, expected_stdout: str) -> bool:
    return result.ok and normalize_output(result.stdout) == normalize_output(expected_stdout)


def normalize_output(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing empty lines dropped ("3\\n" == "3" == "3  \\n\\n")."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines
