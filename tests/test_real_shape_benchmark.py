"""benchmarks/real_shape.py's own machinery, in milliseconds: its --help starts without torch, and the pieces that
measure (the stopwatch), change the data (the mixed rewards) and plan the trainer's memory do what its output says.
The roles themselves run only in the benchmark (minutes at the real shape); no figure is asserted."""

from __future__ import annotations

import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.real_shape import Stopwatch, mixed_rewards, train_plan  # noqa: E402


def test_help_starts_without_importing_torch() -> None:
    probe = "import sys, benchmarks.real_shape; print('torch' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "False"
    shown = subprocess.run([sys.executable, "benchmarks/real_shape.py", "--help"], cwd=REPO, capture_output=True,
                           text=True, check=True)  # fmt: skip
    assert "--layers" in shown.stdout and "--skip-vllm" in shown.stdout


def test_stopwatch_times_each_call_and_lists_a_function_that_is_gone() -> None:
    owner = types.SimpleNamespace(work=lambda x: time.sleep(0.01) or x * 2)
    watch = Stopwatch()
    watch.wrap(owner, "work", "the work")
    watch.wrap(owner, "renamed")
    assert owner.work(3) == 6 and owner.work(4) == 8
    [(name, seconds, calls)] = watch.report()
    assert (name, calls) == ("the work", 2) and seconds >= 0.02
    assert watch.missing == ["SimpleNamespace.renamed"]


@dataclass(frozen=True)
class Row:
    group: int
    reward: float
    task_reward: float


@dataclass(frozen=True)
class File:
    rows: list[Row]


def test_mixed_rewards_give_every_group_a_one_and_a_zero() -> None:
    file = File([Row(g, 0.0, 0.0) for g in (0, 0, 1, 1, 1)])
    mixed = mixed_rewards(file)
    assert [r.reward for r in mixed.rows] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [r.task_reward for r in mixed.rows] == [r.reward for r in mixed.rows]


def test_train_plan_holds_five_float32_copies_of_the_weights_and_the_logits_twice() -> None:
    plan = train_plan(parameters=1000, layers=2, hidden=8, mlp=16, rows=100, tokens=10, chunk=4)
    terms = {name: size for name, size, _ in plan["terms"]}
    assert terms["weights"] + terms["kept policy"] + terms["gradients"] + terms["AdamW state"] == 5 * 1000 * 4
    assert terms["logits"] == 2 * 10 * 100 * 4
    assert plan["total"] == sum(terms.values())
