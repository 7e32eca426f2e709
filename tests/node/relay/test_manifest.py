import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node.relay import ManifestError
from node.relay.manifest import (
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
            assert s.sha256 == hashlib.sha256(data[s.offset : s.offset + s.size]).digest()
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


def test_manifest_hash_is_pinned() -> None:
    """The signed hash must not drift between releases: a change here breaks every stored signature."""
    shard = ShardInfo(0, 0, 3, hashlib.sha256(b"abc").digest())
    m = Manifest(pool_id=1, step=2, shard_size=1024, files=(ManifestFile("a.bin", 3, shard.sha256, (shard,)),))
    digest = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert encode_manifest(m) == (
        b'{"files":[{"name":"a.bin","sha256":"' + digest.encode() + b'","shards":[{"index":0,"offset":0,'
        b'"sha256":"' + digest.encode() + b'","size":3}],"size":3}],"format_version":1,"pool_id":1,'
        b'"shard_size":1024,"step":2}'
    )
    assert manifest_hash(m).hex() == hashlib.sha256(encode_manifest(m)).hexdigest()


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


def _small() -> dict[str, Any]:
    h = hashlib.sha256(b"x").hexdigest()
    shards = [
        {"index": 0, "offset": 0, "size": 1024, "sha256": h},
        {"index": 1, "offset": 1024, "size": 6, "sha256": h},
    ]
    return {
        "format_version": 1,
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
    "format version": _set("format_version", 2),
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
}


def test_parse_accepts_the_valid_base_document() -> None:
    m = parse_manifest(json.dumps(_small()).encode())
    assert [f.name for f in m.files] == ["model.bin", "empty.json"] and m.total_size == 1030


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
