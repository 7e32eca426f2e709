"""Prompt text, target-length picks and answer extraction."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from protocol.tasks import Problem, PromptError, build_messages, extract_answer, load_task_spec, target_length_for
from protocol.tasks.spec import PromptSpec, TaskSpec

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "tasks"
PROBLEM = Problem(id="basic_arithmetic/3", question="Calculate 5 - 9.", answer="-4")


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    return load_task_spec(CONFIGS / "default.toml")


def with_prompt(spec: TaskSpec, **changes: object) -> TaskSpec:
    return dataclasses.replace(spec, prompt=dataclasses.replace(spec.prompt, **changes))  # type: ignore[arg-type]


def test_prompt_without_budget_is_question_then_format(spec: TaskSpec) -> None:
    assert build_messages(spec, PROBLEM, None) == [
        {"role": "user", "content": "Calculate 5 - 9.\nReply with <answer>N</answer>."}
    ]


def test_prompt_with_budget_asks_for_the_target_length(spec: TaskSpec) -> None:
    budgeted = with_prompt(spec, system="Be brief.", thinking_budget=(32, 64))
    assert build_messages(budgeted, PROBLEM, 64) == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": "Calculate 5 - 9.\nReply with <answer>N</answer>.\nThink for 64 tokens before answering.",
        },
    ]


@pytest.mark.parametrize(("budget", "target"), [((), 32), ((32, 64), None), ((32, 64), 48)])
def test_target_outside_the_budget_is_refused(spec: TaskSpec, budget: tuple[int, ...], target: int | None) -> None:
    with pytest.raises(PromptError, match="target_length"):
        build_messages(with_prompt(spec, thinking_budget=budget), PROBLEM, target)


def test_target_length_is_none_without_budget(spec: TaskSpec) -> None:
    assert target_length_for(spec, PROBLEM.id, 0) is None


def test_target_length_is_deterministic_and_covers_every_target(spec: TaskSpec) -> None:
    budgeted = with_prompt(spec, thinking_budget=(32, 64, 128))
    picks = [target_length_for(budgeted, PROBLEM.id, seed) for seed in range(-50, 50)]
    assert picks == [target_length_for(budgeted, PROBLEM.id, seed) for seed in range(-50, 50)]
    assert set(picks) == {32, 64, 128}
    by_problem = {target_length_for(budgeted, f"basic_arithmetic/{i}", 7) for i in range(100)}
    assert by_problem == {32, 64, 128}


def test_target_length_refuses_a_seed_beyond_int64(spec: TaskSpec) -> None:
    with pytest.raises(PromptError, match="int64"):
        target_length_for(with_prompt(spec, thinking_budget=(32,)), PROBLEM.id, 2**63)


def test_prompt_spec_default_has_no_budget() -> None:
    assert PromptSpec(system="", answer_format="<answer></answer>").thinking_budget == ()


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("<answer>42</answer>", "42"),
        ("think... <answer> 42 \n</answer>", "42"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),  # the last answer counts
        ("<answer>1</answer> then <answer>2", None),  # ... and an unclosed last answer is no answer
        ("<answer>42", None),  # cut off at EOS or max_tokens
        ("42</answer>", None),
        ("no tags at all", None),
        ("", None),
        ("<answer></answer>", ""),
        ("<answer>a<answer>b</answer></answer>", "b"),  # nested: the innermost
        ("<answer>x</answer></answer>", "x"),
        ("<ANSWER>42</ANSWER>", None),  # tags are case-sensitive, as the prompt shows them
        ("<answer>\u2212\u0664\u0662</answer>", "\u2212\u0664\u0662"),  # returned verbatim; scorers judge it
        ("<answer>42</answer><|endoftext|>", "42"),
    ],
)
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


def test_extract_answer_is_linear_on_huge_text() -> None:
    text = "<answer>" * 200_000 + "x" * 1_000_000
    started = time.perf_counter()
    assert extract_answer(text) is None
    assert extract_answer(text + "</answer>") == "x" * 1_000_000
    assert time.perf_counter() - started < 10.0  # a hang guard: a quadratic scan would take hours here
