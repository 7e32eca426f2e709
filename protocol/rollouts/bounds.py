"""What decoding a rollout file may produce, bounded from what the file declares before one value is decoded.

Encoded sizes say little: a dictionary or RLE page of a few bytes decodes to any number of values (one run
header "10^8 times index 0"), and a dictionary-encoded binary column repeats its longest entry once per row.
So the bounds are on decoded quantities:

- values per column chunk (`num_values`, which for a list column counts its elements): a scalar column holds
  exactly one per row; the list columns together at most `list_value_limit`, the smaller of `max_tokens` and
  VALUES_PER_BYTE per byte of the file;
- bytes: what the footer and the page headers say the pages decompress to, at most `max_uncompressed`;
- the page headers must agree with the footer. pyarrow decodes what each page header claims, so the footer's
  counts bound nothing until `walk_pages` has read every header pyarrow will read and found the same counts.

A dictionary-encoded binary column expands to at most one dictionary page per row; where that might exceed the
byte bound, it is read as a dictionary and its expanded size checked by the reader (`expanded_size`) before it is
expanded.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from protocol.rollouts.layout import Footer, TooManyPages, read_footer, walk_pages
from protocol.rollouts.schema import COLUMN_NAMES, COLUMNS, LIST_COLUMNS, FormatProblem, RolloutFormatError

# Honest files hold at most about 15 list values per byte: every row carries an incompressible chunk proof (258
# bytes per 32 output tokens for a hidden size of 128 or more, the tiny model's included), each output token an
# incompressible float32 log-prob, and the only values that compress well are a group's shared prompt. The most
# compressible honest shape (512 rows sharing a 2,500-token prompt, one output token each, and the 34-byte proofs of
# a 16-wide hidden state) holds 32 a byte; tests/protocol/test_parquet_bomb.py pins it.
VALUES_PER_BYTE = 128
MIN_LIST_VALUES = 1 << 20  # a small file may hold this many whatever its size: 4 MiB as int32, decoded in milliseconds
MAX_PAGES = 1 << 14  # per file; the writer makes one page per MiB and column, about 100 at the size cap
BYTE_ARRAY_COLUMNS = tuple(name for name, kind in COLUMNS if pa.types.is_string(kind) or pa.types.is_binary(kind))


@dataclass(frozen=True)
class DecodeBounds:
    """What a file declares, checked against the limits: decoding it produces at most this."""

    rows: int
    list_values: dict[str, int]  # per list column, all row groups: elements plus one per empty list or null
    dictionary_columns: tuple[str, ...]  # binary columns to read as dictionaries: expanded, they might be too large


def max_uncompressed(max_bytes: int, max_rows: int, max_tokens: int) -> int:
    """Generous bound on an honest file's decoded size.

    4 bytes per list value plus its levels; proofs are incompressible, so they decode to about their stored
    size; strings and scalars take well under 2 KiB a row. Anything beyond is a decompression bomb.
    """
    return 4 * max_bytes + 8 * max_tokens + 2048 * max_rows


def list_value_limit(size: int, max_tokens: int) -> int:
    """List values a file of `size` bytes may hold."""
    return min(max_tokens, max(MIN_LIST_VALUES, VALUES_PER_BYTE * size))


def check_decode_bounds(data: bytes, *, max_bytes: int, max_rows: int, max_tokens: int) -> DecodeBounds:
    """Raises RolloutFormatError unless decoding `data` stays within the limits; reads headers only.

    The caller has checked that the file has the rollout schema (so chunk i is column COLUMN_NAMES[i]) and
    catches ThriftError for a footer or page header that does not parse.
    """
    footer = read_footer(data)
    rows = sum(group.num_rows for group in footer.row_groups)
    if rows != footer.num_rows or min((group.num_rows for group in footer.row_groups), default=0) < 0:
        raise RolloutFormatError(FormatProblem.CORRUPT, f"row groups of {rows} rows in a file of {footer.num_rows}")
    if rows > max_rows:
        raise RolloutFormatError(FormatProblem.TOO_MANY_ROWS, f"{rows} rows declared, at most {max_rows}")
    list_values = _declared_values(footer)
    _check_list_values(list_values, len(data), max_tokens)
    limit = max_uncompressed(max_bytes, max_rows, max_tokens)
    declared = max(
        sum(group.total_byte_size for group in footer.row_groups),
        sum(chunk.total_uncompressed_size for group in footer.row_groups for chunk in group.columns),
    )
    if declared > limit:
        raise RolloutFormatError(FormatProblem.TOO_LARGE, f"{declared} bytes uncompressed declared, at most {limit}")
    return DecodeBounds(rows, list_values, _walk(data, footer, limit))


def _declared_values(footer: Footer) -> dict[str, int]:
    """The list columns' declared values; scalar columns must declare one a row."""
    list_values = dict.fromkeys(LIST_COLUMNS, 0)
    for index, group in enumerate(footer.row_groups):
        if len(group.columns) != len(COLUMN_NAMES):
            raise RolloutFormatError(
                FormatProblem.CORRUPT,
                f"row group {index} has {len(group.columns)} column chunks, not {len(COLUMN_NAMES)}",
            )
        for name, chunk in zip(COLUMN_NAMES, group.columns, strict=True):
            if name in list_values:
                list_values[name] += chunk.num_values
            elif chunk.num_values != group.num_rows:
                raise RolloutFormatError(
                    FormatProblem.CORRUPT,
                    f"column {name!r} declares {chunk.num_values} values in row group {index} of {group.num_rows} rows",
                )
    return list_values


def _walk(data: bytes, footer: Footer, limit: int) -> tuple[str, ...]:
    """Checks every page header (only now that the declared counts are within the limits); returns the binary
    columns to read as dictionaries: those with dictionary pages when, expanded, they might exceed `limit`."""
    uncompressed, pages = 0, 0
    expansion = dict.fromkeys(BYTE_ARRAY_COLUMNS, 0)  # at most one dictionary page's bytes per row
    for group in footer.row_groups:
        for name, chunk in zip(COLUMN_NAMES, group.columns, strict=True):
            try:
                walked = walk_pages(data, chunk, MAX_PAGES - pages)
            except TooManyPages:
                raise RolloutFormatError(FormatProblem.TOO_LARGE, f"more than {MAX_PAGES} pages") from None
            uncompressed, pages = uncompressed + walked.uncompressed, pages + walked.pages
            if name in expansion:
                expansion[name] += group.num_rows * walked.dictionary_bytes
    if uncompressed > limit:
        raise RolloutFormatError(FormatProblem.TOO_LARGE, f"pages decompress to {uncompressed} bytes, at most {limit}")
    if sum(expansion.values()) <= limit:  # the writer's files: a few short problem ids, two finish reasons
        return ()
    return tuple(name for name, size in expansion.items() if size)


def _check_list_values(list_values: dict[str, int], size: int, max_tokens: int) -> None:
    limit = list_value_limit(size, max_tokens)
    why = f"max_tokens {max_tokens}" if limit == max_tokens else f"{VALUES_PER_BYTE} a byte of a {size}-byte file"
    for name, count in list_values.items():
        if count > limit:
            raise RolloutFormatError(
                FormatProblem.TOO_MANY_TOKENS, f"column {name!r} declares {count} values, at most {limit} ({why})"
            )
    total = sum(list_values.values())
    if total > limit:
        raise RolloutFormatError(
            FormatProblem.TOO_MANY_TOKENS, f"the list columns declare {total} values, at most {limit} ({why})"
        )


def expanded_size(column: pa.ChunkedArray) -> int:
    """Bytes a dictionary-encoded binary column takes once expanded: each row's entry, copied. Vectorised."""
    size = 0
    for chunk in column.chunks:
        lengths = pc.binary_length(chunk.dictionary)
        size += pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0
    return size
