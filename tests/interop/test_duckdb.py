"""Rollout files (docs/rollout-format.md) against a second Parquet implementation, DuckDB.

DuckDB reads what our writer wrote: the documented column types, the same values, the `prime` metadata, and the
work units (total output tokens) that a validator compares with the chain. Our reader accepts what DuckDB writes
from the same rows, under each of its codecs, both Parquet page versions and small row groups: a worker built on
another Parquet library is not refused (and so never slashed) for the library alone. What DuckDB writes outside the
format is refused with the reason.
"""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from protocol.rollouts import (
    NO_TARGET_LENGTH,
    RolloutFormatError,
    RolloutMeta,
    RolloutRow,
    SamplingMeta,
    encode_rollouts,
    read_rollouts,
    work_units,
)
from protocol.rollouts.schema import FormatProblem

MAX_BYTES = 64 * 1024 * 1024
META = RolloutMeta(
    pool_id=4,
    node="0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A",
    manifest_hash=b"\x01" * 32,
    sampling=SamplingMeta(temperature=1.0, top_p=1.0, max_tokens=64),
    task_spec_hash=b"\x02" * 32,
    model_hash=b"\x03" * 32,
    counter=7,
    created_by="prime-node test",
)
DUCKDB_TYPES = [
    ("problem_id", "VARCHAR"),
    ("group", "INTEGER"),
    ("input_tokens", "INTEGER[]"),
    ("output_tokens", "INTEGER[]"),
    ("output_logprobs", "FLOAT[]"),
    ("finish_reason", "VARCHAR"),
    ("reward", "FLOAT"),
    ("task_reward", "FLOAT"),
    ("length_penalty", "FLOAT"),
    ("target_length", "INTEGER"),
    ("seed", "BIGINT"),
    ("step", "INTEGER"),
    ("proofs", "BLOB"),
]


def rows(count: int) -> list[RolloutRow]:
    """`count` well-formed rows of random lengths, in groups of 4, with a proof of incompressible bytes each."""
    rng = random.Random(count)
    made = []
    for i in range(count):
        out = rng.randrange(1, 64)
        made.append(
            RolloutRow(
                problem_id=f"task/ü-{i // 4}",
                group=i // 4,
                input_tokens=[rng.randrange(151_000) for _ in range(rng.randrange(1, 40))],
                output_tokens=[rng.randrange(151_000) for _ in range(out)],
                output_logprobs=[-rng.random() * 5 for _ in range(out)],
                finish_reason=rng.choice(["stop", "length"]),
                reward=rng.random(),
                task_reward=float(i % 2),
                length_penalty=-rng.random(),
                target_length=rng.choice([NO_TARGET_LENGTH, 256]),
                seed=rng.randrange(-(2**63), 2**63),
                step=i % 3,
                proofs=rng.randbytes(258),
            )
        )
    return made


def duckdb_writes(source: Path, select: str, target: Path, options: str = "") -> None:
    """DuckDB writes `SELECT select` of the rows of `source` to `target`, with the same `prime` metadata."""
    metadata = pq.ParquetFile(source).metadata.metadata[b"prime"].decode().replace("'", "''")
    query = f"SELECT {select} FROM read_parquet('{source}')"
    copy_options = ["FORMAT parquet", f"KV_METADATA {{prime: '{metadata}'}}", *([options] if options else [])]
    duckdb.connect().execute(f"COPY ({query}) TO '{target}' ({', '.join(copy_options)})")


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[RolloutRow]]:
    made = rows(2_000)
    path = tmp_path_factory.mktemp("duckdb") / "ours.parquet"
    path.write_bytes(encode_rollouts(META, made))
    return path, made


def test_duckdb_reads_our_columns_values_metadata_and_work_units(ours: tuple[Path, list[RolloutRow]]) -> None:
    path, made = ours
    con = duckdb.connect()
    described = con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(path)]).fetchall()
    assert [(name, kind) for name, kind, *_ in described] == DUCKDB_TYPES
    (units,) = con.execute("SELECT sum(len(output_tokens)) FROM read_parquet(?)", [str(path)]).fetchone() or (None,)
    assert units == work_units(made)
    query = 'SELECT * FROM read_parquet(?) WHERE seed IN (?, ?) ORDER BY "group"'
    first, last = con.execute(query, [str(path), made[0].seed, made[-1].seed]).fetchall()
    for row, expected in ((first, made[0]), (last, made[-1])):
        assert row[0] == expected.problem_id and row[1] == expected.group and row[10] == expected.seed
        assert row[2] == expected.input_tokens and row[3] == expected.output_tokens
        assert row[12] == expected.proofs
        assert row[4] == pytest.approx(expected.output_logprobs, rel=1e-6)  # float32 in the file
    ((key, value),) = con.execute("SELECT key, value FROM parquet_kv_metadata(?)", [str(path)]).fetchall()
    assert key == b"prime" and value == pq.ParquetFile(path).metadata.metadata[b"prime"]


@pytest.mark.parametrize(
    "options",
    [
        "",
        "COMPRESSION zstd",
        "COMPRESSION gzip",
        "COMPRESSION uncompressed",
        "COMPRESSION lz4",
        "COMPRESSION brotli",
        "PARQUET_VERSION v2",
        "COMPRESSION zstd, PARQUET_VERSION v2, ROW_GROUP_SIZE 100",
    ],
)
def test_our_reader_accepts_what_duckdb_writes_from_the_same_rows(
    ours: tuple[Path, list[RolloutRow]], tmp_path: Path, options: str
) -> None:
    path, made = ours
    theirs = tmp_path / "duckdb.parquet"
    duckdb_writes(path, "*", theirs, options)
    read, expected = read_rollouts(theirs, max_bytes=MAX_BYTES), read_rollouts(path, max_bytes=MAX_BYTES)
    assert read.work_key != expected.work_key  # another writer's bytes: another work key, the same content
    assert read.meta == META and read.rows == expected.rows and len(read.rows) == len(made)


@pytest.mark.parametrize(
    ("select", "problem"),
    [
        ("* REPLACE (output_tokens::BIGINT[] AS output_tokens)", FormatProblem.SCHEMA),
        ("* REPLACE (reward::DOUBLE AS reward)", FormatProblem.SCHEMA),
        ("* EXCLUDE (proofs)", FormatProblem.SCHEMA),
        ("*, 1 AS bonus", FormatProblem.SCHEMA),
        ("* REPLACE (CASE WHEN seed = $seed THEN NULL ELSE output_tokens END AS output_tokens)", FormatProblem.NULLS),
    ],
)
def test_what_duckdb_writes_outside_the_format_is_refused_with_the_reason(
    ours: tuple[Path, list[RolloutRow]], tmp_path: Path, select: str, problem: FormatProblem
) -> None:
    path, made = ours
    theirs = tmp_path / "duckdb.parquet"
    duckdb_writes(path, select.replace("$seed", str(made[5].seed)), theirs)
    with pytest.raises(RolloutFormatError) as refused:
        read_rollouts(theirs, max_bytes=MAX_BYTES)
    assert refused.value.problem == problem
