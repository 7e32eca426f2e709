"""Writes rollout files: deterministic bytes (the work key is their sha256), published atomically.

Every setting that changes the bytes is pinned here: zstd level 3, one row group, dictionary encoding
only for the two string columns, no statistics, no page index, page CRCs on, no Arrow schema blob, and
metadata as canonical JSON. The same rows and meta therefore give a byte-identical file with the same
pyarrow version (its version string is in the Parquet footer).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from protocol.rollouts.meta import METADATA_KEY, RolloutMeta, encode_meta
from protocol.rollouts.schema import ARROW_SCHEMA, RolloutRow, rows_to_table, work_units
from protocol.rollouts.validate import check_table

COMPRESSION = "zstd"
COMPRESSION_LEVEL = 3
DATA_PAGE_SIZE = 1 << 20


@dataclass(frozen=True)
class WrittenFile:
    """A published rollout file and what its leaf in a batch (`WorkLedger.submitBatch`) needs about it."""

    path: Path
    work_key: bytes  # sha256 of the file bytes, 32 bytes
    units: int  # total output tokens
    size: int  # bytes


def encode_rollouts(meta: RolloutMeta, rows: list[RolloutRow]) -> bytes:
    """The file's bytes. Raises RolloutFormatError for rows a reader would refuse, so none is ever sent."""
    table = rows_to_table(rows)
    check_table(table)
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(
        sink,
        ARROW_SCHEMA,
        version="2.6",
        use_dictionary=["problem_id", "finish_reason"],
        compression=COMPRESSION,
        compression_level=COMPRESSION_LEVEL,
        write_statistics=False,
        data_page_size=DATA_PAGE_SIZE,
        data_page_version="1.0",
        store_schema=False,
        write_page_index=False,
        write_page_checksum=True,
    ) as writer:
        writer.write_table(table, row_group_size=table.num_rows)  # one row group
        writer.add_key_value_metadata({METADATA_KEY: encode_meta(meta)})
    return sink.getvalue().to_pybytes()


def write_atomically(path: Path, write: Callable[[BinaryIO], object], *, mode: int = 0o644) -> None:
    """Calls `write(handle)` on a temporary sibling of `path`, then fsyncs and renames it: a reader sees the old file
    or the whole new one, never a part (DESIGN 11), and the rename survives a crash.

    The file gets `mode` (mkstemp would leave 0600, unreadable to a validator or web server running as another user).
    """
    path = Path(path)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)


def publish_atomically(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """`write_atomically` of `data`."""
    write_atomically(path, lambda handle: handle.write(data), mode=mode)


def write_rollouts(path: Path | str, meta: RolloutMeta, rows: list[RolloutRow]) -> WrittenFile:
    """Encodes and publishes one rollout file; returns its work key and units for the ledger."""
    data = encode_rollouts(meta, rows)
    publish_atomically(Path(path), data)
    return WrittenFile(path=Path(path), work_key=hashlib.sha256(data).digest(), units=work_units(rows), size=len(data))
