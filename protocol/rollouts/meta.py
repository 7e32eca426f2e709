"""The rollout file's metadata: who generated it, for which pool, with which checkpoint, sampling and task.

Stored as UTF-8 JSON (sorted keys, no spaces) under the Parquet key-value key b"prime". Hashes are
"0x" + 64 lowercase hex digits; the node address is EIP-55 checksummed. Unknown or missing keys are an
error: a new field means a new `format_version`. This node writes FORMAT_VERSION and reads every version of
READABLE_VERSIONS, each with its own exact keys (a file keeps the version it was written in: its bytes are its
work key).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from eth_utils import is_checksum_address

from core.safejson import json_too_deep
from protocol.rollouts.schema import FormatProblem, RolloutFormatError

METADATA_KEY = b"prime"
FORMAT_VERSION = 3  # 2: the coordinator's assignment signature (issue 19); 3: the assignment's issue time (issue 32)
READABLE_VERSIONS = (2, 3)
TIMED_VERSION = 3  # the first version whose assignment carries its issue time
SIGNATURE_BYTES = 65
HASH_BYTES = 32
MAX_CREATED_BY = 200
MAX_META_BYTES = 4096  # the real document is about 400 bytes
MAX_DEPTH = 4  # it nests 2 deep


def _created_by() -> str:
    try:
        return f"prime-node {version('prime-node')}"
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "prime-node 0+unknown"


def _bad(detail: str) -> RolloutFormatError:
    return RolloutFormatError(FormatProblem.METADATA, detail)


def _unsupported(version: object) -> RolloutFormatError:
    return _bad(
        f"format_version {version!r} is not supported (this node reads {', '.join(map(str, READABLE_VERSIONS))})"
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(float(value))  # type: ignore[arg-type]


@dataclass(frozen=True)
class SamplingMeta:
    """The sampling the worker claims; the validator re-checks every token against it."""

    temperature: float  # 0 means greedy
    top_p: float  # in (0, 1]
    max_tokens: int  # >= 1

    def __post_init__(self) -> None:
        if not (_is_number(self.temperature) and self.temperature >= 0):
            raise _bad(f"sampling.temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise _bad(f"sampling.top_p must be in (0, 1], got {self.top_p!r}")
        if not (_is_int(self.max_tokens) and self.max_tokens >= 1):
            raise _bad(f"sampling.max_tokens must be an integer >= 1, got {self.max_tokens!r}")


@dataclass(frozen=True)
class RolloutMeta:
    """File-level facts every row shares. Hashes are 32 raw bytes here and hex in the file."""

    pool_id: int
    node: str  # EIP-55 checksummed address of the node that generated and submits the file
    manifest_hash: bytes  # the signed checkpoint manifest the weights came from
    sampling: SamplingMeta
    task_spec_hash: bytes
    model_hash: bytes  # engine.model.loading's hash of the weights used
    counter: int  # the assignment counter: with (pool, node, step) it fixes which problems the file must answer
    # the trainer's EIP-712 `Assignment` signature over (pool, node, step, counter, shape, task, issue time): proof
    # the work was handed out; None in a file nobody assigned (a validator of a pool refuses it)
    assignment_signature: bytes | None = None
    # the issue time that signature covers (unix seconds, the trainer's clock): present exactly when the signature is,
    # from format 3 on; None in format 2, whose signatures cover no time (`protocol.signing.UntimedAssignment`)
    assignment_issued_at: int | None = None
    created_by: str = field(default_factory=_created_by)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if not (_is_int(self.format_version) and self.format_version in READABLE_VERSIONS):
            raise _unsupported(self.format_version)
        if not (_is_int(self.pool_id) and 0 <= self.pool_id < 2**256):
            raise _bad(f"pool_id must be a uint256, got {self.pool_id!r}")
        if not (isinstance(self.node, str) and is_checksum_address(self.node)):
            raise _bad(f"node must be an EIP-55 checksummed address, got {self.node!r}")
        for name in ("manifest_hash", "task_spec_hash", "model_hash"):
            value = getattr(self, name)
            if not (isinstance(value, bytes) and len(value) == HASH_BYTES):
                raise _bad(f"{name} must be {HASH_BYTES} bytes, got {value!r}")
        if not (_is_int(self.counter) and 0 <= self.counter < 2**64):
            raise _bad(f"counter must be a uint64, got {self.counter!r}")
        signature = self.assignment_signature
        if signature is not None and not (isinstance(signature, bytes) and len(signature) == SIGNATURE_BYTES):
            raise _bad(f"assignment_signature must be {SIGNATURE_BYTES} bytes or absent, got {signature!r}")
        issued_at = self.assignment_issued_at
        if self.format_version < TIMED_VERSION:
            if issued_at is not None:
                raise _bad(f"format {self.format_version} carries no assignment_issued_at, got {issued_at!r}")
        elif (issued_at is None) != (signature is None):
            raise _bad("assignment_issued_at and assignment_signature go together: both present or both null")
        elif issued_at is not None and not (_is_int(issued_at) and 0 <= issued_at < 2**64):
            raise _bad(f"assignment_issued_at must be a uint64 (unix seconds), got {issued_at!r}")
        if not isinstance(self.sampling, SamplingMeta):
            raise _bad(f"sampling must be a SamplingMeta, got {type(self.sampling).__name__}")
        if not (isinstance(self.created_by, str) and 0 < len(self.created_by) <= MAX_CREATED_BY):
            raise _bad(f"created_by must be a string of 1 to {MAX_CREATED_BY} characters")


def encode_meta(meta: RolloutMeta) -> bytes:
    """Canonical JSON: the same meta always gives the same bytes (files are deterministic)."""
    document = {
        "format_version": meta.format_version,
        "pool_id": meta.pool_id,
        "node": meta.node,
        "manifest_hash": "0x" + meta.manifest_hash.hex(),
        "sampling": {
            "temperature": float(meta.sampling.temperature),
            "top_p": float(meta.sampling.top_p),
            "max_tokens": meta.sampling.max_tokens,
        },
        "task_spec_hash": "0x" + meta.task_spec_hash.hex(),
        "model_hash": "0x" + meta.model_hash.hex(),
        "counter": meta.counter,
        "assignment_signature": None if meta.assignment_signature is None else "0x" + meta.assignment_signature.hex(),
        "created_by": meta.created_by,
    }
    if meta.format_version >= TIMED_VERSION:
        document["assignment_issued_at"] = meta.assignment_issued_at
    return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


_V2_KEYS = {
    "format_version",
    "pool_id",
    "node",
    "manifest_hash",
    "sampling",
    "task_spec_hash",
    "model_hash",
    "counter",
    "assignment_signature",
    "created_by",
}
_META_KEYS = {2: _V2_KEYS, 3: _V2_KEYS | {"assignment_issued_at"}}  # the exact keys of each readable version
_SAMPLING_KEYS = {"temperature", "top_p", "max_tokens"}


def _exact_keys(document: Any, keys: set[str], where: str) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise _bad(f"{where} must be a JSON object, got {type(document).__name__}")
    if set(document) != keys:
        missing, extra = sorted(keys - set(document)), sorted(set(document) - keys)
        raise _bad(f"{where} keys differ: missing {missing}, unexpected {extra}")
    return document


def _parse_hash(value: Any, name: str) -> bytes:
    if not (isinstance(value, str) and len(value) == 2 + 2 * HASH_BYTES and value.startswith("0x")):
        raise _bad(f"{name} must be 0x and {2 * HASH_BYTES} hex digits, got {str(value)[:80]!r}")
    digits = value[2:]
    if digits != digits.lower() or any(c not in "0123456789abcdef" for c in digits):
        raise _bad(f"{name} must be lowercase hex, got {value!r}")
    return bytes.fromhex(digits)


def _parse_signature(value: Any) -> bytes | None:
    if value is None:
        return None
    if not (isinstance(value, str) and len(value) == 2 + 2 * SIGNATURE_BYTES and value.startswith("0x")):
        raise _bad(
            f"assignment_signature must be null or 0x and {2 * SIGNATURE_BYTES} hex digits, got {str(value)[:80]!r}"
        )
    digits = value[2:]
    if digits != digits.lower() or any(c not in "0123456789abcdef" for c in digits):
        raise _bad(f"assignment_signature must be lowercase hex, got {value[:80]!r}")
    return bytes.fromhex(digits)


def parse_meta(raw: bytes | None) -> RolloutMeta:
    """The metadata of a file from a stranger; anything but the exact layout raises RolloutFormatError."""
    if raw is None:
        raise _bad(f"the file has no {METADATA_KEY!r} metadata")
    if len(raw) > MAX_META_BYTES:
        raise _bad(f"{METADATA_KEY!r} metadata is {len(raw)} bytes, at most {MAX_META_BYTES}")
    if json_too_deep(raw, MAX_DEPTH):  # deep nesting would crash json.loads (core.safejson)
        raise _bad(f"{METADATA_KEY!r} metadata nests deeper than its format")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(f"{METADATA_KEY!r} metadata is not UTF-8 JSON: {exc}") from exc
    # each version has its own keys; a document without one is checked against this node's (and named missing)
    version = document.get("format_version", FORMAT_VERSION) if isinstance(document, dict) else FORMAT_VERSION
    if not (_is_int(version) and version in _META_KEYS):
        raise _unsupported(version)
    top = _exact_keys(document, _META_KEYS[version], "metadata")
    sampling = _exact_keys(top["sampling"], _SAMPLING_KEYS, "metadata.sampling")
    for name in ("temperature", "top_p"):
        if not _is_number(sampling[name]):
            raise _bad(f"sampling.{name} must be a finite number, got {sampling[name]!r}")
    return RolloutMeta(
        pool_id=top["pool_id"],
        node=top["node"],
        manifest_hash=_parse_hash(top["manifest_hash"], "manifest_hash"),
        sampling=SamplingMeta(
            temperature=float(sampling["temperature"]),
            top_p=float(sampling["top_p"]),
            max_tokens=sampling["max_tokens"],
        ),
        task_spec_hash=_parse_hash(top["task_spec_hash"], "task_spec_hash"),
        model_hash=_parse_hash(top["model_hash"], "model_hash"),
        counter=top["counter"],
        assignment_signature=_parse_signature(top["assignment_signature"]),
        assignment_issued_at=top.get("assignment_issued_at"),
        created_by=top["created_by"],
        format_version=top["format_version"],
    )
