"""Rollout files, the leaf lists of batches of them, and the verdicts on them, on the wire: `PUT /v1/rollouts/{sha256}`,
`PUT /v1/batches/{root}` (the list itself is `protocol.batches`'s binary format), `POST /v1/attestations`,
`GET /v1/rollouts/{sha256}/attestations`.

`to_json` is what the sender writes, `from_json` what the receiver accepts, field by field (a `ProtocolError`
names the field). A validator's verdict is posted as an `AttestationBody` and kept by the coordinator as an
`AttestationRecord` (the body and the validator that signed the request); the trainer's journal holds the same
records, one JSON line each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from protocol.coordinator import fields as f
from protocol.signing import BatchReceipt, SignatureError, SigningDomain, recover

MAX_ATTESTATIONS_LISTED = 1024  # entries of one file's attestation list a client reads


@dataclass(frozen=True)
class Upload:
    """The coordinator's answer to an upload (201 stored now, 200 held already)."""

    work_key: bytes
    created: bool  # False: the coordinator already held these exact bytes
    receipt: bytes | None = None  # the trainer's signature over UploadReceipt(pool, work key, node); None: none sent

    def to_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"work_key": "0x" + self.work_key.hex(), "created": self.created}
        if self.receipt is not None:
            answer["receipt"] = "0x" + self.receipt.hex()
        return answer

    @classmethod
    def from_json(cls, value: object) -> Upload:
        raw = f.obj("Upload", value)
        return cls(
            f.hex_bytes("Upload", raw, "work_key", 32),
            f.boolean("Upload", raw, "created"),
            f.optional_hex("Upload", raw, "receipt", 65),
        )


@dataclass(frozen=True)
class BatchUpload:
    """The coordinator's answer to a leaf list's upload (201 stored now, 200 held already): the list of `count`
    leaves whose Merkle root is `root`, and every file it names, are held."""

    root: bytes
    count: int
    created: bool  # False: the coordinator already held this list
    receipt: bytes | None = None  # the trainer's signature over BatchReceipt(pool, root, node, count); None: none sent

    def to_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"root": "0x" + self.root.hex(), "count": self.count, "created": self.created}
        if self.receipt is not None:
            answer["receipt"] = "0x" + self.receipt.hex()
        return answer

    @classmethod
    def from_json(cls, value: object) -> BatchUpload:
        raw = f.obj("BatchUpload", value)
        return cls(
            f.hex_bytes("BatchUpload", raw, "root", 32),
            f.uint("BatchUpload", raw, "count", f.UINT32_MAX, minimum=1),  # the ledger keeps a count in 32 bits
            f.boolean("BatchUpload", raw, "created"),
            f.optional_hex("BatchUpload", raw, "receipt", 65),
        )

    def receipt_signer(self, pool_id: int, node: str, domain: SigningDomain) -> str | None:
        """Who signed the receipt as `BatchReceipt(pool_id, root, node, count)`: the pool's trainer, for a receipt
        to keep. None when there is no receipt or it recovers no address."""
        if self.receipt is None:
            return None
        try:
            return recover(BatchReceipt(pool_id, self.root, node, self.count), self.receipt, domain)
        except SignatureError:
            return None


@dataclass(frozen=True)
class AttestationBody:
    """`POST /v1/attestations`: a validator's verdict on `work_key` and its EIP-712 signature over
    `protocol.signing.Attestation(pool, work_key, accepted, reason)`. The 0x of the hex fields may be left out."""

    work_key: bytes
    accepted: bool
    reason: int  # a DESIGN section 5 code
    signature: bytes

    def to_json(self) -> dict[str, Any]:
        return {**_verdict_json(self), "signature": "0x" + self.signature.hex()}

    @classmethod
    def from_json(cls, value: object) -> AttestationBody:
        name, raw = "AttestationBody", f.obj("AttestationBody", value)
        return cls(*_read_verdict(name, raw, prefix=False), f.hex_bytes(name, raw, "signature", 65, prefix=False))


@dataclass(frozen=True)
class AttestationRecord:
    """A verdict the coordinator recorded: the posted body and `validator`, who signed both it and the request."""

    work_key: bytes
    accepted: bool
    reason: int
    validator: str
    signature: bytes

    def to_json(self) -> dict[str, Any]:
        return {**_verdict_json(self), "validator": self.validator, "signature": "0x" + self.signature.hex()}

    @classmethod
    def from_json(cls, value: object) -> AttestationRecord:
        name, raw = "AttestationRecord", f.obj("AttestationRecord", value)
        return cls(
            *_read_verdict(name, raw, prefix=True),
            f.address(name, raw, "validator"),
            f.hex_bytes(name, raw, "signature", 65),
        )


def _verdict_json(verdict: AttestationBody | AttestationRecord) -> dict[str, Any]:
    """The verdict's own fields, as a posted body and a kept record both begin."""
    return {"work_key": "0x" + verdict.work_key.hex(), "accepted": verdict.accepted, "reason": verdict.reason}


def _read_verdict(name: str, raw: Mapping[str, Any], *, prefix: bool) -> tuple[bytes, bool, int]:
    """`_verdict_json` read back; `prefix=False`: the work key's 0x may be left out (a posted body)."""
    return (
        f.hex_bytes(name, raw, "work_key", 32, prefix=prefix),
        f.boolean(name, raw, "accepted"),
        f.uint(name, raw, "reason", f.UINT8_MAX),
    )


@dataclass(frozen=True)
class AttestationList:
    """`GET /v1/rollouts/{sha256}/attestations`: each validator's latest verdict on the file, by address."""

    work_key: bytes
    attestations: tuple[AttestationRecord, ...]

    def to_json(self) -> dict[str, Any]:
        return {"work_key": "0x" + self.work_key.hex(), "attestations": [a.to_json() for a in self.attestations]}

    @classmethod
    def from_json(cls, value: object) -> AttestationList:
        raw = f.obj("AttestationList", value)
        listed = f.items("AttestationList", raw, "attestations", MAX_ATTESTATIONS_LISTED)
        return cls(
            f.hex_bytes("AttestationList", raw, "work_key", 32),
            tuple(AttestationRecord.from_json(entry) for entry in listed),
        )


@dataclass(frozen=True)
class Recorded:
    """The answer to a posted attestation (201)."""

    recorded: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"recorded": self.recorded}

    @classmethod
    def from_json(cls, value: object) -> Recorded:
        return cls(f.boolean("Recorded", f.obj("Recorded", value), "recorded"))


@dataclass(frozen=True)
class Verdict:
    """A validator's attestation on a file, its signature checked by the client that read it."""

    validator: str
    accepted: bool
    reason: int
