"""Math problems from a JSONL file, scored with math-verify (`parse` + `verify`): 1.0 if equivalent, else 0.0.

math-verify hands answers to sympy, which will happily try to evaluate `9^{9^{9}}` or `(10^{10})!` for ever.
A worker's answer is hostile input, so scoring is guarded in two layers:

1. a deterministic screen (`hostile_reason`) that scores 0 at once, identically on every machine: answers longer
   than 256 characters, brackets nested deeper than 8, power towers (`a^{b^c}`, `a^b^c`), exponents with more
   than 4 digits, factorials, the gamma function and big operators (sum, product, integral, limit, binomial);
2. a wall-clock budget (2 s) around parse + verify, after which the answer scores 0.

The budget is a SIGALRM timer, so it only exists in the main thread; in other threads only the screen applies.
The screen is the part that keeps worker and validator in agreement: an answer that passes it and still runs
into the budget is slow on every machine and scores 0 (unless one machine is more than 10x faster).
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from protocol.tasks.errors import UnknownProblem
from protocol.tasks.problem import Problem
from protocol.tasks.spec import MathJsonlSourceSpec, MathProblemRow, TaskSpec

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 256
MAX_NESTING = 8
MAX_EXPONENT_DIGITS = 4
SCORE_BUDGET_S = 2.0
_BIG_OPERATORS = re.compile(r"\\(?:sum|prod|i*nt|oint|lim|binom|[dt]binom|choose|Gamma)(?![a-zA-Z])")
_FACTORIAL = re.compile(r"(?<!\\)!")


class MathSource:
    """A `TaskSource` over the rows of a math JSONL spec; reference answers are parsed once, on first use."""

    def __init__(self, spec: TaskSpec, *, budget_s: float = SCORE_BUDGET_S) -> None:
        source = spec.source
        assert isinstance(source, MathJsonlSourceSpec)  # open_source dispatches on source.type
        self.task = spec.name
        self.budget_s = budget_s
        self._rows: dict[str, MathProblemRow] = {row.id: row for row in source.problems}
        self._ids = tuple(row.id for row in source.problems)
        self._gold: dict[str, list[Any]] = {}

    def problem_ids(self) -> Sequence[str]:
        return self._ids

    def problem(self, problem_id: str) -> Problem:
        row = self._rows.get(problem_id)
        if row is None:
            raise UnknownProblem(self.task, problem_id)
        return Problem(id=row.id, question=row.question, answer=row.answer)

    def score(self, problem: Problem, answer_text: str) -> float:
        return 1.0 if answers_match(self._reference(problem.id), answer_text, budget_s=self.budget_s) else 0.0

    def _reference(self, problem_id: str) -> list[Any]:
        """The parsed reference answer, from our own rows (never from the caller's `Problem`)."""
        if problem_id not in self._gold:
            row = self._rows.get(problem_id)
            if row is None:
                raise UnknownProblem(self.task, problem_id)
            gold = parse_math(row.answer, budget_s=self.budget_s)
            if not gold:
                logger.warning("task %s: reference answer of %s does not parse; it scores 0", self.task, row.id)
            self._gold[problem_id] = gold
        return self._gold[problem_id]


def hostile_reason(answer: str) -> str | None:
    """Why an answer is refused before parsing (deterministic, linear time), or None if it may be parsed."""
    if len(answer) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    depth = deepest = 0
    for char in answer:
        if char in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")}]":
            depth -= 1
    if deepest > MAX_NESTING:
        return f"brackets nested deeper than {MAX_NESTING}"
    if _BIG_OPERATORS.search(answer) or _FACTORIAL.search(answer):
        return "factorial or big operator"
    return _exponent_reason(answer.replace("**", "^"))


def _exponent_reason(text: str) -> str | None:
    """Power towers and long exponents: the answers that make sympy build numbers with billions of digits."""
    start = text.find("^")
    while start != -1:
        exponent, end = _operand(text, start + 1)
        if "^" in exponent or text[end:].lstrip().startswith("^"):
            return "power tower"
        if sum(c.isdigit() for c in exponent) > MAX_EXPONENT_DIGITS:
            return f"exponent with more than {MAX_EXPONENT_DIGITS} digits"
        start = text.find("^", start + 1)
    return None


def _operand(text: str, i: int) -> tuple[str, int]:
    """The exponent starting at text[i]: a braced or parenthesised group, a number, or one symbol."""
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] in "{(":
        close = {"{": "}", "(": ")"}[text[i]]
        depth, j = 0, i
        while j < len(text):
            depth += text[j] == text[i]
            depth -= text[j] == close
            j += 1
            if depth == 0:
                break
        return text[i:j], j
    j = i
    while j < len(text) and (text[j].isdigit() or text[j] == "."):
        j += 1
    if j == i and i < len(text):
        j = i + 1
        if text[i] == "\\":  # a command such as \pi
            while j < len(text) and text[j].isalpha():
                j += 1
    return text[i:j], j


def answers_match(reference: list[Any], answer: str, *, budget_s: float = SCORE_BUDGET_S) -> bool:
    """Whether math-verify finds the answer equivalent to the parsed reference; False on any failure."""
    reason = hostile_reason(answer)
    if reason is not None or not reference:
        return False
    try:
        with time_limit(budget_s):
            candidate = _parse(answer)
            return bool(candidate) and bool(_verify(reference, candidate))
    except ScoringTimeout:
        logger.info("math answer scored 0: parse + verify exceeded %.1f s", budget_s)
    except Exception:  # math-verify catches its own errors; this is the last line against a crash on hostile text
        logger.warning("math answer scored 0: math-verify failed", exc_info=True)
    return False


def parse_math(text: str, *, budget_s: float = SCORE_BUDGET_S) -> list[Any]:
    """math-verify's parse of a bare answer ("1/2", "\\frac{1}{2}", "x=3"), or [] if it fails or times out."""
    try:
        with time_limit(budget_s):
            return _parse(text)
    except ScoringTimeout:
        return []


def _parse(text: str) -> list[Any]:
    from math_verify import parse

    _quiet_math_verify()
    # An extracted answer is bare LaTeX: wrapped in $...$ math-verify reads it as LaTeX (\sqrt{2}, x+1);
    # unwrapped it only finds plain numbers, which stays the fallback for text such as "The answer is 7".
    parsed: list[Any] = parse(f"${text}$", parsing_timeout=None) or parse(text, parsing_timeout=None)
    return parsed


def _verify(reference: list[Any], candidate: list[Any]) -> bool:
    from math_verify import verify

    _quiet_math_verify()
    return bool(verify(reference, candidate, timeout_seconds=None))


class ScoringTimeout(BaseException):
    """Raised by the budget timer. A BaseException so that no `except Exception` inside sympy swallows it."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `ScoringTimeout` in the block after `seconds` (main thread only; elsewhere, no limit).

    math-verify's own timeouts are turned off (they use `signal.alarm`, whole seconds, and would cancel this
    timer); a timer the caller had set (pytest-timeout) is put back, less the time spent here.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise ScoringTimeout

    previous_handler = signal.signal(signal.SIGALRM, expire)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay > 0:
            remaining = max(previous_delay - (time.monotonic() - started), 1e-6)
            signal.setitimer(signal.ITIMER_REAL, remaining, previous_interval)


def _quiet_math_verify() -> None:
    """math-verify warns once that its timeout is off and we must time out ourselves; `time_limit` does."""
    import math_verify.grader
    import math_verify.parser

    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
