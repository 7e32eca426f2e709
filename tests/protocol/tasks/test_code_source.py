"""The code task source: JSONL parsing, program extraction, and all-or-nothing scoring in the Docker sandbox.

Tests marked `docker` skip when no engine answers (run `scripts/ensure-docker.sh`), except under CI=true, where
they fail instead.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from protocol.sandbox import CONTAINER_LABEL, SandboxLimits
from protocol.tasks.code_source import (
    CodeSource,
    build_program,
    extract_program,
    normalize_output,
)
from protocol.tasks.code_spec import parse_code_jsonl, parse_code_source
from protocol.tasks.errors import TaskSpecError, UnknownProblem
from protocol.tasks.fields import Fields
from tests.conftest import docker_or_skip

SAMPLE = Path(__file__).parents[3] / "configs/tasks/code-sample.toml"
SUM = {"id": "sum", "question": "Add two integers.", "tests": [{"stdin": "1 2\n", "stdout": "3\n"}]}


def load_sample(client: Any = None) -> CodeSource:
    """The sample task's problems, read through the same parser the task spec uses for `type = "code"`."""
    table = tomllib.loads(SAMPLE.read_text())["source"]
    assert table.pop("type") == "code"
    problems = parse_code_source(SAMPLE, Fields(SAMPLE, "source", table)).problems
    return CodeSource("code-sample", problems, limits=SandboxLimits(wall_time_s=2.0), client=client)


def jsonl(*rows: object) -> bytes:
    return "\n".join(json.dumps(row) for row in rows).encode()


@pytest.fixture(scope="module")
def sample() -> CodeSource:
    return load_sample()


@pytest.fixture(scope="module")
def docker_client() -> Any:
    return docker_or_skip()


@pytest.fixture
def code_sample(docker_client: Any) -> Any:
    """The sample task scored against the engine; after the test, no sandbox container may remain."""
    yield load_sample(docker_client)
    assert docker_client.containers.list(all=True, filters={"label": CONTAINER_LABEL}) == []


# --- without Docker -------------------------------------------------------------------------------------------


def test_sample_task_has_five_problems_each_with_tests_and_a_solution(sample: CodeSource) -> None:
    assert len(sample.problem_ids()) == 5
    for problem_id in sample.problem_ids():
        problem = sample.problem(problem_id)
        assert problem.answer and problem.metadata["tests"]


def test_unknown_problem_raises(sample: CodeSource) -> None:
    with pytest.raises(UnknownProblem):
        sample.problem("no-such-problem")


def test_program_is_the_last_fenced_block_or_the_whole_answer() -> None:
    assert extract_program("print(1)") == "print(1)"
    assert extract_program("Here:\n```python\nprint(1)\n```\nand\n```\nprint(2)\n```") == "print(2)\n"
    assert extract_program("```py\nx = 1\n```") == "x = 1\n"


def test_entry_program_gets_a_driver_that_calls_it_on_stdin() -> None:
    assert build_program("print(1)", None) == "print(1)"
    program = build_program("def solve(t):\n    return t", "solve")
    assert program.startswith("def solve(t):") and "solve(_prime_sys.stdin.read())" in program


def test_output_comparison_ignores_trailing_whitespace_only() -> None:
    assert normalize_output("3\n") == normalize_output("3") == normalize_output("3  \r\n\n\n")
    assert normalize_output(" 3") != normalize_output("3")
    assert normalize_output("1\n\n2") != normalize_output("1\n2")


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({**SUM, "tests": []}, "line 1.tests"),
        ({**SUM, "tests": [{"stdin": "1"}]}, "line 1.tests[0].stdout"),
        ({**SUM, "tests": [{"stdin": "", "stdout": "", "extra": 1}]}, "line 1.tests[0]"),
        ({**SUM, "entry": "not a name"}, "line 1.entry"),
        ({**SUM, "entry": "class"}, "line 1.entry"),
        ({**SUM, "id": ""}, "line 1.id"),
        ({**SUM, "hint": "x"}, "line 1"),
    ],
)
def test_invalid_rows_are_rejected_naming_the_field(row: dict[str, Any], field: str, tmp_path: Path) -> None:
    with pytest.raises(TaskSpecError) as info:
        parse_code_jsonl(tmp_path / "p.jsonl", jsonl(row))
    assert info.value.field == field


def test_duplicate_ids_and_empty_files_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(TaskSpecError, match="duplicate id"):
        parse_code_jsonl(tmp_path / "p.jsonl", jsonl(SUM, SUM))
    with pytest.raises(TaskSpecError, match="holds no problems"):
        parse_code_jsonl(tmp_path / "p.jsonl", b"\n\n")


# --- with Docker ----------------------------------------------------------------------------------------------


@pytest.mark.docker
def test_every_reference_solution_scores_one(code_sample: CodeSource) -> None:
    for problem_id in code_sample.problem_ids():
        problem = code_sample.problem(problem_id)
        assert code_sample.score(problem, problem.answer) == 1.0, problem_id


@pytest.mark.docker
def test_fenced_correct_program_scores_one_and_wrong_program_zero(code_sample: CodeSource) -> None:
    problem = code_sample.problem("sum-two")
    assert code_sample.score(problem, "```python\na, b = map(int, input().split())\nprint(a + b)\n```") == 1.0
    assert code_sample.score(problem, "a, b = map(int, input().split())\nprint(a - b)") == 0.0


@pytest.mark.docker
def test_passing_only_some_tests_scores_zero(code_sample: CodeSource) -> None:
    problem = code_sample.problem("sum-two")
    assert code_sample.score(problem, "print(3)") == 0.0  # right for the first test only


READ = "a, b = map(int, input().split())\n"
HOSTILE = {  # each prints the right sum afterwards: only the sandbox's limits make it score 0
    "endless loop": READ + "while True:\n    pass\nprint(a + b)",
    "fork 200 processes": READ
    + "import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n        time.sleep(1)\n"
    "        os._exit(0)\nprint(a + b)",
    "network": READ + "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint(a + b)",
    "huge output": READ + "import sys\nprint(a + b)\nfor _ in range(256):\n    sys.stdout.write(' \\n' * 32768)",
    "huge file": READ + "f = open('/tmp/x', 'wb')\nfor _ in range(64):\n    f.write(b'x' * (1 << 20))\nprint(a + b)",
    "memory hog": READ + "s = 'x' * (1 << 30)\nprint(a + b)",
    "write to /": READ + "open('/answer', 'w').write('x')\nprint(a + b)",
}


@pytest.mark.docker
@pytest.mark.parametrize("program", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_answer_scores_zero_and_leaves_no_container(code_sample: CodeSource, program: str) -> None:
    assert code_sample.score(code_sample.problem("sum-two"), program) == 0.0


def test_sample_task_loads_through_the_task_spec() -> None:
    from protocol.tasks import load_task_spec, open_source, spec_hash

    spec = load_task_spec(SAMPLE)
    source = open_source(spec)
    assert isinstance(source, CodeSource)
    assert list(source.problem_ids()) == list(load_sample().problem_ids())
    assert len(spec_hash(spec)) == 32
