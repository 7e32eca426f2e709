"""EIP-712 off-chain messages (DESIGN section 5): typed messages, sign/recover, signed HTTP requests.

Every message is signed under the domain `PrimeNode`, version `1`, this chain's id and the ComputePool
address, so a signature made for one chain or one deployment never verifies on another.

HTTP requests carry a `Request` signature in four headers, and a fifth that declares the body's sha256 (the
signature's `bodyHash`) so that a server can check the signature before it reads the body. A server checks, in
this order: the headers are present and well formed, the timestamp is within `max_skew` of its clock (either
direction), the signature recovers to `X-Prime-Address` (the body is bound through its sha256, so a tampered body
recovers another address), and only then that the (signer, nonce) pair is new. Nonces are recorded after the
signature check so that unauthenticated traffic can neither burn a signer's nonces nor fill the cache, and each
signer's in a window of its own (`NonceCache`), so that no signer can push out or lock out another's.
"""

from __future__ import annotations

import hashlib
import heapq
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from eth_account import Account
from eth_account.messages import SignableMessage, encode_typed_data
from eth_account.signers.local import LocalAccount
from eth_keys.exceptions import BadSignature
from eth_utils import is_address, is_checksum_address, keccak, to_checksum_address
from eth_utils.exceptions import ValidationError

from core.errors import NodeError
from protocol.work import AssignedWork

DOMAIN_NAME = "PrimeNode"
DOMAIN_VERSION = "1"
SIGNATURE_LENGTH = 65
DEFAULT_MAX_SKEW = 300  # seconds, DESIGN section 5

HEADER_ADDRESS = "X-Prime-Address"
HEADER_SIGNATURE = "X-Prime-Signature"
HEADER_TIMESTAMP = "X-Prime-Timestamp"
HEADER_NONCE = "X-Prime-Nonce"
REQUEST_HEADERS = (HEADER_ADDRESS, HEADER_SIGNATURE, HEADER_TIMESTAMP, HEADER_NONCE)
HEADER_BODY_HASH = "X-Prime-Body-Sha256"  # the body's sha256, 64 hex digits: what the signature's bodyHash holds

_SECP256K1_HALF_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141 // 2
_UINT64_MAX, _UINT256_MAX = 2**64 - 1, 2**256 - 1
_METHOD = re.compile(r"[A-Z]{1,16}")
_UINT_KIND, _BYTES_KIND = re.compile(r"uint([0-9]+)"), re.compile(r"bytes([0-9]+)")
_TIMESTAMP = re.compile(r"[0-9]{1,20}")
_NONCE = re.compile(r"0x[0-9a-fA-F]{32}")
_SIGNATURE = re.compile(r"0x[0-9a-fA-F]{130}")
_SHA256 = re.compile(r"(0x)?[0-9a-fA-F]{64}")


class SignatureError(NodeError):
    """A message, signature or domain that is invalid; `context` holds the offending values."""

    def __init__(self, message: str, **context: object) -> None:
        detail = ", ".join(f"{key}={value!r}" for key, value in context.items())
        super().__init__(f"{message} ({detail})" if detail else message)
        self.context = context


class AuthFailure(StrEnum):
    """Why `verify_request` refused a request."""

    MISSING_HEADER = "missing_header"
    MALFORMED_HEADER = "malformed_header"
    TIMESTAMP_SKEW = "timestamp_skew"
    BAD_SIGNATURE = "bad_signature"  # not a recoverable 65-byte signature
    SIGNER_MISMATCH = "signer_mismatch"  # recovers to another address: wrong key, domain, method, path or body
    REPLAYED_NONCE = "replayed_nonce"
    NONCE_WINDOW = "nonce_window"  # at or before the oldest timestamp this signer's window still holds: sign again


class RequestAuthError(SignatureError):
    """A signed HTTP request that must be refused; `code` says why."""

    def __init__(self, code: AuthFailure, message: str, **context: object) -> None:
        super().__init__(message, code=code.value, **context)
        self.code = code


def _check_uint(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise SignatureError(f"{name} must be an integer in [0, {maximum}]", field=name, value=value)


def _check_bytes(name: str, value: object, length: int) -> None:
    if not isinstance(value, bytes) or len(value) != length:
        raise SignatureError(f"{name} must be {length} bytes", field=name, value=value)


def _check_checksum_address(name: str, value: object) -> None:
    if not isinstance(value, str) or not is_checksum_address(value):
        raise SignatureError(f"{name} must be a checksummed address", field=name, value=value)


def _check_typed(name: str, value: object, kind: str) -> None:
    """`value` as EIP-712 type `kind` holds it: a checksummed address, a uintN in [0, 2**N - 1], N bytes for a
    bytesN, a bool; a string is left to its message to check."""
    if kind == "address":
        _check_checksum_address(name, value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise SignatureError(f"{name} must be a bool", field=name, value=value)
    elif (uint := _UINT_KIND.fullmatch(kind)) is not None:
        _check_uint(name, value, 2 ** int(uint.group(1)) - 1)
    elif (fixed := _BYTES_KIND.fullmatch(kind)) is not None:
        _check_bytes(name, value, int(fixed.group(1)))


@dataclass(frozen=True)
class SigningDomain:
    """The EIP-712 domain: PrimeNode/1 on `chain_id`, verified by the ComputePool at `verifying_contract`."""

    chain_id: int
    verifying_contract: str

    def __post_init__(self) -> None:
        if isinstance(self.chain_id, bool) or not isinstance(self.chain_id, int) or self.chain_id <= 0:
            raise SignatureError("chain_id must be a positive integer", field="chain_id", value=self.chain_id)
        _check_checksum_address("verifying_contract", self.verifying_contract)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": DOMAIN_NAME,
            "version": DOMAIN_VERSION,
            "chainId": self.chain_id,
            "verifyingContract": self.verifying_contract,
        }


_DOMAIN_TYPE = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]


class TypedMessage:
    """Base of the typed messages: `FIELDS` maps each dataclass attribute, in order, to (EIP-712 name, type)."""

    TYPE_NAME: ClassVar[str]
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]]  # (attribute, EIP-712 name, EIP-712 type)

    @classmethod
    def type_string(cls) -> str:
        """The EIP-712 encodeType string, e.g. `Checkpoint(uint256 poolId,uint64 step,bytes32 manifestHash)`."""
        return f"{cls.TYPE_NAME}({','.join(f'{kind} {name}' for _, name, kind in cls.FIELDS)})"

    def typed_data(self, domain: SigningDomain) -> dict[str, Any]:
        """The full EIP-712 message as eth_account's `encode_typed_data(full_message=...)` takes it."""
        return {
            "types": {
                "EIP712Domain": _DOMAIN_TYPE,
                self.TYPE_NAME: [{"name": name, "type": kind} for _, name, kind in self.FIELDS],
            },
            "primaryType": self.TYPE_NAME,
            "domain": domain.as_dict(),
            "message": {name: getattr(self, attr) for attr, name, _ in self.FIELDS},
        }

    def __post_init__(self) -> None:
        """Each field checked against its EIP-712 type, in FIELDS order (`_check_typed`); a message with string
        fields checks those itself."""
        for attr, _, kind in self.FIELDS:
            _check_typed(attr, getattr(self, attr), kind)


@dataclass(frozen=True)
class Request(TypedMessage):
    """An HTTP request: `method` (upper case) on `path` at `host` (the URL's host[:port], as the client addressed
    it) for pool `pool_id`, sha256 of its body, unix `timestamp`, random `nonce`. The pool and the host bind a
    request to the one coordinator it was made for: replayed to another pool's coordinator (the signing domain is
    deployment-wide) it recovers another address."""

    signer: str
    method: str
    path: str
    body_hash: bytes
    timestamp: int
    nonce: bytes
    pool_id: int
    host: str

    TYPE_NAME: ClassVar[str] = "Request"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("signer", "signer", "address"),
        ("method", "method", "string"),
        ("path", "path", "string"),
        ("body_hash", "bodyHash", "bytes32"),
        ("timestamp", "timestamp", "uint64"),
        ("nonce", "nonce", "bytes16"),
        ("pool_id", "poolId", "uint256"),
        ("host", "host", "string"),
    )

    def __post_init__(self) -> None:
        _check_checksum_address("signer", self.signer)
        _check_uint("pool_id", self.pool_id, _UINT256_MAX)
        if not isinstance(self.host, str) or not 0 < len(self.host) <= 255 or any(c.isspace() for c in self.host):
            raise SignatureError("host must be 1 to 255 characters without whitespace", field="host", value=self.host)
        if not isinstance(self.method, str) or not _METHOD.fullmatch(self.method):
            raise SignatureError("method must be an upper-case HTTP method", field="method", value=self.method)
        if not isinstance(self.path, str) or not self.path.startswith("/") or any(c.isspace() for c in self.path):
            raise SignatureError("path must start with '/' and hold no whitespace", field="path", value=self.path)
        _check_bytes("body_hash", self.body_hash, 32)
        _check_uint("timestamp", self.timestamp, _UINT64_MAX)
        _check_bytes("nonce", self.nonce, 16)


@dataclass(frozen=True)
class Checkpoint(TypedMessage):
    """A pool trainer's claim that `manifest_hash` is the checkpoint manifest of `step` in pool `pool_id`."""

    pool_id: int
    step: int
    manifest_hash: bytes

    TYPE_NAME: ClassVar[str] = "Checkpoint"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("pool_id", "poolId", "uint256"),
        ("step", "step", "uint64"),
        ("manifest_hash", "manifestHash", "bytes32"),
    )


@dataclass(frozen=True)
class Attestation(TypedMessage):
    """A validator's verdict on work `work_key` of pool `pool_id`; `reason` is a DESIGN section 5 code."""

    pool_id: int
    work_key: bytes
    accepted: bool
    reason: int

    TYPE_NAME: ClassVar[str] = "Attestation"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("pool_id", "poolId", "uint256"),
        ("work_key", "workKey", "bytes32"),
        ("accepted", "accepted", "bool"),
        ("reason", "reason", "uint8"),
    )


_ASSIGNED_WORK_FIELDS: tuple[tuple[str, str, str], ...] = (  # `AssignedWork`'s, then the task's hash
    ("pool_id", "poolId", "uint256"),
    ("node", "node", "address"),
    ("step", "step", "uint64"),
    ("counter", "counter", "uint64"),
    ("prompts", "prompts", "uint32"),
    ("group_size", "groupSize", "uint32"),
    ("task_spec_hash", "taskSpecHash", "bytes32"),
)


@dataclass(frozen=True)
class Assignment(AssignedWork, TypedMessage):
    """The coordinator's grant, signed by the pool's trainer, of one file of work: `node` answers the `prompts` x
    `group_size` assignment `counter` at policy `step` under the task spec `task_spec_hash`, issued at `issued_at`
    (unix seconds, the trainer's clock).

    The worker writes the signature and the issue time into the file's metadata. A validator rebuilds this message
    from the file itself and recovers the trainer: a file whose shape, counter, step, node, task or issue time differs
    from what was granted (one generation re-sliced into many files, a counter never handed out, a later issue time)
    recovers another address. The issue time is what staleness is judged by (`protocol.terms.AssignmentTiming`): the
    worker refuses an assignment off its own clock, and a validator compares it with the block time of the
    submission, never with what the coordinator says about its steps."""

    task_spec_hash: bytes
    issued_at: int

    TYPE_NAME: ClassVar[str] = "Assignment"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (*_ASSIGNED_WORK_FIELDS, ("issued_at", "issuedAt", "uint64"))


@dataclass(frozen=True)
class UntimedAssignment(AssignedWork, TypedMessage):
    """The assignment as trainers signed it before it carried its issue time (rollout format 2, issue 19): the same
    fields but `issuedAt`, under the same type name. Its type hash differs, so a signature over one never verifies
    as the other. A validator still checks the signature of a format-2 file with it; with no signed time, such a
    file is never slashed as stale."""

    task_spec_hash: bytes

    TYPE_NAME: ClassVar[str] = "Assignment"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = _ASSIGNED_WORK_FIELDS


@dataclass(frozen=True)
class UploadReceipt(TypedMessage):
    """The coordinator's acknowledgement, signed by the pool's trainer, that it stored `node`'s file `work_key`.

    A worker keeps it: a file the coordinator acknowledged and then lost is the coordinator's fault, not the
    worker's, and the receipt proves the upload happened."""

    pool_id: int
    work_key: bytes
    node: str

    TYPE_NAME: ClassVar[str] = "UploadReceipt"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("pool_id", "poolId", "uint256"),
        ("work_key", "workKey", "bytes32"),
        ("node", "node", "address"),
    )


@dataclass(frozen=True)
class BatchReceipt(TypedMessage):
    """The coordinator's acknowledgement, signed by the pool's trainer, that it holds the leaf list of `count` leaves
    whose Merkle root is `root` (`ledger.merkle`), uploaded by `node`, and every rollout file the list names.

    Validators need every leaf to check a batch; a list the coordinator acknowledged and then lost is the
    coordinator's fault, not the worker's, and the receipt proves the list was made available."""

    pool_id: int
    root: bytes
    node: str
    count: int

    TYPE_NAME: ClassVar[str] = "BatchReceipt"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("pool_id", "poolId", "uint256"),
        ("root", "root", "bytes32"),
        ("node", "node", "address"),
        ("count", "count", "uint256"),
    )


def _signable(message: TypedMessage, domain: SigningDomain) -> SignableMessage:
    return encode_typed_data(full_message=message.typed_data(domain))


def digest(message: TypedMessage, domain: SigningDomain) -> bytes:
    """The 32-byte EIP-712 digest keccak(0x19 0x01 domainSeparator hashStruct(message))."""
    signable = _signable(message, domain)
    return bytes(keccak(b"\x19" + signable.version + signable.header + signable.body))


def sign(message: TypedMessage, account: LocalAccount, domain: SigningDomain) -> bytes:
    """The 65-byte signature (r, s, v) of `message` by `account` under `domain`."""
    return bytes(account.sign_message(_signable(message, domain)).signature)


def recover(message: TypedMessage, signature: bytes, domain: SigningDomain) -> str:
    """The checksummed address that signed `message` under `domain`; any other domain gives another address.

    A signature with s in the upper half of the curve order is refused: (r, n - s) is a second valid signature of
    the same message, so accepting both would give one signed message two distinct byte strings (EIP-2)."""
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_LENGTH:
        raise SignatureError(f"signature must be {SIGNATURE_LENGTH} bytes", signature=signature)
    if int.from_bytes(signature[32:64], "big") > _SECP256K1_HALF_N:
        raise SignatureError("high-s signature (its low-s twin is the canonical one)", signature="0x" + signature.hex())
    try:
        signer = Account.recover_message(_signable(message, domain), signature=signature)
    except (BadSignature, ValidationError, ValueError) as exc:
        raise SignatureError(f"unrecoverable signature: {exc}", signature="0x" + signature.hex()) from exc
    return to_checksum_address(signer)


@dataclass
class _Window:
    """One signer's live nonces (nonce -> timestamp), oldest first in `heap`, and its `floor`: a timestamp at or
    before which its requests are refused, because a nonce of that age was forgotten."""

    nonces: dict[bytes, int] = field(default_factory=dict)
    heap: list[tuple[int, bytes]] = field(default_factory=list)  # (timestamp, nonce); stale pairs are skipped
    floor: int = -1


class NonceCache:
    """Remembers each signer's nonces while their requests' timestamps are acceptable, in a window per signer.

    A (signer, nonce) is held until its timestamp is more than `max_skew` in the past: after that the timestamp check
    refuses a replay. At most `max_entries` are held in all. When that is reached, the signer holding the most
    forgets its oldest hundredth of them and raises its floor to the newest timestamp it forgot: from then on its
    requests signed at or before the floor are refused (`nonce_window`), so nothing forgotten can be replayed. So a
    signer that floods only ever pushes out its own nonces, a request signed now is never refused for anyone else's
    traffic, and nothing is refused for want of room. Timestamps are whole seconds: a signer that holds the most and
    signed them all within the current second refuses its own requests until the next one. `discard` forgets the
    nonce of a request refused after it was recorded, so a refused request consumes none. Thread-safe: one lock
    guards it all.
    """

    def __init__(self, max_skew: float = DEFAULT_MAX_SKEW, max_entries: int = 100_000) -> None:
        if max_skew <= 0 or max_entries <= 0:
            raise SignatureError(
                "NonceCache needs max_skew > 0 and max_entries > 0", max_skew=max_skew, max_entries=max_entries
            )
        self.max_skew = max_skew
        self.max_entries = max_entries
        self._windows: dict[str, _Window] = {}
        self._expiry: list[tuple[int, str, bytes]] = []  # (timestamp, signer, nonce) of every entry, oldest first
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return self._size

    def held(self, signer: str) -> int:
        """How many of `signer`'s nonces are held."""
        with self._lock:
            window = self._windows.get(signer)
            return 0 if window is None else len(window.nonces)

    def add(self, signer: str, nonce: bytes, timestamp: int, now: float) -> None:
        """Records `signer`'s `nonce` of a request signed at `timestamp`; RequestAuthError if it is held already or
        the timestamp is at or before the signer's floor."""
        with self._lock:
            self._expire(now)
            window = self._windows.setdefault(signer, _Window())
            if nonce in window.nonces:
                raise RequestAuthError(
                    AuthFailure.REPLAYED_NONCE, "nonce already used", signer=signer, nonce="0x" + nonce.hex()
                )
            if timestamp <= window.floor:
                raise RequestAuthError(
                    AuthFailure.NONCE_WINDOW,
                    "signed before the oldest request this signer's window still holds; sign it again",
                    signer=signer,
                    timestamp=timestamp,
                    floor=window.floor,
                )
            if self._size >= self.max_entries:
                self._shrink_heaviest()
            window.nonces[nonce] = timestamp
            heapq.heappush(window.heap, (timestamp, nonce))
            heapq.heappush(self._expiry, (timestamp, signer, nonce))
            self._size += 1

    def discard(self, signer: str, nonce: bytes) -> None:
        """Forgets `signer`'s `nonce`: its request was refused after the nonce was recorded."""
        with self._lock:
            window = self._windows.get(signer)
            if window is not None and window.nonces.pop(nonce, None) is not None:
                self._size -= 1

    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] + self.max_skew < now:
            timestamp, signer, nonce = heapq.heappop(self._expiry)
            window = self._windows.get(signer)
            if window is None:
                continue
            if window.nonces.get(nonce) == timestamp:
                del window.nonces[nonce]
                self._size -= 1
            if not window.nonces:
                window.heap.clear()
                if window.floor + self.max_skew < now:  # the timestamp check covers what the floor did
                    del self._windows[signer]

    def _shrink_heaviest(self) -> None:
        """The signer holding the most forgets its oldest hundredth (at least one); its floor rises past them."""
        window = max(self._windows.values(), key=lambda w: len(w.nonces))
        for _ in range(max(1, self.max_entries // 100)):
            while window.heap:
                timestamp, nonce = heapq.heappop(window.heap)
                if window.nonces.get(nonce) == timestamp:
                    del window.nonces[nonce]
                    self._size -= 1
                    window.floor = max(window.floor, timestamp)
                    break
            else:
                return
        # the nonces left at the floor's timestamp are refused by it anyway
        while window.heap and window.heap[0][0] <= window.floor:
            timestamp, nonce = heapq.heappop(window.heap)
            if window.nonces.get(nonce) == timestamp:
                del window.nonces[nonce]
                self._size -= 1


def sign_request(
    account: LocalAccount,
    domain: SigningDomain,
    method: str,
    path: str,
    body: bytes,
    *,
    pool_id: int,
    host: str,
    now: int | None = None,
    nonce: bytes | None = None,
) -> dict[str, str]:
    """The X-Prime-* headers authenticating `method path` at `host` for pool `pool_id` with `body`: the four of the
    signature and `X-Prime-Body-Sha256`, which lets the server check the signature before reading the body."""
    request = Request(
        signer=account.address,
        method=method.upper(),
        path=path,
        body_hash=hashlib.sha256(body).digest(),
        timestamp=int(time.time()) if now is None else now,
        nonce=secrets.token_bytes(16) if nonce is None else nonce,
        pool_id=pool_id,
        host=host,
    )
    return {
        HEADER_ADDRESS: request.signer,
        HEADER_SIGNATURE: "0x" + sign(request, account, domain).hex(),
        HEADER_TIMESTAMP: str(request.timestamp),
        HEADER_NONCE: "0x" + request.nonce.hex(),
        HEADER_BODY_HASH: request.body_hash.hex(),
    }


def declared_body_hash(headers: Mapping[str, str]) -> bytes | None:
    """The body's sha256 as `X-Prime-Body-Sha256` declares it; None when the header is absent (an older client)."""
    by_name = {name.lower(): value for name, value in headers.items()}
    value = by_name.get(HEADER_BODY_HASH.lower())
    if value is None:
        return None
    value = value.strip()
    if not _SHA256.fullmatch(value):
        raise RequestAuthError(AuthFailure.MALFORMED_HEADER, "malformed header", header=HEADER_BODY_HASH, value=value)
    return bytes.fromhex(value.removeprefix("0x"))


@dataclass(frozen=True)
class SignedRequest:
    """A request whose signature checked out; its nonce is not recorded yet (`NonceCache.add` does that)."""

    signer: str
    nonce: bytes
    timestamp: int


def verify_request(
    headers: Mapping[str, str],
    domain: SigningDomain,
    method: str,
    path: str,
    body: bytes,
    *,
    pool_id: int,
    host: str,
    now: float,
    max_skew: float = DEFAULT_MAX_SKEW,
    nonces: NonceCache,
) -> str:
    """The checksummed signer of a request signed by `sign_request`; RequestAuthError with a `code` otherwise.

    Header names match case-insensitively. Role checks are the caller's: this only says who signed. A server that
    checks roles should use `check_request`, then the role, then `nonces.add`: recording a stranger's nonce lets
    strangers fill the cache and lock members out (issue 19).
    """
    if nonces.max_skew < max_skew:
        raise SignatureError(
            "the nonce cache must cover the timestamp window", cache=nonces.max_skew, max_skew=max_skew
        )
    checked = check_request(headers, domain, method, path, body, pool_id=pool_id, host=host, now=now, max_skew=max_skew)
    nonces.add(checked.signer, checked.nonce, checked.timestamp, now)
    return checked.signer


def check_request(
    headers: Mapping[str, str],
    domain: SigningDomain,
    method: str,
    path: str,
    body: bytes,
    *,
    pool_id: int,
    host: str,
    now: float,
    max_skew: float = DEFAULT_MAX_SKEW,
) -> SignedRequest:
    """The headers, the timestamp and the signature of a request with `body`, without touching any nonce cache."""
    body_hash = hashlib.sha256(body).digest()
    return check_request_hash(
        headers, domain, method, path, body_hash, pool_id=pool_id, host=host, now=now, max_skew=max_skew
    )


def check_request_hash(
    headers: Mapping[str, str],
    domain: SigningDomain,
    method: str,
    path: str,
    body_hash: bytes,
    *,
    pool_id: int,
    host: str,
    now: float,
    max_skew: float = DEFAULT_MAX_SKEW,
) -> SignedRequest:
    """`check_request` for a body known by its sha256 only (not read yet: the reader checks it against this)."""
    by_name = {name.lower(): value for name, value in headers.items()}
    values: dict[str, str] = {}
    for name in REQUEST_HEADERS:
        value = by_name.get(name.lower())
        if value is None:
            raise RequestAuthError(AuthFailure.MISSING_HEADER, "missing header", header=name)
        values[name] = value.strip()

    address, signature, timestamp, nonce = (values[name] for name in REQUEST_HEADERS)
    # lower case or a valid EIP-55 checksum: a mixed-case address with a wrong checksum is a typo, not a signer
    if not is_address(address) or (address != address.lower() and not is_checksum_address(address)):
        raise RequestAuthError(AuthFailure.MALFORMED_HEADER, "not an address", header=HEADER_ADDRESS, value=address)
    for name, pattern in ((HEADER_SIGNATURE, _SIGNATURE), (HEADER_TIMESTAMP, _TIMESTAMP), (HEADER_NONCE, _NONCE)):
        if not pattern.fullmatch(values[name]):
            raise RequestAuthError(AuthFailure.MALFORMED_HEADER, "malformed header", header=name, value=values[name])
    seconds = int(timestamp)
    if seconds > _UINT64_MAX:
        raise RequestAuthError(AuthFailure.MALFORMED_HEADER, "timestamp out of range", header=HEADER_TIMESTAMP)
    if abs(now - seconds) > max_skew:
        raise RequestAuthError(
            AuthFailure.TIMESTAMP_SKEW, "timestamp too far from server clock", timestamp=seconds, now=now
        )

    claimed = to_checksum_address(address)
    request = Request(
        signer=claimed,
        method=method.upper(),
        path=path,
        body_hash=body_hash,
        timestamp=seconds,
        nonce=bytes.fromhex(nonce[2:]),
        pool_id=pool_id,
        host=host,
    )
    try:
        signer = recover(request, bytes.fromhex(signature[2:]), domain)
    except SignatureError as exc:
        raise RequestAuthError(AuthFailure.BAD_SIGNATURE, str(exc), signer=claimed) from exc
    if signer != claimed:
        raise RequestAuthError(
            AuthFailure.SIGNER_MISMATCH, "signature is not by the claimed address", claimed=claimed, recovered=signer
        )
    return SignedRequest(signer, request.nonce, seconds)
