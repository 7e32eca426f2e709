"""Checkpoint manifests: which files a version holds, and the hashes of each file and of each of its shards.

A file of `size` bytes is cut into `ceil(size / shard_size)` shards; shard i covers `[i * shard_size, ...)` and
only the last one may be shorter (an empty file has no shards). The canonical encoding is JSON with sorted keys,
no whitespace and lower-case hex hashes; `manifest_hash` (sha256 of those bytes) is what the trainer signs as
`Checkpoint(poolId, step, manifestHash)` (DESIGN section 5). `parse_manifest` reads bytes from an untrusted
relay: it checks every key, type, range and shard boundary, and bounds the work before doing it.

Two formats are read. Format 1 gives each file and each shard its sha256 (DESIGN section 9). Format 2, which
`build_manifest` writes, adds each shard's BLAKE3 beside its sha256, and receivers check shards by BLAKE3: every
relay and client must hash every byte before it trusts or serves it, and BLAKE3 does that 3-4x faster than sha256
on one core (docs/shardcast.md, "The shard hash"). Both are 256-bit hashes under the trainer's signature; the
sha256 values stay for any verifier that knows only DESIGN section 9.

Format 3 adds a `delta` section (null when there is none): the step expressed against a base step, for a receiver
that holds the base (docs/shardcast.md, "Delta checkpoints"). It names the base step, the sha256 of the base's
signed manifest, and the files that have a delta; the delta of file T is the file `T.scdelta` (`delta_name`,
`shardcast.delta`'s format), listed in `files` like any other, before the checkpoint's own files, so that a relay
mirrors it first. The checkpoint's files keep their hashes in `files`: what a receiver rebuilds from a delta is
checked against them.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import blake3

from core.safejson import json_too_deep
from shardcast import ManifestError

FORMAT_VERSION = 3  # what build_manifest writes
FORMATS = (1, 2, 3)  # what parse_manifest reads: 1 = sha256 shards, 2 = and BLAKE3 shards, 3 = and a delta section
DELTA_FORMAT = 3  # the first format with a delta section
DELTA_SUFFIX = ".scdelta"  # the delta of checkpoint file T is the file T + DELTA_SUFFIX
# 16 MiB: fewer requests and hash finalisations per byte than 8 MiB (benchmarks/shardcast.py, 512 MiB to 4 clients:
# 2.25 -> 2.11 s), while a client killed mid-download loses at most --parallel shards in flight
DEFAULT_SHARD_SIZE = 16 * 1024 * 1024
MIN_SHARD_SIZE = 1024
MAX_SHARD_SIZE = 1024 * 1024 * 1024
MAX_NAME_BYTES = 255
_HEX = frozenset("0123456789abcdef")
_MAX_DEPTH = 8  # a manifest nests 5 deep; deeper input is refused before json.loads can overflow the C stack


class Hasher(Protocol):
    """What hashlib's and blake3's hash objects share: `update` releases the GIL for long inputs."""

    def update(self, data: bytes | memoryview, /) -> object: ...
    def digest(self) -> bytes: ...


@dataclass(frozen=True)
class ShardInfo:
    index: int
    offset: int
    size: int
    sha256: bytes  # 32 raw bytes; hex on the wire
    blake3: bytes | None = None  # format 2: 32 raw bytes, and the hash receivers check

    @property
    def hash_name(self) -> str:
        return "blake3" if self.blake3 is not None else "sha256"

    @property
    def digest(self) -> bytes:
        """The value a receiver checks this shard's bytes against (`hasher()`'s digest)."""
        return self.blake3 if self.blake3 is not None else self.sha256

    def hasher(self) -> Hasher:
        """A new hash object of the kind `digest` is."""
        return blake3.blake3() if self.blake3 is not None else hashlib.sha256()

    def check(self, data: bytes | memoryview) -> bytes | None:
        """None if `data` is this shard's bytes, else the digest it has instead."""
        h = self.hasher()
        h.update(data)
        actual = h.digest()
        return None if len(data) == self.size and actual == self.digest else actual


@dataclass(frozen=True)
class ManifestFile:
    name: str
    size: int
    sha256: bytes
    shards: tuple[ShardInfo, ...]


def delta_name(target: str) -> str:
    """The name of the file that holds `target`'s delta."""
    return target + DELTA_SUFFIX


@dataclass(frozen=True)
class DeltaInfo:
    """A format-3 manifest's delta section: `targets` (checkpoint files) each have a delta file (`delta_name`) against
    the same file of `base_step`, whose signed manifest hashes (`manifest_hash`) to `base_manifest`."""

    base_step: int
    base_manifest: bytes  # 32 raw bytes; hex on the wire
    targets: tuple[str, ...]  # sorted

    @property
    def names(self) -> tuple[str, ...]:
        """The delta files' names, in the order of `targets`."""
        return tuple(delta_name(t) for t in self.targets)


@dataclass(frozen=True)
class Manifest:
    pool_id: int  # uint256
    step: int  # uint64
    shard_size: int
    files: tuple[ManifestFile, ...]  # in format 3, the delta files first, then the checkpoint's
    format_version: int = FORMAT_VERSION
    delta: DeltaInfo | None = None  # format 3 only

    def file(self, name: str) -> ManifestFile | None:
        return next((f for f in self.files if f.name == name), None)

    @property
    def total_size(self) -> int:
        """Every file's bytes, delta files included: what a relay holds."""
        return sum(f.size for f in self.files)

    @property
    def checkpoint_files(self) -> tuple[ManifestFile, ...]:
        """The checkpoint's own files: all of them but the delta files."""
        deltas = set(self.delta.names) if self.delta is not None else set()
        return tuple(f for f in self.files if f.name not in deltas)

    @property
    def delta_files(self) -> tuple[ManifestFile, ...]:
        names = set(self.delta.names) if self.delta is not None else set()
        return tuple(f for f in self.files if f.name in names)

    @property
    def checkpoint_size(self) -> int:
        """The checkpoint's bytes: what a receiver that fetches it whole downloads."""
        return sum(f.size for f in self.checkpoint_files)

    @property
    def delta_size(self) -> int:
        return sum(f.size for f in self.delta_files)

    def view(self, files: tuple[ManifestFile, ...]) -> Manifest:
        """The same version restricted to `files`, without a delta section: what one partial download assembles (a
        receiver's checkpoint, or the delta files it applies). Never signed; the signed manifest stays the whole."""
        return Manifest(self.pool_id, self.step, self.shard_size, files, self.format_version, None)


def check_name(name: str) -> None:
    """Refuse a file name that could leave the version directory or hide in it (shared by build and parse)."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ManifestError(f"file name {name!r} is empty or longer than {MAX_NAME_BYTES} bytes")
    if name.startswith(".") or ".." in name or "/" in name or "\\" in name or any(ord(c) < 0x20 for c in name):
        raise ManifestError(f"unsafe file name {name!r}")


def _shard_digests(view: memoryview, shard_size: int, new: Callable[[memoryview], Hasher]) -> list[bytes]:
    digests = []
    for offset in range(0, len(view), shard_size):
        with view[offset : offset + shard_size] as piece:
            digests.append(new(piece).digest())
    return digests


def _hash_file(path: Path, name: str, shard_size: int, *, with_blake3: bool) -> ManifestFile:
    """The whole-file sha256, the shards' sha256 and (`with_blake3`) the shards' BLAKE3, in threads over one mapping
    of the file (both libraries let go of the GIL): the origin's publish waits for every pass, and the slowest, a
    sha256 over every byte, sets its time where there are cores for the three."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return ManifestFile(name, 0, hashlib.sha256().digest(), ())
        mapping = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        with mapping, memoryview(mapping) as view, ThreadPoolExecutor(2, thread_name_prefix="file-hash") as pool:
            whole = pool.submit(lambda: hashlib.sha256(view).digest())
            sha256s = pool.submit(_shard_digests, view, shard_size, hashlib.sha256)
            blake3s = _shard_digests(view, shard_size, blake3.blake3) if with_blake3 else None
            digest, shard_sha256s = whole.result(), sha256s.result()
    shards = tuple(
        ShardInfo(
            index,
            index * shard_size,
            min(shard_size, size - index * shard_size),
            sha,
            None if blake3s is None else blake3s[index],  # None: format 1
        )
        for index, sha in enumerate(shard_sha256s)
    )
    return ManifestFile(name, size, digest, shards)


def build_manifest(
    checkpoint_dir: str | os.PathLike[str],
    *,
    pool_id: int,
    step: int,
    shard_size: int = DEFAULT_SHARD_SIZE,
    format_version: int = FORMAT_VERSION,
    delta: DeltaInfo | None = None,
) -> Manifest:
    """Manifest of every regular file directly in `checkpoint_dir`, sorted by name, in `format_version` (1: sha256
    shards only, for a pool whose nodes are not all on format 2 yet; 2: sha256 and BLAKE3 shards; 3: and `delta`,
    whose files the folder holds beside the checkpoint's and which are listed first).

    Requirements: no subdirectories, symlinks or other non-regular entries, and only safe names (`check_name`); in
    format 3, a file named like a delta (`DELTA_SUFFIX`) only as one of `delta`'s.
    """
    if format_version not in FORMATS:
        raise ManifestError(f"format_version must be one of {list(FORMATS)}, got {format_version!r:.80}")
    if delta is not None and format_version < DELTA_FORMAT:
        raise ManifestError(f"format {format_version} has no delta section (format {DELTA_FORMAT} has)")
    _check_int("pool_id", pool_id, 0, 2**256 - 1)
    _check_int("step", step, 0, 2**64 - 1)
    _check_int("shard_size", shard_size, MIN_SHARD_SIZE, MAX_SHARD_SIZE)
    root = Path(checkpoint_dir)
    files: list[ManifestFile] = []
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            check_name(entry.name)
            if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                raise ManifestError(f"{entry.name!r} in {root} is not a regular file (symlink or directory?)")
            files.append(_hash_file(Path(entry.path), entry.name, shard_size, with_blake3=format_version >= 2))
    deltas = set(delta.names) if delta is not None else set()
    files.sort(key=lambda f: (f.name not in deltas, f.name))  # the deltas first: a relay mirrors them first
    manifest = Manifest(pool_id, step, shard_size, tuple(files), format_version, delta)
    if format_version >= DELTA_FORMAT:
        _check_delta(manifest)
    return manifest


def _shard_json(s: ShardInfo) -> dict[str, Any]:
    obj: dict[str, Any] = {"index": s.index, "offset": s.offset, "size": s.size, "sha256": s.sha256.hex()}
    if s.blake3 is not None:
        obj["blake3"] = s.blake3.hex()
    return obj


def _to_json(m: Manifest) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if m.format_version >= DELTA_FORMAT:
        delta["delta"] = None if m.delta is None else {
            "base_step": m.delta.base_step,
            "base_manifest": m.delta.base_manifest.hex(),
            "files": list(m.delta.targets),
        }  # fmt: skip
    return delta | {
        "format_version": m.format_version,
        "pool_id": m.pool_id,
        "step": m.step,
        "shard_size": m.shard_size,
        "files": [
            {"name": f.name, "size": f.size, "sha256": f.sha256.hex(), "shards": [_shard_json(s) for s in f.shards]}
            for f in m.files
        ],
    }


def encode_manifest(m: Manifest) -> bytes:
    """Canonical bytes: sorted keys, no whitespace, ASCII only (non-ASCII names are \\u-escaped).

    Requirements: every shard has a BLAKE3 in format 2 and none in format 1 (`ManifestError`), so that what is
    signed always parses back to the same manifest."""
    with_blake3 = m.format_version >= 2
    if any((s.blake3 is not None) != with_blake3 for f in m.files for s in f.shards):
        raise ManifestError(f"format {m.format_version} needs {'a' if with_blake3 else 'no'} BLAKE3 on every shard")
    if m.delta is not None and m.format_version < DELTA_FORMAT:
        raise ManifestError(f"format {m.format_version} has no delta section")
    return json.dumps(_to_json(m), sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def manifest_hash(m: Manifest) -> bytes:
    """sha256 of the canonical encoding: the `manifestHash` the trainer signs."""
    return hashlib.sha256(encode_manifest(m)).digest()


def _check_int(what: str, value: object, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:  # `type is` refuses bools, which JSON-wise are not ints
        raise ManifestError(f"{what} must be an integer in [{lo}, {hi}], got {value!r:.80}")
    return value


def _check_obj(what: str, value: object, keys: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"{what} must be an object")
    if set(value) != keys:
        raise ManifestError(f"{what} keys must be exactly {sorted(keys)}, got {sorted(value)[:20]}")
    return value


def _check_hex(what: str, value: object) -> bytes:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
        raise ManifestError(f"{what} must be 64 lower-case hex characters, got {value!r:.80}")
    return bytes.fromhex(value)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ManifestError("duplicate key in an object")
    return obj


def _no_constant(name: str) -> None:
    raise ManifestError(f"{name} is not valid JSON")


def _no_float(text: str) -> None:
    raise ManifestError(f"{text:.40} is not an integer; the manifest holds integers only")


def check_json_depth(data: bytes, limit: int) -> None:
    """Refuse JSON nested deeper than `limit` before `json.loads` sees it (core.safejson says why)."""
    if json_too_deep(data, limit):
        raise ManifestError(f"nested deeper than {limit} levels")


def parse_manifest(
    data: bytes, *, max_bytes: int = 1024 * 1024, max_files: int = 1000, max_total_bytes: int = 64 * 1024**3
) -> Manifest:
    """Strictly parse untrusted manifest bytes; any problem raises `ManifestError` with the reason."""
    if len(data) > max_bytes:
        raise ManifestError(f"{len(data)} bytes is over the {max_bytes}-byte limit")
    check_json_depth(data, _MAX_DEPTH)
    try:
        raw = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_no_duplicate_keys,
            parse_constant=_no_constant,
            parse_float=_no_float,
        )
    except ManifestError:
        raise
    except (
        UnicodeDecodeError,
        ValueError,
        RecursionError,
    ) as e:  # JSONDecodeError and int-digit limits are ValueErrors
        raise ManifestError(f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ManifestError("manifest must be an object")
    version = raw.get("format_version")
    if type(version) is not int or version not in FORMATS:
        raise ManifestError(f"format_version must be one of {list(FORMATS)}, got {version!r:.80}")
    keys = {"format_version", "pool_id", "step", "shard_size", "files"}
    top = _check_obj("manifest", raw, keys | {"delta"} if version >= DELTA_FORMAT else keys)
    pool_id = _check_int("pool_id", top["pool_id"], 0, 2**256 - 1)
    step = _check_int("step", top["step"], 0, 2**64 - 1)
    shard_size = _check_int("shard_size", top["shard_size"], MIN_SHARD_SIZE, MAX_SHARD_SIZE)
    raw_files = top["files"]
    if not isinstance(raw_files, list) or len(raw_files) > max_files:
        raise ManifestError(f"files must be a list of at most {max_files} entries")
    files: list[ManifestFile] = []
    names: set[str] = set()
    total = 0
    for i, rf in enumerate(raw_files):
        obj = _check_obj(f"files[{i}]", rf, {"name", "size", "sha256", "shards"})
        name = obj["name"]
        if not isinstance(name, str):
            raise ManifestError(f"files[{i}].name must be a string")
        check_name(name)
        if name in names:
            raise ManifestError(f"duplicate file name {name!r}")
        names.add(name)
        size = _check_int(f"{name}.size", obj["size"], 0, max_total_bytes)
        total += size
        if total > max_total_bytes:
            raise ManifestError(f"total size is over the {max_total_bytes}-byte limit")
        files.append(
            ManifestFile(
                name,
                size,
                _check_hex(f"{name}.sha256", obj["sha256"]),
                _parse_shards(name, obj["shards"], size, shard_size, version),
            )
        )
    delta = _parse_delta(top["delta"], step, max_files) if version >= DELTA_FORMAT else None
    manifest = Manifest(pool_id, step, shard_size, tuple(files), version, delta)
    if version >= DELTA_FORMAT:
        _check_delta(manifest)
    return manifest


def _parse_delta(raw: object, step: int, max_files: int) -> DeltaInfo | None:
    if raw is None:
        return None
    obj = _check_obj("delta", raw, {"base_step", "base_manifest", "files"})
    base_step = _check_int("delta.base_step", obj["base_step"], 0, step - 1) if step else -1
    if base_step < 0:
        raise ManifestError("step 0 has no base step for a delta")
    targets = obj["files"]
    if not isinstance(targets, list) or not targets or len(targets) > max_files:
        raise ManifestError(f"delta.files must be a list of 1 to {max_files} names")
    if not all(isinstance(t, str) for t in targets) or targets != sorted(set(targets)):
        raise ManifestError("delta.files must be distinct names, sorted")
    return DeltaInfo(base_step, _check_hex("delta.base_manifest", obj["base_manifest"]), tuple(targets))


def _check_delta(m: Manifest) -> None:
    """A format-3 manifest's files and delta section agree: every delta names a checkpoint file and has its delta
    file; every file named like a delta is one; the delta files come first. Shared by build and parse."""
    names = [f.name for f in m.files]
    deltas = set(m.delta.names) if m.delta is not None else set()
    for name in names:
        if name.endswith(DELTA_SUFFIX) and name not in deltas:
            raise ManifestError(f"{name!r} is named like a delta but the delta section does not list it")
    if m.delta is None:
        return
    for target in m.delta.targets:
        if target.endswith(DELTA_SUFFIX) or target not in names:
            raise ManifestError(f"delta.files names {target!r:.80}, which is not a checkpoint file of the manifest")
        if delta_name(target) not in names:
            raise ManifestError(f"no delta file {delta_name(target)!r} for {target!r}")
    if any(name not in deltas for name in names[: len(deltas)]):
        raise ManifestError("the delta files must come before the checkpoint's files")


def _parse_shards(name: str, raw: object, size: int, shard_size: int, version: int) -> tuple[ShardInfo, ...]:
    count = -(-size // shard_size)
    if not isinstance(raw, list) or len(raw) != count:
        raise ManifestError(f"{name} must have exactly {count} shards for {size} bytes")
    keys = {"index", "offset", "size", "sha256"} | ({"blake3"} if version >= 2 else set())
    shards: list[ShardInfo] = []
    for i, rs in enumerate(raw):
        what = f"{name}.shards[{i}]"
        obj = _check_obj(what, rs, keys)
        offset = i * shard_size
        want = min(shard_size, size - offset)  # every shard full, only the last one shorter
        _check_int(f"{what}.index", obj["index"], i, i)
        _check_int(f"{what}.offset", obj["offset"], offset, offset)
        _check_int(f"{what}.size", obj["size"], want, want)
        sha256 = _check_hex(f"{what}.sha256", obj["sha256"])
        b3 = _check_hex(f"{what}.blake3", obj["blake3"]) if version >= 2 else None
        shards.append(ShardInfo(i, offset, want, sha256, b3))
    return tuple(shards)
