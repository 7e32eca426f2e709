"""Reads a rollout file from a stranger: bounded, strict, and failing only with RolloutFormatError.

Order of defence: the byte size before anything is parsed; the Parquet magic; the footer (with thrift
limits); rows and uncompressed size as the footer declares them, before any page is
decompressed; the schema; the metadata; then the decoded table is validated again with the actual counts
(a lying footer cannot get past them). Every error pyarrow can raise on garbage becomes a "corrupt" reason.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from node.rollouts.meta import METADATA_KEY, RolloutMeta, parse_meta
from node.rollouts.schema import FormatProblem, RolloutFormatError, RolloutRow, table_to_rows
from node.rollouts.validate import check_schema, check_table

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


def _max_uncompressed(max_bytes: int, max_rows: int, max_tokens: int) -> int:
    """Generous bound on an honest file's decoded size.

    4 bytes per list value plus its levels; proofs are incompressible, so they decode to about their stored
    size; strings and scalars take well under 2 KiB a row. Anything beyond is a decompression bomb.
    """
    return 4 * max_bytes + 8 * max_tokens + 2048 * max_rows


def _open(data: bytes, max_bytes: int) -> pq.ParquetFile:
    if len(data) < 2 * len(MAGIC) + 4 or not data.startswith(MAGIC):
        raise RolloutFormatError(FormatProblem.NOT_PARQUET, "no Parquet magic at the start")
    if not data.endswith(MAGIC):
        raise RolloutFormatError(FormatProblem.TRUNCATED, "no Parquet footer at the end")
    try:
        return pq.ParquetFile(
            pa.BufferReader(data),
            thrift_string_size_limit=max_bytes,
            thrift_container_size_limit=max(1024, max_bytes // 4),
            page_checksum_verification=True,
        )
    except _PARSE_ERRORS as exc:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"unreadable Parquet footer: {exc}") from exc


def _check_declared_sizes(parquet: pq.ParquetFile, max_bytes: int, max_rows: int, max_tokens: int) -> None:
    """Refuses what the footer admits to before decompressing a page (zstd bombs, billions of rows).

    Only row-group totals are read: pyarrow 26 aborts the process (an uncaught C++ exception) when a
    column chunk's metadata with inconsistent level histograms is materialised, so `row_group.column(i)`
    is never called on a stranger's file. Decoding the data raises a normal exception instead.
    """
    footer = parquet.metadata
    if footer.num_rows > max_rows:
        raise RolloutFormatError(FormatProblem.TOO_MANY_ROWS, f"{footer.num_rows} rows declared, at most {max_rows}")
    if footer.num_row_groups > MAX_ROW_GROUPS:
        raise RolloutFormatError(
            FormatProblem.TOO_LARGE, f"{footer.num_row_groups} row groups, at most {MAX_ROW_GROUPS}"
        )
    uncompressed = sum(max(0, footer.row_group(group).total_byte_size) for group in range(footer.num_row_groups))
    limit = _max_uncompressed(max_bytes, max_rows, max_tokens)
    if uncompressed > limit:
        raise RolloutFormatError(
            FormatProblem.TOO_LARGE, f"{uncompressed} bytes uncompressed declared, at most {limit}"
        )


def read_rollouts(
    source: Path | str | bytes,
    *,
    max_bytes: int,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> RolloutFile:
    """Parses and validates a rollout file (a path or its bytes); raises RolloutFormatError and nothing else."""
    data = _read_bounded(source, max_bytes)
    parquet = _open(data, max_bytes)
    try:
        _check_declared_sizes(parquet, max_bytes, max_rows, max_tokens)
        schema = parquet.schema_arrow
        key_values = parquet.metadata.metadata or {}
    except _PARSE_ERRORS as exc:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"unreadable Parquet footer: {exc}") from exc
    check_schema(schema)
    meta = parse_meta(key_values.get(METADATA_KEY))
    try:
        table = parquet.read(use_threads=False)
        table.validate(full=True)  # offsets in range, strings valid UTF-8
    except _PARSE_ERRORS as exc:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"undecodable Parquet data: {exc}") from exc
    check_table(table, max_rows=max_rows, max_tokens=max_tokens)
    return RolloutFile(meta=meta, rows=table_to_rows(table), work_key=hashlib.sha256(data).digest(), size=len(data))
