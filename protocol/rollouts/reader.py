"""Reads a rollout file from a stranger: bounded, strict, and failing only with RolloutFormatError.

Order of defence: the byte size before anything is parsed; the Parquet magic; the footer (with thrift
limits); rows and row groups as the footer declares them; the schema; the metadata; then what decoding may
produce, from the column chunks' value counts and every page header (bounds.py), before a page is
decompressed; then the decoded table is validated again with the actual counts. Every error pyarrow can
raise on garbage becomes a "corrupt" reason.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from protocol.rollouts.bounds import DecodeBounds, check_decode_bounds, expanded_size, max_uncompressed
from protocol.rollouts.compact import ThriftError
from protocol.rollouts.meta import METADATA_KEY, RolloutMeta, parse_meta
from protocol.rollouts.schema import LIST_COLUMNS, FormatProblem, RolloutFormatError, RolloutRow, table_to_rows
from protocol.rollouts.validate import check_schema, check_table

DEFAULT_MAX_ROWS = 65_536
DEFAULT_MAX_TOKENS = 1 << 25  # list values (prompt + output tokens + logprobs) in one file: 128 MiB as int32
MAX_ROW_GROUPS = 1024  # the writer makes one; walking millions of declared groups would stall the reader
MAGIC = b"PAR1"
# What pyarrow raises on malformed input; ArrowException covers ArrowInvalid, ArrowIOError, ArrowNotImplementedError.
_PARSE_ERRORS = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError)


@dataclass(frozen=True)
class RolloutFile:
    meta: RolloutMeta
    rows: list[RolloutRow]
    work_key: bytes  # sha256 of the bytes that were read
    size: int


@dataclass(frozen=True)
class RolloutSummary:
    """A file that `read_rollouts` accepts, without its rows."""

    meta: RolloutMeta
    rows: int
    work_key: bytes
    size: int
    steps: frozenset[int]  # the policy steps its rows claim (a trainable file claims one)


def _read_bounded(source: Path | str | bytes, max_bytes: int) -> bytes:
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
    else:
        try:
            with open(source, "rb") as handle:
                data = handle.read(max_bytes + 1)  # never more than the cap, even if the file grows meanwhile
        except OSError as exc:
            raise RolloutFormatError(FormatProblem.NOT_PARQUET, f"cannot read {source}: {exc}") from exc
    if len(data) > max_bytes:
        raise RolloutFormatError(FormatProblem.TOO_LARGE, f"more than {max_bytes} bytes")
    return data


def _open(data: bytes, max_bytes: int, read_dictionary: tuple[str, ...] = ()) -> pq.ParquetFile:
    if len(data) < 2 * len(MAGIC) + 4 or not data.startswith(MAGIC):
        raise RolloutFormatError(FormatProblem.NOT_PARQUET, "no Parquet magic at the start")
    if not data.endswith(MAGIC):
        raise RolloutFormatError(FormatProblem.TRUNCATED, "no Parquet footer at the end")
    try:
        return pq.ParquetFile(
            pa.BufferReader(data),
            read_dictionary=list(read_dictionary) or None,
            thrift_string_size_limit=max_bytes,
            thrift_container_size_limit=max(1024, max_bytes // 4),
            page_checksum_verification=True,
        )
    except _PARSE_ERRORS as exc:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"unreadable Parquet footer: {exc}") from exc


def _check_declared_sizes(parquet: pq.ParquetFile, max_rows: int) -> None:
    """Refuses billions of rows or row groups before the footer is walked in Python (bounds.py).

    Only file-level totals are read: pyarrow 26 aborts the process (an uncaught C++ exception) when a
    column chunk's metadata with inconsistent level histograms is materialised, so `row_group.column(i)`
    is never called on a stranger's file; bounds.py reads the column chunks from the footer bytes itself.
    """
    footer = parquet.metadata
    if footer.num_rows > max_rows:
        raise RolloutFormatError(FormatProblem.TOO_MANY_ROWS, f"{footer.num_rows} rows declared, at most {max_rows}")
    if footer.num_row_groups > MAX_ROW_GROUPS:
        raise RolloutFormatError(
            FormatProblem.TOO_LARGE, f"{footer.num_row_groups} row groups, at most {MAX_ROW_GROUPS}"
        )


def _decode(data: bytes, max_bytes: int, max_rows: int, max_tokens: int) -> tuple[RolloutMeta, pa.Table]:
    """The metadata and the validated table of a file's bytes."""
    parquet = _open(data, max_bytes)
    try:
        _check_declared_sizes(parquet, max_rows)
        schema = parquet.schema_arrow
        key_values = parquet.metadata.metadata or {}
    except _PARSE_ERRORS as exc:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"unreadable Parquet footer: {exc}") from exc
    check_schema(schema)
    meta = parse_meta(key_values.get(METADATA_KEY))
    try:
        bounds = check_decode_bounds(data, max_bytes=max_bytes, max_rows=max_rows, max_tokens=max_tokens)
    except ThriftError as exc:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"unreadable Parquet layout: {exc}") from exc
    try:
        if bounds.dictionary_columns:
            parquet = _open(data, max_bytes, bounds.dictionary_columns)
        table = parquet.read(use_threads=False)
        table = _expand(table, bounds, max_uncompressed(max_bytes, max_rows, max_tokens))
        table.validate(full=True)  # offsets in range, strings valid UTF-8
    except _PARSE_ERRORS as exc:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"undecodable Parquet data: {exc}") from exc
    check_table(table, max_rows=max_rows, max_tokens=max_tokens)
    return meta, table


def _expand(table: pa.Table, bounds: DecodeBounds, limit: int) -> pa.Table:
    """The table as the bounds declared it, dictionary columns expanded once their expanded size is known."""
    if table.num_rows != bounds.rows:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"{table.num_rows} rows decoded, {bounds.rows} declared")
    for name in LIST_COLUMNS:  # pages cannot decode to more than their headers say; should pyarrow ever, refuse
        decoded = sum(len(chunk.flatten()) for chunk in table.column(name).chunks)
        if decoded > bounds.list_values[name]:
            raise RolloutFormatError(
                FormatProblem.CORRUPT,
                f"column {name!r} decoded to {decoded} values, {bounds.list_values[name]} declared",
            )
    expanded = 0
    for name in bounds.dictionary_columns:
        column = table.column(name)
        size = expanded_size(column)
        expanded += size
        if expanded > limit:
            raise RolloutFormatError(
                FormatProblem.TOO_LARGE, f"column {name!r} expands to {size} bytes ({expanded} in all), at most {limit}"
            )
        plain = pa.chunked_array([chunk.dictionary_decode() for chunk in column.chunks], column.type.value_type)
        table = table.set_column(
            table.schema.get_field_index(name), table.schema.field(name).with_type(plain.type), plain
        )
    return table


def read_rollouts(
    source: Path | str | bytes,
    *,
    max_bytes: int,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> RolloutFile:
    """Parses and validates a rollout file (a path or its bytes); raises RolloutFormatError and nothing else."""
    data = _read_bounded(source, max_bytes)
    meta, table = _decode(data, max_bytes, max_rows, max_tokens)
    return RolloutFile(meta=meta, rows=table_to_rows(table), work_key=hashlib.sha256(data).digest(), size=len(data))


def inspect_rollouts(
    source: Path | str | bytes,
    *,
    max_bytes: int,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> RolloutSummary:
    """Every check of `read_rollouts`, without building the rows as Python objects (the costly part)."""
    data = _read_bounded(source, max_bytes)
    meta, table = _decode(data, max_bytes, max_rows, max_tokens)
    steps = frozenset(int(step) for step in pc.unique(table.column("step")).to_pylist())
    digest = hashlib.sha256(data).digest()
    return RolloutSummary(meta=meta, rows=table.num_rows, work_key=digest, size=len(data), steps=steps)
