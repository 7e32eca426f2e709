"""Strict checks of a rollout table, shared by the writer (never write what a reader refuses) and the reader.

Everything here is vectorised with pyarrow.compute, so a file at the size cap is checked in milliseconds
and no check ever builds Python objects per token.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from protocol.rollouts.schema import (
    COLUMN_NAMES,
    COLUMNS,
    FINISH_REASONS,
    FLOAT_COLUMNS,
    LIST_COLUMNS,
    MAX_PROBLEM_ID_BYTES,
    NO_TARGET_LENGTH,
    FormatProblem,
    RolloutFormatError,
)


def check_schema(schema: pa.Schema) -> None:
    """Exactly COLUMNS, in order, with exactly their types (list element names and nullability aside)."""
    names = list(schema.names)
    if names != list(COLUMN_NAMES):
        missing = [n for n in COLUMN_NAMES if n not in names]
        extra = [n for n in names if n not in COLUMN_NAMES]
        detail = f"missing {missing}, unexpected {extra}" if missing or extra else f"column order {names}"
        raise RolloutFormatError(FormatProblem.SCHEMA, f"columns differ from the format: {detail}")
    for name, expected in COLUMNS:
        actual = schema.field(name).type
        same = (
            pa.types.is_list(actual) and actual.value_type == expected.value_type
            if pa.types.is_list(expected)
            else actual == expected
        )
        if not same:
            raise RolloutFormatError(FormatProblem.SCHEMA, f"column {name!r} is {actual}, expected {expected}")


def _first(mask: pa.Array | pa.ChunkedArray) -> int | None:
    """Index of the first true entry of a boolean mask (nulls count as false), or None."""
    hits = pc.indices_nonzero(pc.fill_null(mask, False))
    return int(hits[0].as_py()) if len(hits) else None


def _reject_where(mask: pa.Array | pa.ChunkedArray, problem: FormatProblem, detail: str) -> None:
    row = _first(mask)
    if row is not None:
        raise RolloutFormatError(problem, detail, row=row)


def _reject_in_list(
    column: pa.ChunkedArray, flat_mask: pa.Array | pa.ChunkedArray, problem: FormatProblem, detail: str
) -> None:
    """Like `_reject_where`, for a mask over the flattened elements of a list column."""
    element = _first(flat_mask)
    if element is not None:
        row = pc.list_parent_indices(column)[element].as_py()  # the row holding that element
        raise RolloutFormatError(problem, detail, row=int(row))


def check_table(table: pa.Table, *, max_rows: int | None = None, max_tokens: int | None = None) -> None:
    """Raises RolloutFormatError for the first problem found; limits of None are not checked (the writer)."""
    check_schema(table.schema)
    table = table.combine_chunks()  # one chunk per column: element and row indices below are global
    n_rows = table.num_rows
    if n_rows == 0:
        raise RolloutFormatError(FormatProblem.EMPTY, "the file has no rows")
    if max_rows is not None and n_rows > max_rows:
        raise RolloutFormatError(FormatProblem.TOO_MANY_ROWS, f"{n_rows} rows, at most {max_rows} accepted")
    lists = {name: table.column(name) for name in LIST_COLUMNS}
    n_tokens = sum(len(pc.list_flatten(column)) for column in lists.values())
    if max_tokens is not None and n_tokens > max_tokens:
        raise RolloutFormatError(
            FormatProblem.TOO_MANY_TOKENS, f"{n_tokens} list values, at most {max_tokens} accepted"
        )

    for name in COLUMN_NAMES:
        column = table.column(name)
        _reject_where(pc.is_null(column), FormatProblem.NULLS, f"null in column {name!r}")
        if name in LIST_COLUMNS:
            _reject_in_list(
                column, pc.is_null(pc.list_flatten(column)), FormatProblem.NULLS, f"null element in {name!r}"
            )

    lengths = {name: pc.list_value_length(column) for name, column in lists.items()}
    _reject_where(pc.equal(lengths["input_tokens"], 0), FormatProblem.LENGTHS, "input_tokens is empty")
    _reject_where(pc.equal(lengths["output_tokens"], 0), FormatProblem.LENGTHS, "output_tokens is empty")
    _reject_where(
        pc.not_equal(lengths["output_logprobs"], lengths["output_tokens"]),
        FormatProblem.LENGTHS,
        "output_logprobs must hold one value per output token",
    )
    for name in ("input_tokens", "output_tokens"):
        column = lists[name]
        _reject_in_list(
            column, pc.less(pc.list_flatten(column), 0), FormatProblem.TOKEN_IDS, f"negative id in {name!r}"
        )
    logprobs = lists["output_logprobs"]
    _reject_in_list(
        logprobs,
        pc.invert(pc.is_finite(pc.list_flatten(logprobs))),
        FormatProblem.NON_FINITE,
        "output_logprobs holds NaN or infinity",
    )
    for name in FLOAT_COLUMNS:
        _reject_where(
            pc.invert(pc.is_finite(table.column(name))), FormatProblem.NON_FINITE, f"{name} is NaN or infinite"
        )
    finish = table.column("finish_reason")
    _reject_where(
        pc.invert(pc.is_in(finish, value_set=pa.array(FINISH_REASONS))),
        FormatProblem.FINISH_REASON,
        f"finish_reason must be one of {FINISH_REASONS}",
    )
    _check_ranges(table)


def _check_ranges(table: pa.Table) -> None:
    problem_bytes = pc.binary_length(table.column("problem_id"))
    _reject_where(
        pc.or_(pc.equal(problem_bytes, 0), pc.greater(problem_bytes, MAX_PROBLEM_ID_BYTES)),
        FormatProblem.VALUE,
        f"problem_id must be 1 to {MAX_PROBLEM_ID_BYTES} UTF-8 bytes",
    )
    for name in ("group", "step"):
        _reject_where(pc.less(table.column(name), 0), FormatProblem.VALUE, f"{name} must be >= 0")
    _reject_where(
        pc.less(table.column("target_length"), NO_TARGET_LENGTH),
        FormatProblem.VALUE,
        f"target_length must be >= 0, or {NO_TARGET_LENGTH} for none",
    )
    _reject_where(pc.equal(pc.binary_length(table.column("proofs")), 0), FormatProblem.VALUE, "proofs is empty")
    # completions of one prompt share a group: one group, one problem
    pairs = table.select(["group", "problem_id"]).group_by("group").aggregate([("problem_id", "count_distinct")])
    split = pc.greater(pairs.column("problem_id_count_distinct"), 1)
    if pc.any(split).as_py():
        group = pairs.column("group")[_first(split) or 0].as_py()
        row = _first(pc.equal(table.column("group"), group))
        raise RolloutFormatError(FormatProblem.VALUE, f"group {group} holds more than one problem_id", row=row)
