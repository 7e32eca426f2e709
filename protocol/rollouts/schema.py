"""The rollout file's columns (DESIGN section 6), its row type, and the one error a bad file raises.

One row per completion. Column names, order and Arrow types are fixed: a reader rejects any other
layout instead of coercing it, because a hostile peer writes these files.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import pyarrow as pa

from core.errors import NodeError

FINISH_REASONS = ("stop", "length")
NO_TARGET_LENGTH = -1  # `target_length` of a row whose prompt set no thinking budget
MAX_PROBLEM_ID_BYTES = 1024

COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("problem_id", pa.string()),
    ("group", pa.int32()),  # completions of one prompt share it
    ("input_tokens", pa.list_(pa.int32())),  # the prompt, as the model saw it
    ("output_tokens", pa.list_(pa.int32())),  # the completion, EOS included when it stopped
    ("output_logprobs", pa.list_(pa.float32())),  # one per output token, under the claimed sampling
    ("finish_reason", pa.string()),  # "stop" | "length"
    ("reward", pa.float32()),
    ("task_reward", pa.float32()),
    ("length_penalty", pa.float32()),
    ("target_length", pa.int32()),  # thinking budget in tokens, NO_TARGET_LENGTH when none
    ("seed", pa.int64()),  # the sampler's per-row seed
    ("step", pa.int32()),  # policy step of the weights that generated the row
    ("proofs", pa.binary()),  # concatenated TOPLOC chunk proofs (engine.proofs)
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
LIST_COLUMNS = ("input_tokens", "output_tokens", "output_logprobs")
FLOAT_COLUMNS = ("reward", "task_reward", "length_penalty")
ARROW_SCHEMA = pa.schema([pa.field(name, kind, nullable=False) for name, kind in COLUMNS])


class FormatProblem(StrEnum):
    """Why a file is not a rollout file; validators map every one of these to reason code 2 (bad format)."""

    TOO_LARGE = "too_large"  # more bytes than the pool accepts (checked before parsing)
    NOT_PARQUET = "not_parquet"
    TRUNCATED = "truncated"
    CORRUPT = "corrupt"  # Parquet that does not decode
    SCHEMA = "schema"  # missing, extra, reordered or mistyped columns
    NULLS = "nulls"
    METADATA = "metadata"  # the b"prime" file metadata is missing or invalid
    EMPTY = "empty"  # no rows
    TOO_MANY_ROWS = "too_many_rows"
    TOO_MANY_TOKENS = "too_many_tokens"
    LENGTHS = "lengths"  # empty token lists, or logprobs not one per output token
    TOKEN_IDS = "token_ids"  # negative ids
    FINISH_REASON = "finish_reason"
    NON_FINITE = "non_finite"  # NaN or infinity in a float column
    VALUE = "value"  # any other value out of its range (negative group/step, empty proof, ...)


class RolloutFormatError(NodeError):
    """A rollout file (or the rows about to become one) breaks the format; `row` is the first offending row."""

    def __init__(self, problem: FormatProblem, detail: str, *, row: int | None = None) -> None:
        where = f" (row {row})" if row is not None else ""
        super().__init__(f"bad rollout file [{problem}]: {detail}{where}")
        self.problem = problem
        self.detail = detail
        self.row = row


@dataclass(frozen=True)
class RolloutRow:
    """One completion, as stored. Floats are stored as float32: a row read back holds the rounded values."""

    problem_id: str
    group: int
    input_tokens: list[int]
    output_tokens: list[int]
    output_logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    reward: float
    task_reward: float
    length_penalty: float
    target_length: int  # NO_TARGET_LENGTH (-1) when the prompt set no budget
    seed: int
    step: int
    proofs: bytes


def work_units(rows: list[RolloutRow]) -> int:
    """What a file is paid for on chain: its total output tokens (the validator recounts them)."""
    return sum(len(row.output_tokens) for row in rows)


def rows_to_table(rows: list[RolloutRow]) -> pa.Table:
    """The rows as an Arrow table of exactly ARROW_SCHEMA; values that do not fit their type raise."""
    columns = []
    for name, kind in COLUMNS:
        values = [getattr(row, name) for row in rows]
        try:
            columns.append(pa.array(values, type=kind))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RolloutFormatError(FormatProblem.VALUE, f"column {name!r} does not fit {kind}: {exc}") from exc
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


def table_to_rows(table: pa.Table) -> list[RolloutRow]:
    """Rows of a table that `check_table` accepted."""
    columns = [table.column(name).to_pylist() for name in COLUMN_NAMES]
    return [RolloutRow(*values) for values in zip(*columns, strict=True)]
