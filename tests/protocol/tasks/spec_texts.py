"""The task specs that the spec tests write: a reasoning-gym spec with every field set, a math_jsonl spec over
ROWS, and `with_problems` to give either a problem list (tests/protocol/tasks/test_task_spec.py,
test_filtered_source.py)."""

from __future__ import annotations

from pathlib import Path

RG_SPEC = """\
name = "arith"
[source]
type = "reasoning_gym"
dataset = "basic_arithmetic"
seed = 0
size = 100
[source.config]
min_terms = 2
max_terms = 2
operators = ["+", "-"]
[prompt]
system = "sys"
answer_format = "Reply with <answer>N</answer>."
thinking_budget = [16, 32]
[reward]
length_mode = "exact"
alpha = 0.5
delta = 0.0
[sampling]
temperature = 1.0
top_p = 1.0
max_tokens = 64
"""

MATH_SPEC = """\
name = "math"
[source]
type = "math_jsonl"
path = "rows.jsonl"
[prompt]
answer_format = "<answer>...</answer>"
[sampling]
max_tokens = 64
"""

ROWS = '{"id": "a", "question": "1+1?", "answer": "2"}\n{"id": "b", "question": "1/2?", "answer": "0.5"}\n'


def write_spec(directory: Path, text: str, rows: str | None = ROWS) -> Path:
    """`text` as `directory/spec.toml`, with `rows` as its rows.jsonl unless None."""
    path = directory / "spec.toml"
    path.write_text(text, encoding="utf-8")
    if rows is not None:
        (directory / "rows.jsonl").write_text(rows, encoding="utf-8")
    return path


def with_problems(text: str, line: str = 'problems = "ids.txt"') -> str:
    """`text` with `line` (a `problems` key, by default naming ids.txt) in its [source] table."""
    return text.replace("[source]\n", f"[source]\n{line}\n", 1)
