"""Rollout files: round trip, determinism, atomic publication, and every way a hostile file is refused."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.rollouts import (
    ARROW_SCHEMA,
    COLUMN_NAMES,
    METADATA_KEY,
    NO_TARGET_LENGTH,
    FormatProblem,
    RolloutFormatError,
    RolloutRow,
    SamplingMeta,
    encode_rollouts,
    read_rollouts,
    work_units,
    write_rollouts,
)
from protocol.rollouts.meta import encode_meta
from tests.protocol.rollout_meta import NODE, make_meta

MAX_BYTES = 1 << 20


def make_rows(n: int = 6) -> list[RolloutRow]:
    """Two completions per prompt; floats are float32-exact so a round trip compares equal."""
    rng = random.Random(n)
    return [
        RolloutRow(
            problem_id=f"arith/{i // 2}",
            group=i // 2,
            input_tokens=[rng.randrange(96) for _ in range(5 + i)],
            output_tokens=[rng.randrange(96) for _ in range(1 + 3 * i)],
            output_logprobs=[-0.25 * k for k in range(1 + 3 * i)],
            finish_reason="stop" if i % 2 else "length",
            reward=1.5 - i,
            task_reward=float(i % 2),
            length_penalty=-0.125 * i,
            target_length=NO_TARGET_LENGTH if i == 0 else 32 * i,
            seed=2**40 + i,
            step=3,
            proofs=rng.randbytes(258 * (1 + i // 3)),
        )
        for i in range(n)
    ]


def test_round_trip_keeps_every_field_and_the_metadata(tmp_path: Path) -> None:
    rows, meta = make_rows(), make_meta()
    written = write_rollouts(tmp_path / "r.parquet", meta, rows)
    data = (tmp_path / "r.parquet").read_bytes()
    loaded = read_rollouts(tmp_path / "r.parquet", max_bytes=MAX_BYTES)
    assert loaded.rows == rows
    assert loaded.meta == meta
    assert written.work_key == hashlib.sha256(data).digest() == loaded.work_key
    assert written.units == work_units(rows) == sum(1 + 3 * i for i in range(6))
    assert written.size == len(data) == loaded.size
    assert read_rollouts(data, max_bytes=MAX_BYTES).rows == rows  # bytes read the same as a path


def test_metadata_is_canonical_json_under_the_prime_key() -> None:
    data = encode_rollouts(make_meta(), make_rows())
    stored = pq.ParquetFile(io.BytesIO(data)).metadata.metadata[METADATA_KEY]
    assert json.loads(stored) == {
        "format_version": 3,
        "pool_id": 7,
        "node": NODE,
        "manifest_hash": "0x" + bytes(range(32)).hex(),
        "sampling": {"temperature": 0.75, "top_p": 0.875, "max_tokens": 64},
        "task_spec_hash": "0x" + "02" * 32,
        "model_hash": "0x" + "03" * 32,
        "counter": 2,
        "assignment_signature": None,
        "assignment_issued_at": None,
        "created_by": "prime-node test",
    }


def test_a_format_2_file_reads_and_writes_back_byte_identically() -> None:
    """Files written before issue 32 (format 2: no `assignment_issued_at` key) keep being read, with no issue time,
    and re-encoded in their own version: their bytes are their work key."""
    signature = bytes(range(65))
    document = json.loads(encode_meta(make_meta(assignment_signature=signature, assignment_issued_at=7)))
    assert document["assignment_issued_at"] == 7
    del document["assignment_issued_at"]
    document["format_version"] = 2
    written = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    meta = read_rollouts(parquet_bytes(good_columns(), written), max_bytes=MAX_BYTES).meta
    assert (meta.format_version, meta.assignment_signature, meta.assignment_issued_at) == (2, signature, None)
    assert encode_meta(meta) == written
    assert make_meta(assignment_signature=signature, assignment_issued_at=7).format_version == 3


def test_floats_are_stored_as_float32() -> None:
    row = make_rows(1)[0]
    (read,) = read_rollouts(encode_rollouts(make_meta(), [replace_row(row, reward=0.1)]), max_bytes=MAX_BYTES).rows
    assert read.reward != 0.1 and read.reward == pa.scalar(0.1, pa.float32()).as_py()


def replace_row(row: RolloutRow, **changes: Any) -> RolloutRow:
    return RolloutRow(**(vars(row) | changes))


def test_same_rows_and_meta_give_byte_identical_files(tmp_path: Path) -> None:
    first = write_rollouts(tmp_path / "a.parquet", make_meta(), make_rows())
    second = write_rollouts(tmp_path / "b.parquet", make_meta(), make_rows())
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert first.work_key == second.work_key
    changed = [replace_row(make_rows()[0], reward=0.5), *make_rows()[1:]]
    assert encode_rollouts(make_meta(), changed) != encode_rollouts(make_meta(), make_rows())


def test_a_written_file_is_readable_by_other_users(tmp_path: Path) -> None:
    written = write_rollouts(tmp_path / "a.parquet", make_meta(), make_rows())
    assert written.path.stat().st_mode & 0o777 == 0o644  # mkstemp alone would leave 0600


def test_failed_rename_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("occupied")  # os.replace cannot put a file over a non-empty directory
    with pytest.raises(OSError):
        write_rollouts(tmp_path / "taken", make_meta(), make_rows())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_rows_a_reader_refuses_are_never_written_over_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    write_rollouts(path, make_meta(), make_rows())
    before = path.read_bytes()
    bad = [replace_row(make_rows()[0], reward=float("nan"))]
    with pytest.raises(RolloutFormatError) as caught:
        write_rollouts(path, make_meta(), bad)
    assert caught.value.problem == FormatProblem.NON_FINITE
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]


def test_writer_refuses_token_ids_beyond_int32() -> None:
    with pytest.raises(RolloutFormatError, match="output_tokens"):
        encode_rollouts(make_meta(), [replace_row(make_rows(1)[0], output_tokens=[2**31], output_logprobs=[0.0])])


def test_invalid_meta_cannot_be_constructed() -> None:
    with pytest.raises(RolloutFormatError, match="checksummed"):
        make_meta(node=NODE.lower())
    with pytest.raises(RolloutFormatError, match="top_p"):
        SamplingMeta(temperature=1.0, top_p=1.5, max_tokens=8)


# --- hostile files, built with pyarrow directly ---------------------------------------------------------------


def good_columns() -> dict[str, pa.Array]:
    rows = make_rows()
    return {
        name: pa.array([getattr(r, name) for r in rows], type=ARROW_SCHEMA.field(name).type) for name in COLUMN_NAMES
    }


def parquet_bytes(columns: dict[str, pa.Array], meta: bytes | None = None) -> bytes:
    """Any table, written with plain pyarrow defaults, with `meta` under b"prime" (the good meta by default)."""
    table = pa.table(columns)
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema) as writer:
        writer.write_table(table)
        if meta != b"<none>":
            writer.add_key_value_metadata({METADATA_KEY: encode_meta(make_meta()) if meta is None else meta})
    return sink.getvalue()


def with_column(name: str, array: pa.Array) -> bytes:
    return parquet_bytes(good_columns() | {name: array})


DROP = object()


def with_meta(**changes: Any) -> bytes:
    """The good metadata JSON with keys changed, added, or (value DROP) removed."""
    document = json.loads(encode_meta(make_meta())) | changes
    document = {key: value for key, value in document.items() if value is not DROP}
    return parquet_bytes(good_columns(), json.dumps(document).encode())


def without(name: str) -> dict[str, pa.Array]:
    return {k: v for k, v in good_columns().items() if k != name}


def list_of(kind: pa.DataType, values: list[Any] | None) -> pa.Array:
    """A 6-row list column whose first row is `values` and the others copy row 1 of the good file."""
    good = good_columns()["output_tokens" if kind != pa.float32() else "output_logprobs"].to_pylist()
    return pa.array([values, *good[1:]], type=pa.list_(kind))


def scalar_column(name: str, first: Any) -> pa.Array:
    values = good_columns()[name].to_pylist()
    return pa.array([first, *values[1:]], type=ARROW_SCHEMA.field(name).type)


def good_bytes() -> bytes:
    return encode_rollouts(make_meta(), make_rows())


GOOD = good_bytes()


HOSTILE: dict[str, tuple[Callable[[], bytes], FormatProblem]] = {
    "text": (lambda: b"problem_id,group\n" * 20, FormatProblem.NOT_PARQUET),
    "nothing": (lambda: b"", FormatProblem.NOT_PARQUET),
    "cut_in_half": (lambda: good_bytes()[: len(good_bytes()) // 2], FormatProblem.TRUNCATED),
    "cut_footer_end": (lambda: good_bytes()[:-3], FormatProblem.TRUNCATED),
    "footer_garbage": (lambda: good_bytes()[:4] + b"\x00" * 200 + good_bytes()[-8:], FormatProblem.CORRUPT),
    "missing_column": (lambda: parquet_bytes(without("proofs")), FormatProblem.SCHEMA),
    "extra_column": (lambda: parquet_bytes(good_columns() | {"bonus": pa.array([1.0] * 6)}), FormatProblem.SCHEMA),
    "reordered": (lambda: parquet_bytes(dict(reversed(good_columns().items()))), FormatProblem.SCHEMA),
    "group_int64": (lambda: with_column("group", pa.array([0, 0, 1, 1, 2, 2], pa.int64())), FormatProblem.SCHEMA),
    "reward_float64": (lambda: with_column("reward", pa.array([1.0] * 6, pa.float64())), FormatProblem.SCHEMA),
    "tokens_int64": (
        lambda: with_column("output_tokens", pa.array([[1]] * 6, pa.list_(pa.int64()))),
        FormatProblem.SCHEMA,
    ),
    "tokens_large_list": (
        lambda: with_column("output_tokens", pa.array([[1]] * 6, pa.large_list(pa.int32()))),
        FormatProblem.SCHEMA,
    ),
    "tokens_as_string": (lambda: with_column("output_tokens", pa.array(["1 2"] * 6)), FormatProblem.SCHEMA),
    "proofs_as_string": (lambda: with_column("proofs", pa.array(["x"] * 6)), FormatProblem.SCHEMA),
    "null_reward": (lambda: with_column("reward", scalar_column("reward", None)), FormatProblem.NULLS),
    "null_problem": (lambda: with_column("problem_id", scalar_column("problem_id", None)), FormatProblem.NULLS),
    "null_token_list": (lambda: with_column("input_tokens", list_of(pa.int32(), None)), FormatProblem.NULLS),
    "null_token": (lambda: with_column("output_tokens", list_of(pa.int32(), [None])), FormatProblem.NULLS),
    "no_metadata": (lambda: parquet_bytes(good_columns(), b"<none>"), FormatProblem.METADATA),
    "meta_not_json": (lambda: parquet_bytes(good_columns(), b"{pool: 7"), FormatProblem.METADATA),
    "meta_not_utf8": (lambda: parquet_bytes(good_columns(), b"\xff\xfe{}"), FormatProblem.METADATA),
    "meta_a_list": (lambda: parquet_bytes(good_columns(), b"[1, 2]"), FormatProblem.METADATA),
    "meta_deeply_nested": (lambda: parquet_bytes(good_columns(), b"[" * 100_000), FormatProblem.METADATA),
    "meta_missing_key": (lambda: with_meta(pool_id=DROP), FormatProblem.METADATA),
    "meta_extra_key": (lambda: with_meta(bonus=1), FormatProblem.METADATA),
    "meta_future_version": (lambda: with_meta(format_version=4), FormatProblem.METADATA),
    "meta_v2_with_issue_time": (lambda: with_meta(format_version=2), FormatProblem.METADATA),  # 3's keys under 2
    "meta_v3_without_issue_time": (lambda: with_meta(assignment_issued_at=DROP), FormatProblem.METADATA),
    "meta_issue_time_unsigned": (lambda: with_meta(assignment_issued_at=1_700_000_000), FormatProblem.METADATA),
    "meta_signature_untimed": (lambda: with_meta(assignment_signature="0x" + "ab" * 65), FormatProblem.METADATA),
    "meta_negative_issue_time": (
        lambda: with_meta(assignment_signature="0x" + "ab" * 65, assignment_issued_at=-1),
        FormatProblem.METADATA,
    ),
    "meta_bool_issue_time": (
        lambda: with_meta(assignment_signature="0x" + "ab" * 65, assignment_issued_at=True),
        FormatProblem.METADATA,
    ),
    "meta_short_signature": (lambda: with_meta(assignment_signature="0x" + "ab" * 64), FormatProblem.METADATA),
    "meta_bool_version": (lambda: with_meta(format_version=True), FormatProblem.METADATA),
    "meta_negative_pool": (lambda: with_meta(pool_id=-1), FormatProblem.METADATA),
    "meta_float_counter": (lambda: with_meta(counter=2.0), FormatProblem.METADATA),
    "meta_unchecksummed_node": (lambda: with_meta(node=NODE.lower()), FormatProblem.METADATA),
    "meta_short_hash": (lambda: with_meta(model_hash="0x" + "03" * 31), FormatProblem.METADATA),
    "meta_uppercase_hash": (lambda: with_meta(model_hash="0x" + "AB" * 32), FormatProblem.METADATA),
    "meta_nan_temperature": (
        lambda: with_meta(sampling={"temperature": float("nan"), "top_p": 1.0, "max_tokens": 8}),
        FormatProblem.METADATA,
    ),
    "meta_sampling_extra": (
        lambda: with_meta(sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 8, "min_p": 0.1}),
        FormatProblem.METADATA,
    ),
    "meta_zero_max_tokens": (
        lambda: with_meta(sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 0}),
        FormatProblem.METADATA,
    ),
    "no_rows": (lambda: parquet_bytes({k: v.slice(0, 0) for k, v in good_columns().items()}), FormatProblem.EMPTY),
    "logprobs_short": (lambda: with_column("output_logprobs", list_of(pa.float32(), [])), FormatProblem.LENGTHS),
    "no_output": (
        lambda: parquet_bytes(
            good_columns() | {"output_tokens": list_of(pa.int32(), []), "output_logprobs": list_of(pa.float32(), [])}
        ),
        FormatProblem.LENGTHS,
    ),
    "no_prompt": (lambda: with_column("input_tokens", list_of(pa.int32(), [])), FormatProblem.LENGTHS),
    "negative_token": (lambda: with_column("input_tokens", list_of(pa.int32(), [5, -1])), FormatProblem.TOKEN_IDS),
    "unknown_finish": (
        lambda: with_column("finish_reason", scalar_column("finish_reason", "abort")),
        FormatProblem.FINISH_REASON,
    ),
    "nan_reward": (lambda: with_column("reward", scalar_column("reward", float("nan"))), FormatProblem.NON_FINITE),
    "inf_penalty": (
        lambda: with_column("length_penalty", scalar_column("length_penalty", float("inf"))),
        FormatProblem.NON_FINITE,
    ),
    "nan_logprob": (
        lambda: with_column("output_logprobs", list_of(pa.float32(), [float("nan")])),
        FormatProblem.NON_FINITE,
    ),
    "negative_group": (lambda: with_column("group", scalar_column("group", -1)), FormatProblem.VALUE),
    "negative_step": (lambda: with_column("step", scalar_column("step", -3)), FormatProblem.VALUE),
    "target_below_none": (
        lambda: with_column("target_length", scalar_column("target_length", -2)),
        FormatProblem.VALUE,
    ),
    "empty_proof": (lambda: with_column("proofs", scalar_column("proofs", b"")), FormatProblem.VALUE),
    "empty_problem_id": (lambda: with_column("problem_id", scalar_column("problem_id", "")), FormatProblem.VALUE),
    "group_of_two_problems": (
        lambda: with_column("problem_id", scalar_column("problem_id", "other")),
        FormatProblem.VALUE,
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_is_refused_with_its_reason(case: str) -> None:
    build, problem = HOSTILE[case]
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(build(), max_bytes=MAX_BYTES)
    assert caught.value.problem == problem, str(caught.value)


def test_plain_pyarrow_file_of_the_right_shape_is_accepted() -> None:
    """The hostile builders above differ from this one file only in what each case breaks."""
    assert read_rollouts(parquet_bytes(good_columns()), max_bytes=MAX_BYTES).rows == make_rows()


def test_offending_row_is_named() -> None:
    values = good_columns()["step"].to_pylist()
    values[4] = -1
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(with_column("step", pa.array(values, pa.int32())), max_bytes=MAX_BYTES)
    assert caught.value.row == 4


def test_flipped_byte_in_a_data_page_is_corrupt() -> None:
    data = bytearray(good_bytes())
    proof = make_rows()[3].proofs  # random bytes: zstd stores them verbatim, so they can be found
    data[bytes(data).index(proof[:64]) + 10] ^= 0xFF  # the page CRC no longer matches
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(bytes(data), max_bytes=MAX_BYTES)
    assert caught.value.problem == FormatProblem.CORRUPT


def test_invalid_utf8_string_is_corrupt() -> None:
    offsets = pa.py_buffer(pa.array([0, 2, 4, 6, 8, 10, 12], pa.int32()).buffers()[1])
    raw = pa.Array.from_buffers(pa.string(), 6, [None, offsets, pa.py_buffer(b"\xff\xfe" * 6)])
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(with_column("problem_id", raw), max_bytes=MAX_BYTES)
    assert caught.value.problem == FormatProblem.CORRUPT


def test_size_is_checked_before_parsing(tmp_path: Path) -> None:
    data = good_bytes()
    for source in (b"x" * (len(data) + 1), data):
        with pytest.raises(RolloutFormatError) as caught:
            read_rollouts(source, max_bytes=len(data) - 1)
        assert caught.value.problem == FormatProblem.TOO_LARGE
    (tmp_path / "big").write_bytes(b"\x00" * 10_000)  # not Parquet, but too big is said first
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(tmp_path / "big", max_bytes=9_999)
    assert caught.value.problem == FormatProblem.TOO_LARGE
    assert read_rollouts(data, max_bytes=len(data)).rows == make_rows()


def test_row_and_token_caps() -> None:
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(good_bytes(), max_bytes=MAX_BYTES, max_rows=5)
    assert caught.value.problem == FormatProblem.TOO_MANY_ROWS
    n_values = sum(len(r.input_tokens) + 2 * len(r.output_tokens) for r in make_rows())
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(good_bytes(), max_bytes=MAX_BYTES, max_tokens=n_values - 1)
    assert caught.value.problem == FormatProblem.TOO_MANY_TOKENS
    assert len(read_rollouts(good_bytes(), max_bytes=MAX_BYTES, max_rows=6, max_tokens=n_values).rows) == 6


def test_decompression_bomb_is_refused_before_decoding() -> None:
    columns = good_columns() | {"proofs": pa.array([b"\x00" * (50 << 20)] + [b"p"] * 5, pa.binary())}
    table = pa.table(columns)
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema, compression="zstd") as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({METADATA_KEY: encode_meta(make_meta())})
    data = sink.getvalue()
    assert len(data) < 100_000  # 50 MiB of zeros compress to almost nothing
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(data, max_bytes=MAX_BYTES, max_rows=100, max_tokens=10_000)
    assert caught.value.problem == FormatProblem.TOO_LARGE and "uncompressed" in caught.value.detail


def test_many_row_groups_are_refused() -> None:
    table = pa.table(good_columns())
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema) as writer:
        for _ in range(1025):
            writer.write_table(table.slice(0, 1))
    with pytest.raises(RolloutFormatError, match="row groups"):
        read_rollouts(sink.getvalue(), max_bytes=16 << 20, max_rows=10_000)


def test_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(RolloutFormatError):
        read_rollouts(tmp_path / "absent.parquet", max_bytes=MAX_BYTES)


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def test_footer_that_aborts_pyarrow_column_metadata_is_refused_cleanly(tmp_path: Path) -> None:
    """Found by fuzzing: materialising this footer's column metadata kills the process (uncaught C++ exception).

    Both reads run in child processes, so a regression fails this test instead of killing the session.
    """
    rows = [
        RolloutRow(
            f"p{i // 2}", i // 2, [1, 2, 3] * i + [1], [4, 5] * (i + 1), [-0.5, -1.25] * (i + 1), "stop",
            1.0, 1.0, 0.0, -1, 7, 3, bytes(range(i, i + 50)),
        )
        for i in range(6)
    ]  # fmt: skip
    data = bytearray(encode_rollouts(make_meta(), rows))
    data[1016] = 43  # a level-histogram length in the footer (the column chunks come before the b"prime" JSON)
    path = tmp_path / "bad.parquet"
    path.write_bytes(data)
    direct = run_child(
        "import pyarrow.parquet as pq\n"
        f"group = pq.ParquetFile({str(path)!r}).metadata.row_group(0)\n"
        "[group.column(i) for i in range(group.num_columns)]\n"
    )
    assert direct.returncode != 0 and "histogram" in direct.stderr  # the hazard is real in this pyarrow
    ours = run_child(
        "from protocol.rollouts import read_rollouts, RolloutFormatError\n"
        f"try:\n    read_rollouts({str(path)!r}, max_bytes=1 << 20)\n"
        "except RolloutFormatError as exc:\n    print(exc.problem)\n"
    )
    assert ours.returncode == 0, ours.stderr[-500:]
    assert ours.stdout.strip() == FormatProblem.CORRUPT


@settings(max_examples=300, deadline=None)
@given(
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.none() | st.floats(0, 1),
)
def test_mutated_file_raises_only_format_errors(edits: list[tuple[float, int]], cut: float | None) -> None:
    data = bytearray(GOOD)
    for where, value in edits:
        data[int(where * len(data))] = value
    if cut is not None:
        data = data[: int(cut * len(data))]
    with contextlib.suppress(RolloutFormatError):  # any other exception, or a crash, fails the test
        read_rollouts(bytes(data), max_bytes=MAX_BYTES)
