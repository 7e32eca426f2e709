"""shardcast/delta.py: a delta turns the base file into the new one byte for byte, is small when few words changed,
and a malformed or foreign delta is refused before it writes anything."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard
from safetensors.torch import save_file

from shardcast.delta import (
    BLOCK_HEAD,
    HEADER,
    LENGTH,
    MAGIC,
    DeltaError,
    _planes,
    _unplanes,
    apply_delta,
    encode_delta,
    word_width,
)


def checkpoint(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_file(tensors, str(path))
    return path


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, float]:
    """A bfloat16 safetensors file and the same after a small update that changes about 1% of its values."""
    generator = torch.Generator().manual_seed(0)
    weights = {"a": torch.randn(300, 257, generator=generator) * 0.02, "b": torch.randn(1000, generator=generator)}
    base = checkpoint(tmp_path / "base.safetensors", {k: v.bfloat16() for k, v in weights.items()})
    moved = {k: (v + 1e-6 * torch.sign(torch.randn(v.shape, generator=generator))) for k, v in weights.items()}
    new = checkpoint(tmp_path / "new.safetensors", {k: v.bfloat16() for k, v in moved.items()})
    before = np.frombuffer(base.read_bytes(), np.uint8)
    changed = float(np.mean(before != np.frombuffer(new.read_bytes(), np.uint8)))
    return base, new, changed


def test_a_delta_rebuilds_the_new_file_byte_for_byte_in_a_fraction_of_its_size(
    tmp_path: Path, pair: tuple[Path, Path, float]
) -> None:
    base, new, changed = pair
    assert 0 < changed < 0.05
    assert word_width(new) == 2  # bfloat16 elements: one changed weight is one changed word
    stats = encode_delta(base, new, tmp_path / "d", block_words=10_000)  # several blocks, the last one short
    assert stats is not None and stats.word == 2 and 0 < stats.changed < stats.words
    assert stats.bytes == (tmp_path / "d").stat().st_size and stats.ratio < 0.1
    apply_delta(base, tmp_path / "d", tmp_path / "out", size=new.stat().st_size)
    assert (tmp_path / "out").read_bytes() == new.read_bytes()
    assert not (tmp_path / "out.partial").exists()


def test_chained_deltas_carry_absolute_values_and_an_unchanged_file_costs_almost_nothing(tmp_path: Path) -> None:
    steps = [
        checkpoint(tmp_path / f"s{i}", {"w": torch.full((4096,), 1.0 + i / 64, dtype=torch.float32)}) for i in range(3)
    ]
    assert word_width(steps[0]) == 4
    held = steps[0]
    for i in (1, 2):
        assert encode_delta(steps[i - 1], steps[i], tmp_path / f"d{i}") is not None
        apply_delta(held, tmp_path / f"d{i}", tmp_path / f"held{i}", size=steps[i].stat().st_size)
        held = tmp_path / f"held{i}"
    assert held.read_bytes() == steps[2].read_bytes()
    same = encode_delta(steps[2], steps[2], tmp_path / "same")
    assert same is not None and same.changed == 0 and same.bytes < 200


def test_files_of_other_sizes_have_no_delta_and_other_files_are_words_of_one_byte(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100)
    (tmp_path / "b").write_bytes(b"x" * 101)
    assert encode_delta(tmp_path / "a", tmp_path / "b", tmp_path / "d") is None and not (tmp_path / "d").exists()
    (tmp_path / "c").write_text('{"config": 1}')
    assert word_width(tmp_path / "c") == 1
    mixed = checkpoint(tmp_path / "m", {"f": torch.zeros(3), "h": torch.zeros(3, dtype=torch.bfloat16)})
    assert word_width(mixed) == 1  # two element widths: bytes, still exact


def _blocks_of(delta: bytes) -> tuple[tuple[bytes, int, int, int, int], list[tuple[int, bytes, bytes]]]:
    head = HEADER.unpack_from(delta)
    at, blocks = HEADER.size, []
    for _ in range(head[4]):
        changed, gaps_len = BLOCK_HEAD.unpack_from(delta, at)
        at += BLOCK_HEAD.size
        gaps = delta[at : at + gaps_len]
        at += gaps_len
        (values_len,) = LENGTH.unpack_from(delta, at)
        at += LENGTH.size
        blocks.append((changed, gaps, delta[at : at + values_len]))
        at += values_len
    return head, blocks


def _pack(head: tuple[bytes, int, int, int, int], blocks: list[tuple[int, bytes, bytes]]) -> bytes:
    body = b"".join(BLOCK_HEAD.pack(c, len(b)) + b + LENGTH.pack(len(v)) + v for c, b, v in blocks)
    return HEADER.pack(*head) + body


def hostile_deltas(delta: bytes) -> dict[str, bytes]:
    head, blocks = _blocks_of(delta)
    magic, word, block_words, size, count = head
    first_changed, first_gaps, first_values = blocks[0]
    raw_gaps = zstandard.ZstdDecompressor().decompress(first_gaps)
    gaps = _unplanes(raw_gaps, np.uint32)
    compress = zstandard.ZstdCompressor().compress
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # 64 MiB of zeros in a few KiB
    return {
        "truncated": delta[: len(delta) // 2],
        "bad magic": b"XXDELTA1" + delta[8:],
        "another size": _pack((magic, word, block_words, size + word, count), blocks),
        "word 3": _pack((magic, 3, block_words, size, count), blocks),
        "block count": _pack((magic, word, block_words, size, count + 1), blocks),
        "more changes than words": _pack(head, [(block_words + 1, first_gaps, first_values), *blocks[1:]]),
        "count off the gaps": _pack(head, [(first_changed + 1, first_gaps, first_values), *blocks[1:]]),
        "a word named twice": _pack(
            head,
            [
                (
                    first_changed,
                    compress(_planes(np.concatenate([gaps[:1], [0], gaps[2:]]).astype(np.uint32))),
                    first_values,
                ),
                *blocks[1:],
            ],
        ),
        "a change past the block": _pack(
            head,
            [
                (
                    first_changed,
                    compress(_planes(np.concatenate([gaps[:-1], [block_words]]).astype(np.uint32))),
                    first_values,
                ),
                *blocks[1:],
            ],
        ),
        "values too short": _pack(head, [(first_changed, first_gaps, first_values[:-3]), *blocks[1:]]),
        "not zstd": _pack(head, [(first_changed, raw_gaps, first_values), *blocks[1:]]),
        "decompression bomb": _pack(head, [(first_changed, first_gaps, bomb), *blocks[1:]]),
        "values too long": _pack(
            head,
            [
                (first_changed, first_gaps, compress(bytes(first_changed * word + 2))),
                *blocks[1:],
            ],
        ),
        "trailing bytes": delta + b"\x00",
    }


REFUSALS = {  # each malformed delta and the check that refuses it
    "truncated": "ends inside",
    "bad magic": "bad magic",
    "another size": "the delta is for",
    "word 3": "out of range",
    "block count": "blocks where",
    "more changes than words": "changed words of",
    "count off the gaps": "where the header makes",
    "a word named twice": "names one word twice",
    "a change past the block": "of the block's",
    "values too short": "where the header makes",
    "values too long": r"\+ bytes where the header makes",
    "not zstd": "not a zstd frame",
    "decompression bomb": "a frame of",
    "trailing bytes": "after the last block",
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_malformed_delta_is_refused_and_leaves_nothing_behind(
    tmp_path: Path, pair: tuple[Path, Path, float], case: str
) -> None:
    base, new, _ = pair
    encode_delta(base, new, tmp_path / "d", block_words=10_000)
    (tmp_path / "bad").write_bytes(hostile_deltas((tmp_path / "d").read_bytes())[case])
    with pytest.raises(DeltaError, match=REFUSALS[case]):
        apply_delta(base, tmp_path / "bad", tmp_path / "out", size=new.stat().st_size)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_delta_for_another_base_size_is_refused_before_reading_it(
    tmp_path: Path, pair: tuple[Path, Path, float]
) -> None:
    base, new, _ = pair
    encode_delta(base, new, tmp_path / "d")
    other = tmp_path / "other"
    other.write_bytes(base.read_bytes() + b"\x00\x00")
    with pytest.raises(DeltaError, match="the base"):
        apply_delta(other, tmp_path / "d", tmp_path / "out", size=new.stat().st_size)
    assert struct.unpack_from("<8s", (tmp_path / "d").read_bytes())[0] == MAGIC
