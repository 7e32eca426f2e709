"""Typed, bounded reads of one TOML table (or JSON object) with one-line errors that name file and field.

TOML distinguishes `1` from `1.0` and `true` from `1`, but Python's bool is an int: every reader here rejects the
wrong kind explicitly, so `size = true` is an error instead of a dataset of one problem.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from protocol.tasks.errors import TaskSpecError

_REQUIRED: Any = object()


class Fields:
    """Reader over one table: take each known key once, then `done()` rejects keys nobody took (typos)."""

    def __init__(self, path: Path, prefix: str, table: dict[str, Any]) -> None:
        self.path = path
        self.prefix = prefix
        self._table = dict(table)

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, problem: str) -> NoReturn:
        raise TaskSpecError(self.path, self.name(key), problem)

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self._table:
            return self._table.pop(key)
        if default is _REQUIRED:
            self.fail(key, "is required")
        return default

    def text(self, key: str, default: Any = _REQUIRED, *, nonempty: bool = False) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {type(value).__name__}")
        if nonempty and not value.strip():
            self.fail(key, "must not be empty")
        return value

    def integer(
        self, key: str, default: Any = _REQUIRED, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        value = self.raw(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(key, f"must be an integer, got {type(value).__name__}")
        self._check_range(key, value, minimum, maximum)
        return value

    def boolean(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {value!r}")
        return value

    def number(
        self, key: str, default: Any = _REQUIRED, *, minimum: float | None = None, maximum: float | None = None
    ) -> float:
        """An int or float (TOML `1` and `1.0` both), returned as float so the hash does not tell them apart."""
        value = self.raw(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            self.fail(key, f"must be a finite number, got {value!r}")
        self._check_range(key, value, minimum, maximum)
        return float(value)

    def table(self, key: str, *, required: bool = True) -> dict[str, Any]:
        value = self.raw(key, _REQUIRED if required else {})
        if not isinstance(value, dict):
            self.fail(key, f"must be a table, got {type(value).__name__}")
        return value

    def done(self) -> None:
        if self._table:
            unknown = ", ".join(sorted(self._table))
            raise TaskSpecError(self.path, self.prefix or "top level", f"unknown key(s): {unknown}")

    def _check_range(self, key: str, value: float, minimum: float | None, maximum: float | None) -> None:
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {maximum}, got {value}")


def frozen_config(path: Path, table: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A source's `config` table as sorted (key, value) pairs; arrays become tuples, nested tables are refused."""
    pairs: list[tuple[str, Any]] = []
    for key, value in sorted(table.items()):
        where = f"source.config.{key}"
        if key in ("seed", "size"):
            raise TaskSpecError(path, where, f"set {key} in [source], not in its config")
        if isinstance(value, list):
            if not all(_is_scalar(v) for v in value):
                raise TaskSpecError(path, where, "arrays may hold only strings, numbers and booleans")
            value = tuple(value)
        elif not _is_scalar(value):
            raise TaskSpecError(path, where, f"must be a string, number, boolean or array, got {type(value).__name__}")
        pairs.append((key, value))
    return tuple(pairs)


def _is_scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, bool | int | str)


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=_Identified)


def parse_problem_rows(path: Path, data: bytes, parse_row: Callable[[Fields, str], T]) -> tuple[T, ...]:
    """The problems of a JSONL file: one JSON object a line (blank lines skipped), unique `id`s, at least one.

    `parse_row(fields, where)` turns one line's object into a row (it must have an `id`) and calls `done()`;
    every problem raises `TaskSpecError` naming the file and the line.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskSpecError(path, "encoding", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    rows: list[T] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskSpecError(path, where, f"not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TaskSpecError(path, where, "must be a JSON object")
        row = parse_row(Fields(path, where, obj), where)
        problem_id = row.id
        if problem_id in seen:
            raise TaskSpecError(path, f"{where}.id", f"duplicate id {problem_id!r}")
        seen.add(problem_id)
        rows.append(row)
    if not rows:
        raise TaskSpecError(path, "file", "holds no problems")
    return tuple(rows)
