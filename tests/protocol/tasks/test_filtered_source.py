"""A spec's problem list: it restricts the source in file order, binds the spec hash, and bad lists are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.tasks import TaskSpecError, UnknownProblem, assign_problem_ids, load_task_spec, open_source, spec_hash
from tests.protocol.tasks.spec_texts import MATH_SPEC, RG_SPEC, ROWS, with_problems

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "tasks"


def write_rg(directory: Path, ids: str | None) -> Path:
    """The RG spec in `directory`, naming ids.txt (holding `ids`) when `ids` is not None."""
    path = directory / "spec.toml"
    path.write_text(RG_SPEC if ids is None else with_problems(RG_SPEC), encoding="utf-8")
    if ids is not None:
        (directory / "ids.txt").write_text(ids, encoding="utf-8")
    return path


def test_shipped_specs_hash_as_before_problem_lists_existed() -> None:
    # Pinned: a spec without `problems` must keep its hash, or every rollout file already written stops verifying.
    assert spec_hash(load_task_spec(CONFIGS / "default.toml")).hex() == (
        "23b0e6388494cb3a4747b9f075bc4d99f594ce529f88a01d378470ad18efaff5"
    )
    assert spec_hash(load_task_spec(CONFIGS / "math-sample.toml")).hex() == (
        "ec9e5fdb60cdb51a6ee35ed7026d9b3adc4c304c6d8a8ff4b71230696aa3e845"
    )


def test_listed_problems_are_the_ids_in_file_order(tmp_path: Path) -> None:
    spec = load_task_spec(write_rg(tmp_path, "basic_arithmetic/7\nbasic_arithmetic/3\nbasic_arithmetic/42\n"))
    assert spec.problem_list is not None and spec.problem_list.path == (tmp_path / "ids.txt").resolve()
    source = open_source(spec)
    assert list(source.problem_ids()) == ["basic_arithmetic/7", "basic_arithmetic/3", "basic_arithmetic/42"]
    full = open_source(load_task_spec(write_rg(tmp_path / "", None)))
    problem = source.problem("basic_arithmetic/3")
    assert problem == full.problem("basic_arithmetic/3")
    assert source.score(problem, problem.answer) == 1.0
    assert source.score(problem, "no") == 0.0


def test_a_problem_outside_the_list_is_unknown(tmp_path: Path) -> None:
    source = open_source(load_task_spec(write_rg(tmp_path, "basic_arithmetic/7\n")))
    outside = open_source(load_task_spec(write_rg(tmp_path / "", None))).problem("basic_arithmetic/8")
    with pytest.raises(UnknownProblem, match="basic_arithmetic/8"):
        source.problem("basic_arithmetic/8")
    with pytest.raises(UnknownProblem, match="basic_arithmetic/8"):
        source.score(outside, outside.answer)


def test_assignment_only_draws_listed_problems(tmp_path: Path) -> None:
    listed = {"basic_arithmetic/5", "basic_arithmetic/50", "basic_arithmetic/95"}
    source = open_source(load_task_spec(write_rg(tmp_path, "\n".join(sorted(listed)))))
    for step in range(5):
        drawn = assign_problem_ids(source.problem_ids(), 1, "0x" + "11" * 20, step, 0, 2)
        assert len(set(drawn)) == 2 and set(drawn) <= listed


def test_the_list_enters_the_hash_and_only_its_ids_in_order_count(tmp_path: Path) -> None:
    def hash_with(ids: str | None) -> bytes:
        return spec_hash(load_task_spec(write_rg(tmp_path, ids)))

    unfiltered = hash_with(None)
    listed = hash_with("basic_arithmetic/1\nbasic_arithmetic/2\n")
    assert listed != unfiltered
    assert hash_with("basic_arithmetic/1\r\n\nbasic_arithmetic/2") == listed  # same ids, other line endings
    assert hash_with("basic_arithmetic/2\nbasic_arithmetic/1\n") != listed  # order is what assignment indexes
    assert hash_with("basic_arithmetic/1\nbasic_arithmetic/3\n") != listed
    assert hash_with("basic_arithmetic/1\n") != listed


def test_math_source_keeps_only_listed_rows(tmp_path: Path) -> None:
    (tmp_path / "spec.toml").write_text(with_problems(MATH_SPEC), encoding="utf-8")
    (tmp_path / "rows.jsonl").write_text(ROWS, encoding="utf-8")
    (tmp_path / "ids.txt").write_text("b\n", encoding="utf-8")
    source = open_source(load_task_spec(tmp_path / "spec.toml"))
    assert list(source.problem_ids()) == ["b"]
    assert source.problem("b").answer == "0.5"
    with pytest.raises(UnknownProblem):
        source.problem("a")


# (content of ids.txt or None for no file, field named in the error, file named in the error, message fragment)
BAD_LISTS = [
    (None, "source.problems", "spec.toml", "cannot read"),
    ("", "file", "ids.txt", "lists no problems"),
    ("\n  \n", "file", "ids.txt", "lists no problems"),
    ("basic_arithmetic/1\nbasic_arithmetic/2\nbasic_arithmetic/1\n", "line 3", "ids.txt", "duplicate id"),
    ("basic_arithmetic/1\nbasic_arithmetic/100\n", "line 2", "ids.txt", "no problem 'basic_arithmetic/100'"),
    ("basic_arithmetic/01\n", "line 1", "ids.txt", "no problem"),
    ("basic_arithmetic/1 \n", "line 1", "ids.txt", "no problem 'basic_arithmetic/1 '"),
    ("chain_sum/1\n", "line 1", "ids.txt", "no problem"),
]


@pytest.mark.parametrize(("ids", "field", "file", "fragment"), BAD_LISTS)
def test_bad_list_is_refused_naming_file_and_line(
    tmp_path: Path, ids: str | None, field: str, file: str, fragment: str
) -> None:
    path = write_rg(tmp_path, ids)
    if ids is None:
        path.write_text(with_problems(RG_SPEC), encoding="utf-8")
    with pytest.raises(TaskSpecError, match=fragment) as caught:
        load_task_spec(path)
    assert caught.value.field == field
    assert Path(caught.value.path).name == file
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("line", "fragment"), [('problems = ""', "must not be empty"), ("problems = 3", "string")])
def test_problems_key_must_name_a_file(tmp_path: Path, line: str, fragment: str) -> None:
    (tmp_path / "spec.toml").write_text(with_problems(RG_SPEC, line), encoding="utf-8")
    with pytest.raises(TaskSpecError, match=fragment) as caught:
        load_task_spec(tmp_path / "spec.toml")
    assert caught.value.field == "source.problems"


def test_non_utf8_list_is_refused(tmp_path: Path) -> None:
    path = write_rg(tmp_path, "")
    (tmp_path / "ids.txt").write_bytes(b"basic_arithmetic/1\n\xff\n")
    with pytest.raises(TaskSpecError, match="not UTF-8"):
        load_task_spec(path)
