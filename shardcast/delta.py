"""Delta checkpoints: one file of a step as the words that changed since the same file of a base step.

A checkpoint's file is read as words of `word` bytes: the width of its elements (2 for a bfloat16 safetensors file, 4
for float32: `word_width`), so one changed weight is one changed word, and the header's bytes are words like the
rest. The file is cut into blocks of `block_words` words; for each block the delta holds where the words that differ
from the base are and their new values, each compressed with zstd. The values are absolute, not increments: applying
a delta gives the new file's exact bytes, however many deltas were chained before it, and the caller checks those
bytes against the trainer's signed manifest before it loads or serves one of them.

Both arrays are stored byte-plane by byte-plane (all first bytes, then all second bytes, ...), which zstd compresses
far better than interleaved numbers: the high byte of a bfloat16 weight (sign and exponent) repeats, its low byte
(mantissa) does not. Where the changes are is a list of gaps (the first change's index, then each one's distance
from the one before), not a bitmap: at the 2-4% of words one step at a learning rate of 1e-6 changes in bfloat16,
the gaps take about 0.9% of the file's bytes where a bitmap took 1.4% (benchmarks/delta.py).

A delta exists only between files of the same size; another size (another shape, another header) is sent whole.

Layout (integers little-endian):

    magic        8 bytes, b"SCDELTA1"
    word         u8: 1, 2, 4 or 8
    block_words  u32: 1 .. MAX_BLOCK_WORDS
    size         u64: the file's bytes, the base's and the new one's, a multiple of `word`
    blocks       u64: ceil(size / word / block_words)
    then per block, in order:
      changed       u32: words of the block that differ
      gaps_len      u32, then the zstd frame of the gaps: `changed` u32, byte-planed; the first is the index of the
                    first changed word in the block, every later one at least 1, all of them together below its words
      values_len    u32, then the zstd frame of the values: `changed` words, byte-planed, the new words in order

`apply_delta` reads a delta as input from a peer: every length, count and position is checked against what the header
and the base allow before it is used, and no frame may decompress past its exact size.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import zstandard

from shardcast import RelayError

MAGIC = b"SCDELTA1"
HEADER = struct.Struct("<8sBIQQ")  # magic, word, block_words, size, blocks
BLOCK_HEAD = struct.Struct("<II")  # changed, gaps_len
LENGTH = struct.Struct("<I")  # values_len
WORDS: dict[int, type[np.unsignedinteger[Any]]] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
DEFAULT_BLOCK_WORDS = 1 << 22  # 8 MiB of bfloat16 a block: bounded memory whatever the file's size
MAX_BLOCK_WORDS = 1 << 26
DEFAULT_LEVEL = 3  # zstd's default: about 300 MB/s a core here, and most of the ratio of level 19
# safetensors' dtype names and their widths (an unknown one makes the file's word 1 byte: still exact, less compact)
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "BF16": 2, "F16": 2, "I16": 2, "U16": 2,
    "F32": 4, "I32": 4, "U32": 4,
    "F64": 8, "I64": 8, "U64": 8,
}  # fmt: skip
MAX_SAFETENSORS_HEADER = 100 << 20
_T = TypeVar("_T")


@dataclass(frozen=True)
class DeltaPolicy:
    """When an origin publishes a step's delta against the step it holds before it (`ShardStore.publish_dir`).

    Every step is published whole too (each step is a keyframe): a receiver without the base, or one for which a chain
    of deltas is not fewer bytes, fetches it whole, and relays mirror both."""

    min_bytes: int = 64 << 20  # a smaller checkpoint is sent whole: it moves in well under a second on any link
    max_ratio: float = 0.9  # deltas over this share of the checkpoint's bytes are not published
    level: int = DEFAULT_LEVEL

    def __post_init__(self) -> None:
        if self.min_bytes < 0 or not 0 < self.max_ratio <= 1:
            raise ValueError(f"min_bytes must be >= 0 and max_ratio in (0, 1], got {self.min_bytes}, {self.max_ratio}")


class DeltaError(RelayError):
    """A delta that cannot be applied: malformed, for another base, or one whose result is not the file it names."""


@dataclass(frozen=True)
class DeltaStats:
    """What `encode_delta` wrote: `changed` of `words` words differ; the delta is `bytes` long against `size`."""

    size: int
    word: int
    words: int
    changed: int
    bytes: int

    @property
    def changed_fraction(self) -> float:
        return self.changed / self.words if self.words else 0.0

    @property
    def ratio(self) -> float:
        """The delta's bytes over the file's."""
        return self.bytes / self.size if self.size else 0.0


def word_width(path: Path) -> int:
    """The width of the elements of a safetensors file, when all its tensors share one and every tensor starts on a
    multiple of it in the file; 1 for any other file."""
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return 1
            (length,) = struct.unpack("<Q", head)
            if length > MAX_SAFETENSORS_HEADER:
                return 1
            header = json.loads(handle.read(length))
    except (OSError, ValueError, UnicodeDecodeError):
        return 1
    tensors = [t for k, t in header.items() if k != "__metadata__"] if isinstance(header, dict) else []
    if not tensors or not all(isinstance(t, dict) for t in tensors):
        return 1
    widths = {DTYPE_BYTES.get(t.get("dtype"), 1) for t in tensors}
    starts = [o[0] if isinstance(o := t.get("data_offsets"), list) and o else None for t in tensors]
    word = widths.pop() if len(widths) == 1 else 1
    aligned = all(isinstance(o, int) and o % word == 0 for o in starts)
    if not aligned or (8 + length) % word or path.stat().st_size % word:
        return 1
    return word


def _threads(threads: int) -> int:
    return threads if threads > 0 else min(4, os.cpu_count() or 1)


def _in_order(pool: ThreadPoolExecutor, work: Callable[[int], _T], count: int, window: int) -> Iterator[_T]:
    """`work(0)`, `work(1)`, ... run in `pool`, at most `window` at once, their results yielded in order."""
    pending: deque[Future[_T]] = deque()
    try:
        for index in range(count):
            pending.append(pool.submit(work, index))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


def _pread_words(fd: int, offset: int, length: int, kind: type[np.unsignedinteger[Any]], what: str) -> np.ndarray:
    """`length` bytes of a file at `offset` as a new array of `kind` (read straight into it)."""
    words = np.empty(length // np.dtype(kind).itemsize, kind)
    view = words.data.cast("B")
    done = 0
    while done < length:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise DeltaError(f"{what} ended at byte {offset + done} (did it change size?)")
        done += n
    return words


def encode_delta(
    base: Path,
    new: Path,
    out: Path,
    *,
    word: int | None = None,
    block_words: int = DEFAULT_BLOCK_WORDS,
    level: int = DEFAULT_LEVEL,
    threads: int = 0,
) -> DeltaStats | None:
    """Writes the delta that turns `base` into `new` to `out` (atomically, fsynced); None, writing nothing, when the
    two differ in size (send `new` whole). `word`: the element width (default `word_width(new)`). Blocks are
    compared and compressed in `threads` threads (0: up to 4, one a core; numpy and zstd let go of the GIL)."""
    size = new.stat().st_size
    if base.stat().st_size != size:
        return None
    word = word or word_width(new)
    if word not in WORDS or size % word:
        word = 1
    if not 1 <= block_words <= MAX_BLOCK_WORDS:
        raise ValueError(f"block_words must be in [1, {MAX_BLOCK_WORDS}], got {block_words}")
    kind = WORDS[word]
    block_bytes = block_words * word
    blocks = math.ceil(size / block_bytes)
    workers = _threads(threads)
    partial = out.with_name(out.name + ".partial")
    with base.open("rb") as old_file, new.open("rb") as new_file, partial.open("wb") as sink:

        def block(index: int) -> tuple[int, bytes]:
            offset = index * block_bytes
            length = min(block_bytes, size - offset)
            old_words = _pread_words(old_file.fileno(), offset, length, kind, base.name)
            new_words = _pread_words(new_file.fileno(), offset, length, kind, new.name)
            at = np.flatnonzero(old_words != new_words)
            compressor = zstandard.ZstdCompressor(level=level)  # one a call: a compressor is not thread-safe
            gaps = compressor.compress(_planes(np.diff(at, prepend=0).astype(np.uint32)))
            values = compressor.compress(_planes(new_words[at]))
            return len(at), BLOCK_HEAD.pack(len(at), len(gaps)) + gaps + LENGTH.pack(len(values)) + values

        sink.write(HEADER.pack(MAGIC, word, block_words, size, blocks))
        changed_total = 0
        with ThreadPoolExecutor(workers, thread_name_prefix="delta-encode") as pool:
            for changed, data in _in_order(pool, block, blocks, 2 * workers):
                sink.write(data)
                changed_total += changed
        if os.fstat(new_file.fileno()).st_size != size:
            raise DeltaError(f"{new.name} changed size while its delta was made")
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(partial, out)
    return DeltaStats(size, word, size // word, changed_total, out.stat().st_size)


def _planes(values: np.ndarray) -> bytes:
    """`values`' bytes plane by plane: every value's first byte, then every value's second, ..."""
    return np.ascontiguousarray(values.view(np.uint8).reshape(len(values), values.itemsize).T).tobytes()


def _unplanes(data: bytes, kind: type[np.unsignedinteger]) -> np.ndarray:
    """The values `_planes` wrote, as `kind`."""
    width = np.dtype(kind).itemsize
    planes = np.frombuffer(data, np.uint8).reshape(width, len(data) // width)
    return np.ascontiguousarray(planes.T).view(kind).reshape(-1)


def _read(handle: BinaryIO, count: int, what: str) -> bytes:
    data = handle.read(count)
    if len(data) != count:
        raise DeltaError(f"the delta ends inside {what}")
    return data


def _frame(handle: BinaryIO, length: int, exact: int, what: str) -> bytes:
    """The bytes of a zstd frame of `length` bytes that must decompress to exactly `exact` bytes (`_unframe`)."""
    # zstd's worst case for incompressible input is a few bytes per 128 KiB block; a longer frame is not one of ours
    if length > exact + exact // 64 + 1024:
        raise DeltaError(f"{what}: a frame of {length} bytes for {exact} bytes of data")
    return _read(handle, length, what)


def _unframe(frame: bytes, exact: int, what: str) -> bytes:
    """`frame` decompressed: exactly `exact` bytes; never more than `exact` + 1 are produced, whatever size the frame
    claims."""
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(frame)) as reader:
            data = reader.read(exact + 1)
    except zstandard.ZstdError as exc:
        raise DeltaError(f"{what}: not a zstd frame: {exc}") from None
    if len(data) != exact:
        raise DeltaError(f"{what}: {len(data)}{'+' if len(data) > exact else ''} bytes where the header makes {exact}")
    return data


def apply_delta(base: Path, delta: Path, out: Path, *, size: int, threads: int = 0) -> None:
    """Writes `base` with `delta` applied to `out` (through `out.partial`, renamed when whole); `size` is what the
    manifest says the new file holds. Raises DeltaError for a delta that is malformed or made for another size; the
    caller checks the result's hashes against the manifest before anything reads it, and makes it durable (the
    result is not fsynced here). Blocks are rebuilt in `threads` threads (0: up to 4, one a core)."""
    if base.stat().st_size != size:
        raise DeltaError(f"the base {base.name} holds {base.stat().st_size} bytes, the delta is for {size}")
    partial = out.with_name(out.name + ".partial")
    workers = _threads(threads)
    try:
        with delta.open("rb") as source, base.open("rb") as old_file, partial.open("wb") as sink:
            magic, word, block_words, declared, blocks = HEADER.unpack(_read(source, HEADER.size, "the header"))
            if magic != MAGIC:
                raise DeltaError("not a SHARDCAST delta (bad magic)")
            if word not in WORDS or not 1 <= block_words <= MAX_BLOCK_WORDS:
                raise DeltaError(f"word {word} or block_words {block_words} out of range")
            if declared != size or size % word:
                raise DeltaError(f"the delta is for {declared} bytes in words of {word}, the file holds {size}")
            block_bytes = block_words * word
            if blocks != math.ceil(size / block_bytes):
                raise DeltaError(f"{blocks} blocks where {size} bytes make {math.ceil(size / block_bytes)}")
            kind = WORDS[word]
            sink.truncate(size)

            def frames(index: int) -> tuple[int, bytes, bytes]:
                """Block `index`'s change count and frames, read in order from the delta and bounded by the base."""
                words = min(block_bytes, size - index * block_bytes) // word
                changed, gaps_len = BLOCK_HEAD.unpack(_read(source, BLOCK_HEAD.size, f"block {index}"))
                if changed > words:
                    raise DeltaError(f"block {index}: {changed} changed words of {words}")
                gaps = _frame(source, gaps_len, changed * 4, f"block {index}'s gaps")
                (values_len,) = LENGTH.unpack(_read(source, LENGTH.size, f"block {index}"))
                return changed, gaps, _frame(source, values_len, changed * word, f"block {index}'s values")

            def rebuild(index: int, changed: int, gaps_frame: bytes, values_frame: bytes) -> None:
                offset = index * block_bytes
                length = min(block_bytes, size - offset)
                gaps = _unplanes(_unframe(gaps_frame, changed * 4, f"block {index}'s gaps"), np.uint32)
                if changed and (gaps[1:] == 0).any():
                    raise DeltaError(f"block {index}: a gap of 0 names one word twice")
                at = np.cumsum(gaps, dtype=np.uint64)
                if changed and int(at[-1]) >= length // word:
                    raise DeltaError(f"block {index}: a change at word {int(at[-1])} of the block's {length // word}")
                values = _unplanes(_unframe(values_frame, changed * word, f"block {index}'s values"), kind)
                words_now = _pread_words(old_file.fileno(), offset, length, kind, base.name)
                words_now[at.astype(np.int64)] = values
                view = words_now.data.cast("B")
                done = 0
                while done < length:
                    done += os.pwrite(sink.fileno(), view[done:], offset + done)

            pending: deque[Future[None]] = deque()
            with ThreadPoolExecutor(workers, thread_name_prefix="delta-apply") as pool:
                try:
                    for index in range(blocks):
                        pending.append(pool.submit(rebuild, index, *frames(index)))
                        while len(pending) >= 2 * workers:
                            pending.popleft().result()
                    while pending:
                        pending.popleft().result()
                finally:
                    for future in pending:
                        future.cancel()
            if source.read(1):
                raise DeltaError("bytes after the last block")
        os.replace(partial, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
