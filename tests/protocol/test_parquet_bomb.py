"""Parquet bombs (issue 19, item 2): files of a few KB that decode to 10^8 values are refused before decoding.

A dictionary page holding one value and an RLE run "N times index 0" decode to N values whatever N is, so a
file's encoded sizes bound nothing; `read_rollouts` bounds the decoded counts the footer and every page header
declare (protocol/rollouts/bounds.py). Before, the 4 KB file of `bomb_bytes(10**8)` took 1.2-1.5 GB and 4-7 s to
refuse, the same file with a footer that understates the count 1.6 GB, and one of 3 x 10^7 values was accepted
(850 MB), all of it on the coordinator's event loop and on every validator. Now each is refused in 20-50 ms at the
89 MB a Python with pyarrow takes.
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from protocol.rollouts import (
    ARROW_SCHEMA,
    METADATA_KEY,
    NO_TARGET_LENGTH,
    FormatProblem,
    RolloutFormatError,
    RolloutRow,
    encode_rollouts,
    read_rollouts,
)
from protocol.rollouts.bounds import MAX_PAGES, VALUES_PER_BYTE
from protocol.rollouts.meta import encode_meta
from tests.protocol.rollout_meta import NODE, make_meta

SEED_VALUES = (1 << 20) + 8  # the run lengths written (N, and N - 8 after a bit-packed first group) have 4-byte varints


def _varint(value: int, width: int | None = None) -> bytes:
    """Unsigned LEB128, padded to `width` bytes with continuation bits (overlong, which Thrift accepts)."""
    out = bytearray()
    while True:
        out.append(value & 0x7F)
        value >>= 7
        if not value and (width is None or len(out) >= width):
            break
        out[-1] |= 0x80
    return bytes(out)


def bomb_bytes(
    values: int, *, footer_values: int | None = None, node: str = NODE, pool_id: int = 7, padding: int = 0
) -> bytes:
    """A rollout file whose one row's `input_tokens` is `values` copies of one dictionary entry.

    pyarrow writes SEED_VALUES of them: one dictionary page, then one data page of RLE runs (repetition levels,
    definition levels, indices) whose counts, the page's num_values and the footer's are all 4-byte varints;
    each is rewritten in place to `values` (< 2**27), so every size and offset stays right. `footer_values`
    makes the footer declare another count than the page; `padding` random bytes of proof make the file larger.
    """
    assert SEED_VALUES <= values < 1 << 27
    n = SEED_VALUES
    columns = {
        "problem_id": pa.array(["p/0"]),
        "group": pa.array([0], pa.int32()),
        "input_tokens": pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.repeat(pa.scalar(7, pa.int32()), n)),
        "output_tokens": pa.array([[1]], pa.list_(pa.int32())),
        "output_logprobs": pa.array([[-0.5]], pa.list_(pa.float32())),
        "finish_reason": pa.array(["stop"]),
        "reward": pa.array([1.0], pa.float32()),
        "task_reward": pa.array([1.0], pa.float32()),
        "length_penalty": pa.array([0.0], pa.float32()),
        "target_length": pa.array([NO_TARGET_LENGTH], pa.int32()),
        "seed": pa.array([1], pa.int64()),
        "step": pa.array([0], pa.int32()),
        "proofs": pa.array([b"\x01" * 258 + random.Random(padding).randbytes(padding)], pa.binary()),
    }
    sink = io.BytesIO()
    with pq.ParquetWriter(
        sink, ARROW_SCHEMA, use_dictionary=["input_tokens.list.element"], compression="none", store_schema=False
    ) as writer:
        writer.write_table(pa.table(columns, schema=ARROW_SCHEMA))
        writer.add_key_value_metadata({METADATA_KEY: encode_meta(make_meta(node=node, pool_id=pool_id))})
    data = sink.getvalue()
    footer_at = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    pages, footer = data[:footer_at], data[footer_at:]
    runs, first_run = _varint(2 * n), _varint(2 * (n - 8))  # zigzag(n) = RLE header of a run of n = 2n
    assert (pages.count(runs), pages.count(first_run), footer.count(runs)) == (3, 1, 2), "pyarrow wrote other runs"
    pages = pages.replace(runs, _varint(2 * values)).replace(first_run, _varint(2 * (values - 8)))
    declared = values if footer_values is None else footer_values
    footer = footer.replace(runs, _varint(2 * declared, width=4))  # num_values and the level histogram
    return pages + footer


def run_child(path: Path) -> tuple[str, int]:
    """`read_rollouts(path)` in a child process: (the problem or "accepted", its peak RSS in MiB).

    The peak is the child's VmHWM: `ru_maxrss` keeps the parent's peak across fork and exec (Linux), so it reads
    the pytest process's size once a test has loaded a model."""
    code = (
        "from protocol.rollouts import read_rollouts, RolloutFormatError\n"
        "try:\n"
        f"    read_rollouts({str(path)!r}, max_bytes=64 << 20)\n"
        "    outcome = 'accepted'\n"
        "except RolloutFormatError as exc:\n"
        "    outcome = f'{exc.problem} {exc.detail}'\n"
        "print(outcome)\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print(int(status['VmHWM'].split()[0]) // 1024)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == 0, child.stderr[-2000:]
    outcome, rss = child.stdout.strip().splitlines()
    return outcome, int(rss)


def test_a_few_kb_declaring_1e8_values_is_refused_before_decoding(tmp_path: Path) -> None:
    data = bomb_bytes(10**8)
    assert len(data) < 4096
    (tmp_path / "bomb.parquet").write_bytes(data)
    outcome, rss = run_child(tmp_path / "bomb.parquet")
    assert outcome.startswith(FormatProblem.TOO_MANY_TOKENS), outcome
    assert "'input_tokens' declares 100000000 values" in outcome
    assert rss < 300, f"peak RSS {rss} MiB: the values were decoded"  # decoding them took 1.2-1.5 GB


def test_a_footer_understating_what_a_page_decodes_to_is_refused_before_decoding(tmp_path: Path) -> None:
    (tmp_path / "lie.parquet").write_bytes(bomb_bytes(10**8, footer_values=1000))
    outcome, rss = run_child(tmp_path / "lie.parquet")
    assert outcome.startswith(FormatProblem.CORRUPT), outcome
    assert "pages hold 100000000 values, its metadata 1000" in outcome
    assert rss < 300, f"peak RSS {rss} MiB: the page was decoded"  # pyarrow decodes what the page header says


def test_3e7_values_in_a_small_file_are_refused_though_under_max_tokens() -> None:
    data = bomb_bytes(3 * 10**7)  # under the 2**25 cap: accepted before, costing every validator 850 MB
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(data, max_bytes=64 << 20)
    assert caught.value.problem == FormatProblem.TOO_MANY_TOKENS
    assert f"{VALUES_PER_BYTE} a byte of a {len(data)}-byte file" in caught.value.detail


def test_values_are_allowed_in_proportion_to_the_file_size() -> None:
    values = 2 * 10**6
    with pytest.raises(RolloutFormatError, match=f"{VALUES_PER_BYTE} a byte"):
        read_rollouts(bomb_bytes(values), max_bytes=64 << 20)
    padded = bomb_bytes(values, padding=values // VALUES_PER_BYTE)  # as many bytes as that many values need
    assert read_rollouts(padded, max_bytes=64 << 20).rows[0].input_tokens == [7] * values


def _pyarrow_file(columns: dict[str, pa.Array], **options: Any) -> bytes:
    """A file another writer might make (pyarrow's defaults where `options` does not say); a dictionary array is
    written as a dictionary-encoded column of its value type."""
    fields = [pa.field(name, columns[name].type, nullable=False) for name in ARROW_SCHEMA.names]
    table = pa.table(columns, schema=pa.schema(fields))
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema, store_schema=False, **options) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({METADATA_KEY: encode_meta(make_meta())})
    return sink.getvalue()


def _columns(rows: int, proofs: pa.Array) -> dict[str, pa.Array]:
    return {
        "problem_id": pa.array(["p/0"] * rows),
        "group": pa.array([0] * rows, pa.int32()),
        "input_tokens": pa.array([[3]] * rows, pa.list_(pa.int32())),
        "output_tokens": pa.array([[1]] * rows, pa.list_(pa.int32())),
        "output_logprobs": pa.array([[-0.5]] * rows, pa.list_(pa.float32())),
        "finish_reason": pa.array(["stop"] * rows),
        "reward": pa.array([1.0] * rows, pa.float32()),
        "task_reward": pa.array([1.0] * rows, pa.float32()),
        "length_penalty": pa.array([0.0] * rows, pa.float32()),
        "target_length": pa.array([NO_TARGET_LENGTH] * rows, pa.int32()),
        "seed": pa.array(range(rows), pa.int64()),
        "step": pa.array([0] * rows, pa.int32()),
        "proofs": proofs,
    }


def test_a_dictionary_binary_column_is_refused_before_it_is_expanded() -> None:
    """One 64 KiB proof, referenced by 4,096 rows, is 256 MiB once expanded: checked on the dictionary."""
    rows = 4096
    proofs = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([bytes(64 << 10)]))
    data = _pyarrow_file(_columns(rows, proofs), compression="zstd")
    assert len(data) < 20_000
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(data, max_bytes=1 << 20, max_rows=rows, max_tokens=1 << 16)
    assert caught.value.problem == FormatProblem.TOO_LARGE
    assert "'proofs' expands to 268435456 bytes" in caught.value.detail


def test_a_dictionary_encoded_file_of_another_writer_is_still_accepted() -> None:
    rows = 64
    proofs = pa.array([bytes([i]) * 300 for i in range(rows)])
    data = _pyarrow_file(_columns(rows, proofs), use_dictionary=True, compression="snappy")
    file = read_rollouts(data, max_bytes=1 << 20)
    assert [row.proofs for row in file.rows] == proofs.to_pylist() and file.rows[5].problem_id == "p/0"


def test_more_pages_than_a_file_may_have_are_refused() -> None:
    rows = MAX_PAGES // 13 + 1  # one page per row and column
    data = _pyarrow_file(
        _columns(rows, pa.array([b"proof"] * rows)), data_page_size=1, write_batch_size=1, use_dictionary=False
    )
    with pytest.raises(RolloutFormatError) as caught:
        read_rollouts(data, max_bytes=16 << 20)
    assert caught.value.problem == FormatProblem.TOO_LARGE and f"more than {MAX_PAGES} pages" in caught.value.detail


def test_prompt_heavy_honest_files_stay_far_below_the_value_ratio() -> None:
    """The writer's most compressible honest shape: a large group sharing a long prompt of few distinct tokens,
    one output token each, and the smallest proof there is (a 16-wide hidden state: 34 bytes a chunk)."""
    rng = random.Random(0)
    prompt = [rng.randrange(100) for _ in range(2500)]
    rows = [
        RolloutRow(
            "p/0", 0, prompt, [rng.randrange(100)], [-rng.random()], "stop", 1.0, 1.0, 0.0, NO_TARGET_LENGTH,
            i, 0, os.urandom(34),
        )
        for i in range(512)
    ]  # fmt: skip
    data = encode_rollouts(make_meta(), rows)
    values = 512 * (2500 + 2)
    assert values / len(data) < VALUES_PER_BYTE / 3, f"{values / len(data):.1f} values a byte"
    assert len(read_rollouts(data, max_bytes=64 << 20).rows) == 512
