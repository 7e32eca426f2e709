"""Task spec loading: the shipped specs load, every bad field is refused naming itself, the hash binds the task."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from protocol.tasks import TaskSpecError, load_task_spec, spec_hash
from protocol.tasks.spec import MathJsonlSourceSpec, ReasoningGymSourceSpec
from tests.protocol.tasks.spec_texts import MATH_SPEC, RG_SPEC, ROWS, write_spec

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "tasks"


def test_default_spec_is_two_term_addition_and_subtraction() -> None:
    spec = load_task_spec(CONFIGS / "default.toml")
    assert isinstance(spec.source, ReasoningGymSourceSpec)
    assert spec.source.dataset == "basic_arithmetic" and spec.source.size == 10_000 and spec.source.seed == 0
    config = spec.source.config_kwargs()
    assert config["operators"] == ["+", "-"] and config["max_terms"] == 2 and config["max_digits"] == 2
    assert spec.prompt.thinking_budget == () and spec.reward.length_mode == "none"
    assert (spec.sampling.temperature, spec.sampling.top_p, spec.sampling.max_tokens) == (1.0, 1.0, 64)


def test_math_sample_spec_reads_every_row() -> None:
    spec = load_task_spec(CONFIGS / "math-sample.toml")
    assert isinstance(spec.source, MathJsonlSourceSpec)
    assert len(spec.source.problems) >= 20
    assert len({row.id for row in spec.source.problems}) == len(spec.source.problems)


def test_full_spec_parses_every_field(tmp_path: Path) -> None:
    spec = load_task_spec(write_spec(tmp_path, RG_SPEC))
    assert spec.name == "arith"
    assert spec.prompt.system == "sys" and spec.prompt.thinking_budget == (16, 32)
    assert (spec.reward.length_mode, spec.reward.alpha, spec.reward.delta) == ("exact", 0.5, 0.0)
    assert isinstance(spec.source, ReasoningGymSourceSpec)
    assert spec.source.config == (("max_terms", 2), ("min_terms", 2), ("operators", ("+", "-")))


def test_defaults_fill_optional_tables(tmp_path: Path) -> None:
    spec = load_task_spec(write_spec(tmp_path, MATH_SPEC))
    assert spec.prompt.system == "" and spec.prompt.thinking_budget == ()
    assert (spec.reward.length_mode, spec.reward.alpha, spec.reward.delta) == ("none", 0.0, 0.0)
    assert (spec.sampling.temperature, spec.sampling.top_p) == (1.0, 1.0)


# (text to replace in RG_SPEC, replacement, field named in the error)
BAD_RG = [
    ('name = "arith"\n', "", "name"),
    ('name = "arith"', "name = 3", "name"),
    ('name = "arith"', 'name = "  "', "name"),
    ('name = "arith"', 'name = "arith"\ncolour = "red"', "top level"),
    ('type = "reasoning_gym"', 'type = "bogus"', "source.type"),
    ('dataset = "basic_arithmetic"', 'dataset = "no_such_dataset"', "source.dataset"),
    ("seed = 0", "seed = -1", "source.seed"),
    ("seed = 0", "seed = true", "source.seed"),
    ("seed = 0", 'seed = "0"', "source.seed"),
    ("size = 100", "size = 0", "source.size"),
    ("size = 100\n", "", "source.size"),
    ("min_terms = 2", "min_terms = 2\ncolour = 1", "source.config"),
    ("min_terms = 2", "min_terms = 0", "source.config"),
    ("min_terms = 2", "min_terms = 3", "source.config"),  # max_terms < min_terms
    ("min_terms = 2", 'min_terms = 2\noperators2 = ["^"]', "source.config"),
    ('operators = ["+", "-"]', 'operators = ["^"]', "source.config"),
    ("min_terms = 2", "min_terms = 2\nseed = 4", "source.config.seed"),
    ("min_terms = 2", "min_terms = 2\nnested = { a = 1 }", "source.config.nested"),
    ('operators = ["+", "-"]', 'operators = [["+"]]', "source.config.operators"),
    ('answer_format = "Reply with <answer>N</answer>."', 'answer_format = "Reply with N."', "prompt.answer_format"),
    ('answer_format = "Reply with <answer>N</answer>."', "answer_format = 5", "prompt.answer_format"),
    ("thinking_budget = [16, 32]", "thinking_budget = true", "prompt.thinking_budget"),
    ("thinking_budget = [16, 32]", "thinking_budget = []", "prompt.thinking_budget"),
    ("thinking_budget = [16, 32]", "thinking_budget = [0, 16]", "prompt.thinking_budget"),
    ("thinking_budget = [16, 32]", 'thinking_budget = ["16"]', "prompt.thinking_budget"),
    ("thinking_budget = [16, 32]", "thinking_budget = [16, 128]", "prompt.thinking_budget"),  # > max_tokens
    ("thinking_budget = [16, 32]", "thinking_budget = false", "reward.length_mode"),  # exact needs targets
    ('length_mode = "exact"', 'length_mode = "bogus"', "reward.length_mode"),
    ("alpha = 0.5", "alpha = 0.0", "reward.alpha"),
    ("alpha = 0.5", "alpha = -1", "reward.alpha"),
    ("alpha = 0.5", "alpha = nan", "reward.alpha"),
    ("delta = 0.0", "delta = 1.5", "reward.delta"),
    ("delta = 0.0", "delta = 0.0\ngamma = 1", "reward"),
    ("temperature = 1.0", "temperature = -0.1", "sampling.temperature"),
    ("top_p = 1.0", "top_p = 0.0", "sampling.top_p"),
    ("top_p = 1.0", "top_p = 1.5", "sampling.top_p"),
    ("max_tokens = 64\n", "", "sampling.max_tokens"),
    ("max_tokens = 64", "max_tokens = 64.0", "sampling.max_tokens"),
    ("[sampling]", "[sample]", "sampling"),
    ("max_tokens = 64", 'max_tokens = 64\ndtype = "float16"', "sampling.dtype"),
    ("max_tokens = 64", "max_tokens = 64\ndtype = 32", "sampling.dtype"),
]


@pytest.mark.parametrize(("old", "new", "field"), BAD_RG, ids=[f"{f}:{n[:30]}" for _, n, f in BAD_RG])
def test_bad_field_is_refused_naming_it(tmp_path: Path, old: str, new: str, field: str) -> None:
    assert old in RG_SPEC
    with pytest.raises(TaskSpecError) as caught:
        load_task_spec(write_spec(tmp_path, RG_SPEC.replace(old, new, 1), rows=None))
    assert caught.value.field == field, str(caught.value)
    assert "\n" not in str(caught.value)


BAD_ROWS = [
    ('{"id": "a", "question": "q", "answer": "1"}\nnot json\n', "line 2"),
    ('["a", "q", "1"]\n', "line 1"),
    ('{"id": "a", "question": "q"}\n', "line 1.answer"),
    ('{"id": "a", "question": "q", "answer": 2}\n', "line 1.answer"),
    ('{"id": "", "question": "q", "answer": "2"}\n', "line 1.id"),
    ('{"id": "a", "question": "q", "answer": "2", "hint": "x"}\n', "line 1"),
    ('{"id": "a", "question": "q", "answer": "1"}\n{"id": "a", "question": "r", "answer": "2"}\n', "line 2.id"),
    ("\n\n", "file"),
]


@pytest.mark.parametrize(("rows", "field"), BAD_ROWS)
def test_bad_jsonl_row_is_refused_naming_its_line(tmp_path: Path, rows: str, field: str) -> None:
    with pytest.raises(TaskSpecError) as caught:
        load_task_spec(write_spec(tmp_path, MATH_SPEC, rows=rows))
    assert caught.value.field == field
    assert caught.value.path.endswith("rows.jsonl")


def test_missing_jsonl_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskSpecError, match="cannot read") as caught:
        load_task_spec(write_spec(tmp_path, MATH_SPEC, rows=None))
    assert caught.value.field == "source.path"


def test_blank_lines_in_jsonl_are_skipped(tmp_path: Path) -> None:
    spec = load_task_spec(write_spec(tmp_path, MATH_SPEC, rows="\n" + ROWS + "\n\n"))
    assert isinstance(spec.source, MathJsonlSourceSpec)
    assert [row.id for row in spec.source.problems] == ["a", "b"]


def test_missing_or_malformed_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskSpecError, match="not found"):
        load_task_spec(tmp_path / "absent.toml")
    (tmp_path / "broken.toml").write_text("name = [unclosed", encoding="utf-8")
    with pytest.raises(TaskSpecError, match="not readable TOML"):
        load_task_spec(tmp_path / "broken.toml")


def test_spec_hash_changes_when_the_jsonl_changes(tmp_path: Path) -> None:
    path = write_spec(tmp_path, MATH_SPEC)
    before = spec_hash(load_task_spec(path))
    (tmp_path / "rows.jsonl").write_text(ROWS.replace('"0.5"', '"1/2"'), encoding="utf-8")
    assert spec_hash(load_task_spec(path)) != before


def test_spec_hash_ignores_where_the_files_lie(tmp_path: Path) -> None:
    path = write_spec(tmp_path, MATH_SPEC)
    elsewhere = tmp_path / "copy"
    shutil.copytree(tmp_path, elsewhere, ignore=shutil.ignore_patterns("copy"))
    assert spec_hash(load_task_spec(elsewhere / "spec.toml")) == spec_hash(load_task_spec(path))


def test_spec_hash_ignores_number_spelling_and_key_order(tmp_path: Path) -> None:
    base = spec_hash(load_task_spec(write_spec(tmp_path, RG_SPEC)))
    respelled = RG_SPEC.replace("delta = 0.0", "delta = 0").replace(
        "min_terms = 2\nmax_terms = 2", "max_terms = 2\nmin_terms = 2"
    )
    assert spec_hash(load_task_spec(write_spec(tmp_path, respelled, rows=None))) == base


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("seed = 0", "seed = 1"),
        ("size = 100", "size = 101"),
        ('operators = ["+", "-"]', 'operators = ["-", "+"]'),
        ('system = "sys"', 'system = "sys "'),
        ("thinking_budget = [16, 32]", "thinking_budget = [32, 16]"),
        ("alpha = 0.5", "alpha = 0.25"),
        ("temperature = 1.0", "temperature = 0.7"),
        ('name = "arith"', 'name = "arith2"'),
        ("max_tokens = 64", 'max_tokens = 64\ndtype = "bfloat16"'),
    ],
)
def test_spec_hash_changes_with_any_field(tmp_path: Path, old: str, new: str) -> None:
    base = spec_hash(load_task_spec(write_spec(tmp_path, RG_SPEC)))
    assert spec_hash(load_task_spec(write_spec(tmp_path, RG_SPEC.replace(old, new), rows=None))) != base


def test_the_precision_is_float32_unless_the_pool_says_bfloat16_and_float32_keeps_the_old_hash(tmp_path: Path) -> None:
    base = load_task_spec(write_spec(tmp_path, RG_SPEC, rows=None))
    assert base.sampling.dtype == "float32"
    explicit = load_task_spec(
        write_spec(tmp_path, RG_SPEC.replace("max_tokens = 64", 'max_tokens = 64\ndtype = "float32"'))
    )
    assert spec_hash(explicit) == spec_hash(base)  # a spec written before there was a choice keeps its hash
    bf16 = load_task_spec(
        write_spec(tmp_path, RG_SPEC.replace("max_tokens = 64", 'max_tokens = 64\ndtype = "bfloat16"'))
    )
    assert bf16.sampling.dtype == "bfloat16"
