"""Gossip messages: per-pool topics, the signed message types, and their canonical JSON encoding.

Topics, one set per pool:

    /prime/<pool_id>/checkpoints    Checkpoint(poolId, step, manifestHash), signed by the pool's trainer
    /prime/<pool_id>/relays         RelayAdvert(poolId, url, throughputKBps, timestamp), signed by the relay
    /prime/<pool_id>/attestations   Attestation(poolId, workKey, accepted, reason), signed by a validator
    /prime/<pool_id>/validators     ValidatorHeartbeat(poolId, timestamp, nextBlock, backlog), signed by a validator

A message is one JSON object: `type`, the typed message's fields under their Python names, and `signature`,
the sender's 65-byte EIP-712 signature (protocol/signing.py) of those fields. Integers are JSON numbers, byte
strings `0x` + lower-case hex, and the encoding is canonical (sorted keys, no whitespace, ASCII), so
`decode` refuses any other spelling of the same message: one message, one byte string.

`RelayAdvert` and `ValidatorHeartbeat` are defined here rather than in protocol/signing.py because only gossip uses
them; they are `TypedMessage`s all the same, so they are signed under the PrimeNode domain like the others.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from eth_account.signers.local import LocalAccount

from core.safejson import json_too_deep
from p2p.errors import MessageError
from protocol.signing import (
    SIGNATURE_LENGTH,
    Attestation,
    Checkpoint,
    SignatureError,
    SigningDomain,
    TypedMessage,
    recover,
    sign,
)

MAX_URL_LENGTH = 2048
MAX_JSON_DEPTH = 4  # a message is one flat object; the margin only makes the error message clearer
_TOPIC = re.compile(r"/prime/(0|[1-9][0-9]{0,77})/([a-z]+)")
_HEX_BYTES = re.compile(r"0x(?:[0-9a-f]{2})*")
_UINT = re.compile(r"uint([0-9]+)")
_BYTES = re.compile(r"bytes([0-9]+)")


class TopicKind(StrEnum):
    CHECKPOINTS = "checkpoints"
    RELAYS = "relays"
    ATTESTATIONS = "attestations"
    VALIDATORS = "validators"


@dataclass(frozen=True)
class Topic:
    """One pool's gossip topic of one kind; `str(topic)` is its libp2p name."""

    pool_id: int
    kind: TopicKind

    def __str__(self) -> str:
        return f"/prime/{self.pool_id}/{self.kind.value}"

    @classmethod
    def parse(cls, name: str) -> Topic:
        match = _TOPIC.fullmatch(name)
        if match is None or match.group(2) not in TopicKind.__members__.values():
            raise MessageError("not a prime topic: expected /prime/<pool_id>/<kind>", topic=name)
        pool_id = int(match.group(1))
        if pool_id >= 2**256:
            raise MessageError("pool id out of range", topic=name)
        return cls(pool_id, TopicKind(match.group(2)))


def checkpoints_topic(pool_id: int) -> str:
    return str(Topic(pool_id, TopicKind.CHECKPOINTS))


def relays_topic(pool_id: int) -> str:
    return str(Topic(pool_id, TopicKind.RELAYS))


def attestations_topic(pool_id: int) -> str:
    return str(Topic(pool_id, TopicKind.ATTESTATIONS))


def validators_topic(pool_id: int) -> str:
    return str(Topic(pool_id, TopicKind.VALIDATORS))


@dataclass(frozen=True)
class RelayAdvert(TypedMessage):
    """A relay's offer to serve pool `pool_id`'s checkpoints at `url`, measured at `throughput_kbps` kB/s."""

    pool_id: int
    url: str
    throughput_kbps: int  # kilobytes (1000 bytes) a second, as the relay measured its own serving
    timestamp: int  # unix seconds when the advert was made

    TYPE_NAME: ClassVar[str] = "RelayAdvert"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("pool_id", "poolId", "uint256"),
        ("url", "url", "string"),
        ("throughput_kbps", "throughputKBps", "uint64"),
        ("timestamp", "timestamp", "uint64"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # pool_id, throughput_kbps, timestamp: their uint types
        url = self.url
        if not isinstance(url, str) or len(url) > MAX_URL_LENGTH or not url.isascii() or any(c.isspace() for c in url):
            raise SignatureError(f"url must be ASCII without whitespace, at most {MAX_URL_LENGTH} chars", url=url)
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SignatureError("url must be an http(s) URL with a host", url=url)

    @property
    def throughput_mb_s(self) -> float:
        return self.throughput_kbps / 1000


@dataclass(frozen=True)
class ValidatorHeartbeat(TypedMessage):
    """A validator of pool `pool_id` saying it is at work: validators that share the pool take over the keys of one
    they stop hearing from (validator.sharing). The signed `timestamp` is what counts, so a heartbeat replayed later
    does not keep a stopped validator alive."""

    pool_id: int
    timestamp: int  # unix seconds when it was sent
    next_block: int  # the validator's event cursor: the next block it reads
    backlog: int  # submissions of its share it has not judged yet

    TYPE_NAME: ClassVar[str] = "ValidatorHeartbeat"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("pool_id", "poolId", "uint256"),
        ("timestamp", "timestamp", "uint64"),
        ("next_block", "nextBlock", "uint64"),
        ("backlog", "backlog", "uint64"),
    )


Payload = Checkpoint | RelayAdvert | Attestation | ValidatorHeartbeat

_TYPE_NAMES: dict[type[TypedMessage], str] = {
    Checkpoint: "checkpoint",
    RelayAdvert: "relay",
    Attestation: "attestation",
    ValidatorHeartbeat: "heartbeat",
}
_BY_TYPE_NAME: dict[str, type[TypedMessage]] = {name: cls for cls, name in _TYPE_NAMES.items()}
TOPIC_PAYLOAD: dict[TopicKind, type[TypedMessage]] = {
    TopicKind.CHECKPOINTS: Checkpoint,
    TopicKind.RELAYS: RelayAdvert,
    TopicKind.ATTESTATIONS: Attestation,
    TopicKind.VALIDATORS: ValidatorHeartbeat,
}


@dataclass(frozen=True)
class SignedMessage:
    """A payload and its sender's EIP-712 signature; what travels on a topic."""

    payload: Payload
    signature: bytes

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES[type(self.payload)]

    @property
    def pool_id(self) -> int:
        return self.payload.pool_id

    def signer(self, domain: SigningDomain) -> str:
        """The checksummed address that signed the payload under `domain`; SignatureError if unrecoverable."""
        return recover(self.payload, self.signature, domain)

    def encode(self) -> bytes:
        document: dict[str, Any] = {"type": self.type_name, "signature": "0x" + self.signature.hex()}
        for attr, _, kind in self.payload.FIELDS:
            value = getattr(self.payload, attr)
            document[attr] = "0x" + value.hex() if kind.startswith("bytes") else value
        return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    @classmethod
    def decode(cls, data: bytes) -> SignedMessage:
        """Parses `data`; MessageError unless it is exactly the canonical encoding of a well-formed message."""
        if json_too_deep(data, MAX_JSON_DEPTH):
            raise MessageError(f"JSON nested deeper than {MAX_JSON_DEPTH}")
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, huge ints, deep nesting
            raise MessageError("not JSON", error=str(exc)[:200]) from None
        if not isinstance(document, dict):
            raise MessageError("not a JSON object", kind=type(document).__name__)
        payload_type = _BY_TYPE_NAME.get(document.get("type"))  # type: ignore[arg-type]
        if payload_type is None:
            raise MessageError("unknown message type", type=str(document.get("type"))[:64])
        expected = {"type", "signature", *(attr for attr, _, _ in payload_type.FIELDS)}
        if set(document) != expected:
            raise MessageError(
                "wrong fields",
                type=document["type"],
                missing=sorted(expected - set(document)),
                unexpected=[key[:40] for key in sorted(set(document) - expected)[:8]],
            )
        signature = _decode_field("signature", f"bytes{SIGNATURE_LENGTH}", document["signature"])
        values = {attr: _decode_field(attr, kind, document[attr]) for attr, _, kind in payload_type.FIELDS}
        try:
            payload = payload_type(**values)
        except SignatureError as exc:
            raise MessageError("invalid field", error=str(exc)) from None
        message = cls(payload, signature)  # type: ignore[arg-type]  # payload_type is one of Payload's types
        if message.encode() != data:
            raise MessageError("not canonical JSON (sorted keys, no whitespace, ASCII, lower-case hex)")
        return message


def _decode_field(name: str, kind: str, value: object) -> object:
    if (uint := _UINT.fullmatch(kind)) is not None:
        bits = int(uint.group(1))
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**bits:
            raise MessageError(f"{name} must be a {kind}", field=name, value=str(value)[:80])
        return value
    if (fixed := _BYTES.fullmatch(kind)) is not None:
        length = int(fixed.group(1))
        if not isinstance(value, str) or len(value) != 2 + 2 * length or not _HEX_BYTES.fullmatch(value):
            raise MessageError(f"{name} must be 0x + {2 * length} lower-case hex digits", field=name)
        return bytes.fromhex(value[2:])
    if kind == "bool":
        if not isinstance(value, bool):
            raise MessageError(f"{name} must be a bool", field=name, value=str(value)[:80])
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise MessageError(f"{name} must be a string", field=name)
        return value
    raise MessageError("unsupported field type", field=name, kind=kind)  # a new TypedMessage needs a case here


def sign_message(payload: Payload, account: LocalAccount, domain: SigningDomain) -> SignedMessage:
    """`payload` signed by `account`: a message its host may publish, since the host's key is the same key."""
    return SignedMessage(payload, sign(payload, account, domain))
