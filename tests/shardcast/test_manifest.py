import dataclasses
import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import pytest

from shardcast import ManifestError
from shardcast.manifest import (
    DeltaInfo,
    Manifest,
    ManifestFile,
    ShardInfo,
    build_manifest,
    encode_manifest,
    manifest_hash,
    parse_manifest,
)

KIB = 1024
SHARD = 64 * KIB


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    rng = random.Random(0)
    (d / "model.safetensors").write_bytes(rng.randbytes(3 * 1024 * KIB + 123))
    (d / "config.json").write_bytes(b'{"hidden_size": 64}')
    (d / "exact.bin").write_bytes(rng.randbytes(2 * SHARD))
    (d / "empty.bin").write_bytes(b"")
    return d


def test_build_manifest_hashes_every_shard_and_file(ckpt: Path) -> None:
    m = build_manifest(ckpt, pool_id=7, step=3, shard_size=SHARD)
    assert [f.name for f in m.files] == ["config.json", "empty.bin", "exact.bin", "model.safetensors"]
    for f in m.files:
        data = (ckpt / f.name).read_bytes()
        assert f.size == len(data) and f.sha256 == hashlib.sha256(data).digest()
        assert len(f.shards) == -(-len(data) // SHARD)
        for i, s in enumerate(f.shards):
            assert (s.index, s.offset) == (i, i * SHARD)
            piece = data[s.offset : s.offset + s.size]
            assert s.sha256 == hashlib.sha256(piece).digest() and s.blake3 == blake3.blake3(piece).digest()
            assert s.digest == s.blake3 and s.check(piece) is None
            assert s.check(piece[:-1] + bytes([piece[-1] ^ 1])) is not None and s.check(piece[:-1]) is not None
    assert m.format_version == 3 and m.delta is None and m.checkpoint_files == m.files
    sizes = {f.name: [s.size for s in f.shards] for f in m.files}
    assert sizes["empty.bin"] == [] and sizes["exact.bin"] == [SHARD, SHARD]
    assert sizes["model.safetensors"][-1] == 123 and len(sizes["model.safetensors"]) == 49


def test_manifest_encoding_is_canonical_and_round_trips(ckpt: Path) -> None:
    m = build_manifest(ckpt, pool_id=2**200, step=2**64 - 1, shard_size=SHARD)
    data = encode_manifest(m)
    assert data == encode_manifest(build_manifest(ckpt, pool_id=2**200, step=2**64 - 1, shard_size=SHARD))
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
    assert manifest_hash(m) == hashlib.sha256(data).digest()
    assert parse_manifest(data) == m


ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
ABC_BLAKE3 = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"  # the BLAKE3 test vector for b"abc"


def test_manifest_hash_is_pinned() -> None:
    """The signed hash must not drift between releases: a change here breaks every stored signature."""
    shard = ShardInfo(0, 0, 3, bytes.fromhex(ABC_SHA256))
    m = Manifest(1, 2, 1024, (ManifestFile("a.bin", 3, shard.sha256, (shard,)),), format_version=1)
    assert encode_manifest(m) == (
        b'{"files":[{"name":"a.bin","sha256":"' + ABC_SHA256.encode() + b'","shards":[{"index":0,"offset":0,'
        b'"sha256":"' + ABC_SHA256.encode() + b'","size":3}],"size":3}],"format_version":1,"pool_id":1,'
        b'"shard_size":1024,"step":2}'
    )
    assert manifest_hash(m).hex() == hashlib.sha256(encode_manifest(m)).hexdigest()


def test_format_2_is_pinned_and_its_shard_hash_is_blake3() -> None:
    """Format 2 adds each shard's BLAKE3 (the standard test vector for b"abc") beside its sha256, keys sorted."""
    shard = ShardInfo(0, 0, 3, bytes.fromhex(ABC_SHA256), bytes.fromhex(ABC_BLAKE3))
    m = Manifest(1, 2, 1024, (ManifestFile("a.bin", 3, shard.sha256, (shard,)),), format_version=2)
    assert encode_manifest(m) == (
        b'{"files":[{"name":"a.bin","sha256":"'
        + ABC_SHA256.encode()
        + b'","shards":[{"blake3":"'
        + ABC_BLAKE3.encode()
        + b'","index":0,"offset":0,"sha256":"'
        + ABC_SHA256.encode()
        + b'","size":3}],'
        b'"size":3}],"format_version":2,"pool_id":1,"shard_size":1024,"step":2}'
    )
    assert parse_manifest(encode_manifest(m)) == m
    assert shard.hash_name == "blake3" and shard.check(b"abc") is None
    assert shard.check(b"abd") == blake3.blake3(b"abd").digest()
    sha_only = ShardInfo(0, 0, 3, bytes.fromhex(ABC_SHA256))
    assert sha_only.hash_name == "sha256" and sha_only.check(b"abc") is None


@pytest.mark.parametrize("version", [1, 2])
def test_encode_refuses_a_manifest_whose_shards_do_not_match_its_format(version: int) -> None:
    """What is signed must parse back to the same manifest: format 2 needs every shard's BLAKE3, format 1 none."""
    blake = None if version == 2 else bytes.fromhex(ABC_BLAKE3)
    shard = ShardInfo(0, 0, 3, bytes.fromhex(ABC_SHA256), blake)
    m = Manifest(1, 2, 1024, (ManifestFile("a.bin", 3, shard.sha256, (shard,)),), format_version=version)
    with pytest.raises(ManifestError, match="BLAKE3"):
        encode_manifest(m)


def test_one_changed_byte_changes_the_manifest_hash(ckpt: Path) -> None:
    before = manifest_hash(build_manifest(ckpt, pool_id=1, step=1, shard_size=SHARD))
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[SHARD * 10] ^= 1
    path.write_bytes(bytes(data))
    assert manifest_hash(build_manifest(ckpt, pool_id=1, step=1, shard_size=SHARD)) != before


@pytest.mark.parametrize("name", [".hidden", "sub"])
def test_build_refuses_hidden_files_and_subdirectories(ckpt: Path, name: str) -> None:
    if name == "sub":
        (ckpt / name).mkdir()
    else:
        (ckpt / name).write_bytes(b"x")
    with pytest.raises(ManifestError):
        build_manifest(ckpt, pool_id=1, step=1, shard_size=SHARD)


def test_build_refuses_symlinks(ckpt: Path) -> None:
    os.symlink(ckpt / "config.json", ckpt / "link.json")
    with pytest.raises(ManifestError, match="not a regular file"):
        build_manifest(ckpt, pool_id=1, step=1, shard_size=SHARD)


def test_build_refuses_bad_shard_size(ckpt: Path) -> None:
    with pytest.raises(ManifestError, match="shard_size"):
        build_manifest(ckpt, pool_id=1, step=1, shard_size=0)


def test_build_writes_format_1_on_request_with_the_same_sha256s_and_no_blake3(ckpt: Path) -> None:
    """A pool with nodes that read only format 1 keeps its origin on format 1 until they have upgraded."""
    new = build_manifest(ckpt, pool_id=7, step=3, shard_size=SHARD)
    old = build_manifest(ckpt, pool_id=7, step=3, shard_size=SHARD, format_version=1)
    assert old.format_version == 1
    assert all(s.blake3 is None and s.digest == s.sha256 for f in old.files for s in f.shards)
    assert [(f.sha256, [s.sha256 for s in f.shards]) for f in old.files] == [
        (f.sha256, [s.sha256 for s in f.shards]) for f in new.files
    ]
    assert b"blake3" not in encode_manifest(old) and parse_manifest(encode_manifest(old)) == old
    with pytest.raises(ManifestError, match="format_version must be one of"):
        build_manifest(ckpt, pool_id=7, step=3, shard_size=SHARD, format_version=4)


def _small(version: int = 2) -> dict[str, Any]:
    h = hashlib.sha256(b"x").hexdigest()
    b = blake3.blake3(b"x").hexdigest()
    shards: list[dict[str, Any]] = [
        {"index": 0, "offset": 0, "size": 1024, "sha256": h},
        {"index": 1, "offset": 1024, "size": 6, "sha256": h},
    ]
    if version >= 2:
        for shard in shards:
            shard["blake3"] = b
    return ({"delta": None} if version >= 3 else {}) | {
        "format_version": version,
        "pool_id": 1,
        "step": 5,
        "shard_size": 1024,
        "files": [
            {"name": "model.bin", "size": 1030, "sha256": h, "shards": shards},
            {"name": "empty.json", "size": 0, "sha256": h, "shards": []},
        ],
    }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(last) if last.isdigit() else last] = value

    return mutate


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        del doc[key]

    return mutate


def _dup_file(doc: dict[str, Any]) -> None:
    doc["files"][1]["name"] = "model.bin"


def _drop_last_shard(doc: dict[str, Any]) -> None:
    doc["files"][0]["shards"].pop()


def _extra_shard(doc: dict[str, Any]) -> None:
    doc["files"][0]["shards"].append(dict(doc["files"][0]["shards"][1], index=2, offset=1030))


def _swap_shards(doc: dict[str, Any]) -> None:
    doc["files"][0]["shards"].reverse()


BAD_DOCS = {
    "missing key": _drop("step"),
    "extra key": _set("signature", "00"),
    "format version 3 without its delta key": _set("format_version", 3),
    "format version 4": _set("format_version", 4),
    "format version 0": _set("format_version", 0),
    "format version as a string": _set("format_version", "2"),
    "format 1 beside blake3 shards": _set("format_version", 1),
    "negative pool": _set("pool_id", -1),
    "pool over uint256": _set("pool_id", 2**256),
    "step over uint64": _set("step", 2**64),
    "bool step": _set("step", True),
    "string step": _set("step", "5"),
    "null step": _set("step", None),
    "tiny shard size": _set("shard_size", 1),
    "huge shard size": _set("shard_size", 2**40),
    "files not a list": _set("files", {}),
    "file not an object": _set("files.0", "model.bin"),
    "file extra key": _set("files.0.mode", 420),
    "name with slash": _set("files.0.name", "a/b"),
    "name with dotdot": _set("files.0.name", "a..b"),
    "parent name": _set("files.0.name", ".."),
    "hidden name": _set("files.0.name", ".env"),
    "name with nul": _set("files.0.name", "a\x00b"),
    "name with backslash": _set("files.0.name", "a\\b"),
    "empty name": _set("files.0.name", ""),
    "long name": _set("files.0.name", "a" * 256),
    "name not a string": _set("files.0.name", 5),
    "duplicate names": _dup_file,
    "negative size": _set("files.0.size", -1),
    "upper-case hash": _set("files.0.sha256", hashlib.sha256(b"x").hexdigest().upper()),
    "short hash": _set("files.0.sha256", "ab"),
    "non-hex hash": _set("files.0.sha256", "zz" * 32),
    "missing shard": _drop_last_shard,
    "extra shard": _extra_shard,
    "shards out of order": _swap_shards,
    "empty file with a shard": _set("files.1.shards", [{"index": 0, "offset": 0, "size": 1, "sha256": "00" * 32}]),
    "wrong index": _set("files.0.shards.1.index", 2),
    "overlapping offset": _set("files.0.shards.1.offset", 1000),
    "short middle shard": _set("files.0.shards.0.size", 1000),
    "last shard too long": _set("files.0.shards.1.size", 7),
    "shard extra key": _set("files.0.shards.0.crc", 0),
    "shard hash not a string": _set("files.0.shards.0.sha256", None),
    "shard blake3 missing": lambda doc: doc["files"][0]["shards"][1].pop("blake3"),
    "shard blake3 short": _set("files.0.shards.0.blake3", "ab"),
    "shard blake3 upper-case": _set("files.0.shards.0.blake3", blake3.blake3(b"x").hexdigest().upper()),
    "shard blake3 not a string": _set("files.0.shards.0.blake3", 7),
}


@pytest.mark.parametrize("version", [1, 2, 3])
def test_parse_accepts_the_valid_base_document_of_each_format(version: int) -> None:
    m = parse_manifest(json.dumps(_small(version)).encode())
    assert [f.name for f in m.files] == ["model.bin", "empty.json"] and m.total_size == 1030
    assert m.format_version == version
    assert {s.hash_name for s in m.files[0].shards} == {"blake3" if version >= 2 else "sha256"}
    assert parse_manifest(encode_manifest(m)) == m


def test_a_format_1_document_with_blake3_shards_is_refused() -> None:
    doc = _small(1)
    doc["files"][0]["shards"][0]["blake3"] = blake3.blake3(b"x").hexdigest()
    with pytest.raises(ManifestError, match="keys"):
        parse_manifest(json.dumps(doc).encode())


@pytest.mark.parametrize("mutate", BAD_DOCS.values(), ids=BAD_DOCS.keys())
def test_parse_rejects_malformed_manifest(mutate: Callable[[dict[str, Any]], None]) -> None:
    doc = _small()
    mutate(doc)
    with pytest.raises(ManifestError):
        parse_manifest(json.dumps(doc).encode())


BAD_BYTES = {
    "not json": b"{",
    "not utf-8": b'{"step": "\xff"}',
    "top-level list": b"[]",
    "NaN": json.dumps(_small()).replace('"step": 5', '"step": NaN').encode(),
    "float": json.dumps(_small()).replace('"step": 5', '"step": 5.0').encode(),
    "duplicate key": json.dumps(_small()).replace('"step": 5', '"step": 5, "step": 6').encode(),
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "huge integer": json.dumps(_small()).replace('"step": 5', '"step": ' + "9" * 5000).encode(),
}


@pytest.mark.parametrize("data", BAD_BYTES.values(), ids=BAD_BYTES.keys())
def test_parse_rejects_malformed_bytes(data: bytes) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(data)


def test_parse_enforces_limits() -> None:
    data = json.dumps(_small()).encode()
    with pytest.raises(ManifestError, match="limit"):
        parse_manifest(data, max_bytes=len(data) - 1)
    with pytest.raises(ManifestError, match="at most 1"):
        parse_manifest(data, max_files=1)
    with pytest.raises(ManifestError):
        parse_manifest(data, max_total_bytes=1029)
    parse_manifest(data, max_bytes=len(data), max_files=2, max_total_bytes=1030)


def test_parse_error_carries_the_reason() -> None:
    doc = _small()
    doc["files"][0]["name"] = "../etc/passwd"
    with pytest.raises(ManifestError) as e:
        parse_manifest(json.dumps(doc).encode())
    assert "../etc/passwd" in e.value.reason


def _with_delta() -> dict[str, Any]:
    """A valid format-3 document of step 5: model.bin has a delta (model.bin.scdelta, listed first) against step 4."""
    doc = _small(3)
    h, b = hashlib.sha256(b"x").hexdigest(), blake3.blake3(b"x").hexdigest()
    shard = {"index": 0, "offset": 0, "size": 10, "sha256": h, "blake3": b}
    doc["files"].insert(0, {"name": "model.bin.scdelta", "size": 10, "sha256": h, "shards": [shard]})
    doc["delta"] = {"base_step": 4, "base_manifest": h, "files": ["model.bin"]}
    return doc


def test_a_format_3_delta_section_parses_and_names_its_files() -> None:
    m = parse_manifest(json.dumps(_with_delta()).encode())
    assert m.delta == DeltaInfo(4, hashlib.sha256(b"x").digest(), ("model.bin",))
    assert [f.name for f in m.delta_files] == ["model.bin.scdelta"] and m.delta_size == 10
    assert [f.name for f in m.checkpoint_files] == ["model.bin", "empty.json"] and m.checkpoint_size == 1030
    assert parse_manifest(encode_manifest(m)) == m
    view = m.view(m.checkpoint_files)
    assert view.delta is None and view.files == m.checkpoint_files and view.step == m.step


def _reorder(doc: dict[str, Any]) -> None:
    doc["files"].append(doc["files"].pop(0))


BAD_DELTAS: dict[str, Callable[[dict[str, Any]], None]] = {
    "in format 2": lambda doc: doc.update(format_version=2),
    "base step not before the step": _set("delta.base_step", 5),
    "negative base step": _set("delta.base_step", -1),
    "base manifest short": _set("delta.base_manifest", "ab"),
    "no files": _set("delta.files", []),
    "files not a list": _set("delta.files", "model.bin"),
    "a file twice": _set("delta.files", ["model.bin", "model.bin"]),
    "a file that is not one": _set("delta.files", ["absent.bin"]),
    "a delta of a delta": _set("delta.files", ["model.bin.scdelta"]),
    "a target without its delta file": _set("delta.files", ["empty.json"]),
    "a delta file after the checkpoint's": _reorder,
    "an extra key": _set("delta.extra", 1),
    "a delta file no section names": _set("delta", None),
    "not an object": _set("delta", [4]),
}


@pytest.mark.parametrize("mutate", BAD_DELTAS.values(), ids=BAD_DELTAS.keys())
def test_parse_rejects_a_malformed_delta_section(mutate: Callable[[dict[str, Any]], None]) -> None:
    doc = _with_delta()
    mutate(doc)
    with pytest.raises(ManifestError):
        parse_manifest(json.dumps(doc).encode())


def test_build_refuses_a_delta_in_a_format_without_one_and_encode_never_signs_one(ckpt: Path) -> None:
    info = DeltaInfo(1, bytes(32), ("model.safetensors",))
    with pytest.raises(ManifestError, match="no delta section"):
        build_manifest(ckpt, pool_id=7, step=3, shard_size=SHARD, format_version=2, delta=info)
    m = build_manifest(ckpt, pool_id=7, step=3, shard_size=SHARD, format_version=2)
    with pytest.raises(ManifestError, match="no delta section"):
        encode_manifest(dataclasses.replace(m, delta=info))
    with pytest.raises(ManifestError, match="no delta file"):  # the folder holds no model.safetensors.scdelta
        build_manifest(ckpt, pool_id=7, step=3, shard_size=SHARD, delta=info)
