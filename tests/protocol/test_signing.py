"""EIP-712 messages of DESIGN section 5: digests, sign/recover, domain binding, signed HTTP requests."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import fields

import pytest
from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

from core.errors import NodeError
from protocol.signing import (
    Attestation,
    AuthFailure,
    Checkpoint,
    NonceCache,
    Request,
    RequestAuthError,
    SignatureError,
    SigningDomain,
    TypedMessage,
    digest,
    recover,
    sign,
    sign_request,
    verify_request,
)

SIGNER = Account.from_key("0x" + "11" * 32).address
NOW = 1_700_000_000
BODY = b'{"rollouts": 3}'


@pytest.fixture(scope="module")
def alice() -> LocalAccount:
    account: LocalAccount = Account.from_key("0x" + "11" * 32)
    return account


@pytest.fixture(scope="module")
def bob() -> LocalAccount:
    account: LocalAccount = Account.from_key("0x" + "22" * 32)
    return account


@pytest.fixture(scope="module")
def domain() -> SigningDomain:
    return SigningDomain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")


def _messages(signer: str) -> list[TypedMessage]:
    return [
        Request(signer, "POST", "/work/submit", b"\x01" * 32, NOW, b"\x02" * 16, 3, "coordinator.example:8600"),
        Checkpoint(pool_id=7, step=42, manifest_hash=b"\x03" * 32),
        Attestation(pool_id=2**255, work_key=b"\x04" * 32, accepted=False, reason=1),
    ]


def _hand_digest(message: TypedMessage, domain: SigningDomain) -> bytes:
    """EIP-712 by hand with eth_abi + keccak, from the DESIGN type strings (no eth_account involved)."""
    domain_type = b"EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
    separator = keccak(
        abi_encode(
            ["bytes32", "bytes32", "bytes32", "uint256", "address"],
            [keccak(domain_type), keccak(b"PrimeNode"), keccak(b"1"), domain.chain_id, domain.verifying_contract],
        )
    )
    if isinstance(message, Request):
        type_string = (
            "Request(address signer,string method,string path,bytes32 bodyHash,uint64 timestamp,bytes16 nonce,"
            "uint256 poolId,string host)"
        )
        types = ["bytes32", "address", "bytes32", "bytes32", "bytes32", "uint64", "bytes16", "uint256", "bytes32"]
        values: list[object] = [
            message.signer,
            keccak(text=message.method),
            keccak(text=message.path),
            message.body_hash,
            message.timestamp,
            message.nonce,
            message.pool_id,
            keccak(text=message.host),
        ]
    elif isinstance(message, Checkpoint):
        type_string = "Checkpoint(uint256 poolId,uint64 step,bytes32 manifestHash)"
        types = ["bytes32", "uint256", "uint64", "bytes32"]
        values = [message.pool_id, message.step, message.manifest_hash]
    else:
        assert isinstance(message, Attestation)
        type_string = "Attestation(uint256 poolId,bytes32 workKey,bool accepted,uint8 reason)"
        types = ["bytes32", "uint256", "bytes32", "bool", "uint8"]
        values = [message.pool_id, message.work_key, message.accepted, message.reason]
    struct_hash = keccak(abi_encode(types, [keccak(text=type_string), *values]))
    return keccak(b"\x19\x01" + separator + struct_hash)


def test_type_strings_match_design() -> None:
    assert Request.type_string() == (
        "Request(address signer,string method,string path,bytes32 bodyHash,uint64 timestamp,bytes16 nonce,"
        "uint256 poolId,string host)"
    )
    assert Checkpoint.type_string() == "Checkpoint(uint256 poolId,uint64 step,bytes32 manifestHash)"
    assert Attestation.type_string() == "Attestation(uint256 poolId,bytes32 workKey,bool accepted,uint8 reason)"


@pytest.mark.parametrize("cls", [Request, Checkpoint, Attestation])
def test_fields_table_follows_dataclass_order(cls: type[TypedMessage]) -> None:
    assert [f.name for f in fields(cls)] == [attr for attr, _, _ in cls.FIELDS]  # type: ignore[arg-type]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_digest_matches_hand_computed_eip712(index: int, alice: LocalAccount, domain: SigningDomain) -> None:
    message = _messages(alice.address)[index]
    assert digest(message, domain) == _hand_digest(message, domain)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_sign_recover_round_trip(index: int, alice: LocalAccount, domain: SigningDomain) -> None:
    message = _messages(alice.address)[index]
    signature = sign(message, alice, domain)
    assert len(signature) == 65
    assert recover(message, signature, domain) == alice.address
    # the signature is over exactly the hand-computed digest
    assert Account._recover_hash(_hand_digest(message, domain), signature=signature) == alice.address


@pytest.mark.parametrize(
    "other",
    [
        SigningDomain(1, "0x5FbDB2315678afecb367f032d93F642f64180aa3"),
        SigningDomain(31337, "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"),
    ],
)
def test_signature_is_bound_to_chain_and_contract(
    other: SigningDomain, alice: LocalAccount, domain: SigningDomain
) -> None:
    checkpoint = Checkpoint(pool_id=1, step=1, manifest_hash=b"\x05" * 32)
    signature = sign(checkpoint, alice, domain)
    assert digest(checkpoint, other) != digest(checkpoint, domain)
    assert recover(checkpoint, signature, other) != alice.address


def test_altered_message_recovers_another_address(alice: LocalAccount, domain: SigningDomain) -> None:
    attestation = Attestation(pool_id=3, work_key=b"\x06" * 32, accepted=True, reason=0)
    signature = sign(attestation, alice, domain)
    flipped = Attestation(pool_id=3, work_key=b"\x06" * 32, accepted=False, reason=0)
    assert recover(flipped, signature, domain) != alice.address


def test_the_high_s_twin_of_a_signature_is_refused(alice: LocalAccount, domain: SigningDomain) -> None:
    """(r, n - s, v ^ 1) verifies the same message under plain ECDSA: two byte strings for one signed message."""
    message = Attestation(pool_id=3, work_key=b"\x06" * 32, accepted=True, reason=0)
    signature = sign(message, alice, domain)
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    r, s, v = signature[:32], int.from_bytes(signature[32:64], "big"), signature[64]
    twin = r + (n - s).to_bytes(32, "big") + bytes([55 - v])  # v 27 <-> 28
    assert recover(message, signature, domain) == alice.address
    with pytest.raises(SignatureError, match="high-s"):
        recover(message, twin, domain)


@pytest.mark.parametrize("signature", [b"", b"\x00" * 64, b"\x00" * 65, b"\xff" * 65, b"\x01" * 64 + b"\x05"])
def test_recover_malformed_signature_raises(signature: bytes, domain: SigningDomain) -> None:
    with pytest.raises(SignatureError):
        recover(Checkpoint(1, 1, b"\x00" * 32), signature, domain)


def test_signature_error_is_a_node_error_with_context() -> None:
    with pytest.raises(NodeError) as info:
        Checkpoint(pool_id=-1, step=0, manifest_hash=b"\x00" * 32)
    assert isinstance(info.value, SignatureError)
    assert info.value.context == {"field": "pool_id", "value": -1}


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SigningDomain(0, "0x5FbDB2315678afecb367f032d93F642f64180aa3"), "chain_id"),
        (lambda: SigningDomain(1, "0x5fbdb2315678afecb367f032d93f642f64180aa3"), "verifying_contract"),
        (lambda: Checkpoint(2**256, 0, b"\x00" * 32), "pool_id"),
        (lambda: Checkpoint(0, 2**64, b"\x00" * 32), "step"),
        (lambda: Checkpoint(0, True, b"\x00" * 32), "step"),
        (lambda: Checkpoint(0, 0, b"\x00" * 31), "manifest_hash"),
        (lambda: Attestation(0, b"\x00" * 33, True, 0), "work_key"),
        (lambda: Attestation(0, b"\x00" * 32, 1, 0), "accepted"),  # type: ignore[arg-type]
        (lambda: Attestation(0, b"\x00" * 32, False, 256), "reason"),
        (lambda: Request("0x" + "ab" * 20, "GET", "/", b"\x00" * 32, 0, b"\x00" * 16, 0, "h"), "signer"),
        (lambda: Request(SIGNER, "get", "/", b"\0" * 32, 0, b"\0" * 16, 0, "h"), "method"),
        (lambda: Request(SIGNER, "GET", "x", b"\0" * 32, 0, b"\0" * 16, 0, "h"), "path"),
        (lambda: Request(SIGNER, "GET", "/", b"\0" * 32, -1, b"\0" * 16, 0, "h"), "timestamp"),
        (lambda: Request(SIGNER, "GET", "/", b"\0" * 32, 0, b"\0" * 15, 0, "h"), "nonce"),
    ],
)
def test_field_validation_rejects_out_of_range(build: object, field: str) -> None:
    with pytest.raises(SignatureError) as info:
        build()  # type: ignore[operator]
    assert info.value.context["field"] == field


HOST = "coordinator.example:8600"


def _verify(headers: dict[str, str], domain: SigningDomain, nonces: NonceCache, **overrides: object) -> str:
    kwargs: dict[str, object] = {
        "method": "POST", "path": "/work/submit", "body": BODY, "now": NOW, "pool_id": 1, "host": HOST
    }  # fmt: skip
    kwargs.update(overrides)
    return verify_request(headers, domain, nonces=nonces, **kwargs)  # type: ignore[arg-type]


def _headers(account: LocalAccount, domain: SigningDomain, **overrides: object) -> dict[str, str]:
    kwargs: dict[str, object] = {
        "method": "POST", "path": "/work/submit", "body": BODY, "now": NOW, "pool_id": 1, "host": HOST
    }  # fmt: skip
    kwargs.update(overrides)
    return sign_request(account, domain, **kwargs)  # type: ignore[arg-type]


def test_signed_request_verifies(alice: LocalAccount, domain: SigningDomain) -> None:
    headers = _headers(alice, domain, nonce=b"\x09" * 16)
    assert headers["X-Prime-Address"] == alice.address
    assert headers["X-Prime-Timestamp"] == str(NOW)
    assert headers["X-Prime-Nonce"] == "0x" + "09" * 16
    assert len(headers["X-Prime-Signature"]) == 2 + 130
    lowered = {name.lower(): value for name, value in headers.items()}
    assert _verify(lowered, domain, NonceCache()) == alice.address


def test_lower_case_address_header_verifies(alice: LocalAccount, domain: SigningDomain) -> None:
    headers = _headers(alice, domain)
    headers["X-Prime-Address"] = alice.address.lower()
    assert _verify(headers, domain, NonceCache()) == alice.address


def test_signed_request_signs_sha256_of_body(alice: LocalAccount, domain: SigningDomain) -> None:
    headers = _headers(alice, domain, nonce=b"\x09" * 16)
    request = Request(alice.address, "POST", "/work/submit", hashlib.sha256(BODY).digest(), NOW, b"\x09" * 16, 1, HOST)
    assert recover(request, bytes.fromhex(headers["X-Prime-Signature"][2:]), domain) == alice.address


@pytest.mark.parametrize(
    "other", [{"pool_id": 2}, {"host": "other.example:8600"}], ids=["another-pool", "another-host"]
)
def test_a_request_replayed_to_another_pools_coordinator_is_refused(
    alice: LocalAccount, domain: SigningDomain, other: dict[str, object]
) -> None:
    """The signing domain is deployment-wide: before issue 19 a request signed for pool 1's coordinator verified at
    pool 2's and used up the node's assignment there."""
    headers = _headers(alice, domain)
    with pytest.raises(RequestAuthError) as caught:
        _verify(headers, domain, NonceCache(), **other)
    assert caught.value.code == AuthFailure.SIGNER_MISMATCH


def test_default_nonces_are_random(alice: LocalAccount, domain: SigningDomain) -> None:
    assert _headers(alice, domain)["X-Prime-Nonce"] != _headers(alice, domain)["X-Prime-Nonce"]


def test_replayed_nonce_is_refused(alice: LocalAccount, domain: SigningDomain) -> None:
    nonces = NonceCache()
    headers = _headers(alice, domain)
    _verify(headers, domain, nonces)
    with pytest.raises(RequestAuthError) as info:
        _verify(headers, domain, nonces, now=NOW + 10)
    assert info.value.code is AuthFailure.REPLAYED_NONCE


def test_same_nonce_from_another_signer_is_accepted(
    alice: LocalAccount, bob: LocalAccount, domain: SigningDomain
) -> None:
    nonces = NonceCache()
    assert _verify(_headers(alice, domain, nonce=b"\x07" * 16), domain, nonces) == alice.address
    assert _verify(_headers(bob, domain, nonce=b"\x07" * 16), domain, nonces) == bob.address


@pytest.mark.parametrize("header", ["X-Prime-Address", "X-Prime-Signature", "X-Prime-Timestamp", "X-Prime-Nonce"])
def test_missing_header_is_refused(header: str, alice: LocalAccount, domain: SigningDomain) -> None:
    headers = _headers(alice, domain)
    del headers[header]
    with pytest.raises(RequestAuthError) as info:
        _verify(headers, domain, NonceCache())
    assert info.value.code is AuthFailure.MISSING_HEADER
    assert info.value.context["header"] == header


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Prime-Address", "0x1234"),
        ("X-Prime-Address", "0x5FBDB2315678afecb367f032d93F642f64180aa3"),  # bad checksum
        ("X-Prime-Signature", "0xzz"),
        ("X-Prime-Signature", "0x" + "00" * 64),
        ("X-Prime-Timestamp", "-5"),
        ("X-Prime-Timestamp", "1.5e9"),
        ("X-Prime-Timestamp", str(2**64)),
        ("X-Prime-Nonce", "0x" + "00" * 15),
        ("X-Prime-Nonce", "07" * 16),
    ],
)
def test_malformed_header_is_refused(header: str, value: str, alice: LocalAccount, domain: SigningDomain) -> None:
    headers = _headers(alice, domain)
    headers[header] = value
    with pytest.raises(RequestAuthError) as info:
        _verify(headers, domain, NonceCache())
    assert info.value.code is AuthFailure.MALFORMED_HEADER


@pytest.mark.parametrize("offset", [-301, 301, -10_000])
def test_timestamp_skew_is_refused_in_either_direction(offset: int, alice: LocalAccount, domain: SigningDomain) -> None:
    headers = _headers(alice, domain, now=NOW + offset)
    with pytest.raises(RequestAuthError) as info:
        _verify(headers, domain, NonceCache())
    assert info.value.code is AuthFailure.TIMESTAMP_SKEW


@pytest.mark.parametrize("offset", [-300, 300])
def test_timestamp_at_skew_limit_is_accepted(offset: int, alice: LocalAccount, domain: SigningDomain) -> None:
    assert _verify(_headers(alice, domain, now=NOW + offset), domain, NonceCache()) == alice.address


def test_unrecoverable_signature_is_refused(alice: LocalAccount, domain: SigningDomain) -> None:
    headers = _headers(alice, domain)
    headers["X-Prime-Signature"] = "0x" + "ff" * 65
    with pytest.raises(RequestAuthError) as info:
        _verify(headers, domain, NonceCache())
    assert info.value.code is AuthFailure.BAD_SIGNATURE


@pytest.mark.parametrize(
    "tamper",
    [
        {"body": BODY + b" "},
        {"path": "/work/other"},
        {"method": "PUT"},
    ],
)
def test_tampered_request_is_a_signer_mismatch(
    tamper: dict[str, object], alice: LocalAccount, domain: SigningDomain
) -> None:
    nonces = NonceCache()
    with pytest.raises(RequestAuthError) as info:
        _verify(_headers(alice, domain), domain, nonces, **tamper)
    assert info.value.code is AuthFailure.SIGNER_MISMATCH
    assert len(nonces) == 0  # a refused request leaves no nonce behind


def test_claimed_address_of_another_key_is_a_signer_mismatch(
    alice: LocalAccount, bob: LocalAccount, domain: SigningDomain
) -> None:
    headers = _headers(alice, domain)
    headers["X-Prime-Address"] = bob.address
    with pytest.raises(RequestAuthError) as info:
        _verify(headers, domain, NonceCache())
    assert info.value.code is AuthFailure.SIGNER_MISMATCH


def test_request_for_another_domain_is_a_signer_mismatch(alice: LocalAccount, domain: SigningDomain) -> None:
    other = SigningDomain(1, domain.verifying_contract)
    with pytest.raises(RequestAuthError) as info:
        _verify(_headers(alice, other), domain, NonceCache())
    assert info.value.code is AuthFailure.SIGNER_MISMATCH


def test_nonce_cache_shorter_than_the_timestamp_window_is_a_config_error(
    alice: LocalAccount, domain: SigningDomain
) -> None:
    with pytest.raises(SignatureError, match="window"):
        _verify(_headers(alice, domain), domain, NonceCache(max_skew=100))


def test_a_nonce_is_held_while_its_timestamp_is_acceptable() -> None:
    cache = NonceCache(max_skew=300)
    cache.add("0xA", b"\x01" * 16, timestamp=1000, now=1000)
    with pytest.raises(RequestAuthError) as replay:
        cache.add("0xA", b"\x01" * 16, timestamp=1000, now=1300)  # still within the skew: a replay
    assert replay.value.code is AuthFailure.REPLAYED_NONCE
    cache.add("0xB", b"\x02" * 16, timestamp=1301, now=1301)  # past the skew, the first is forgotten
    assert len(cache) == 1


def test_a_signer_past_the_cache_size_pushes_out_only_its_own_oldest_nonces_and_is_never_told_full() -> None:
    """Issue 32, attack 5: four members kept a shared cache full and validators got `503 nonce_cache_full`."""
    cache = NonceCache(max_skew=300, max_entries=100)
    cache.add("0xValidator", b"\xff" * 16, timestamp=1000, now=1000)
    for i in range(1000):  # one flooding signer, a request a tenth of a second, for 100 s
        cache.add("0xFlood", i.to_bytes(16, "big"), timestamp=1000 + i // 10, now=1000 + i / 10)
    assert len(cache) <= 100 and cache.held("0xValidator") == 1
    with pytest.raises(RequestAuthError) as replay:
        cache.add("0xValidator", b"\xff" * 16, timestamp=1000, now=1100)  # the validator's nonce is still held
    assert replay.value.code is AuthFailure.REPLAYED_NONCE
    cache.add("0xValidator", b"\xfe" * 16, timestamp=1001, now=1100)  # and it is served
    with pytest.raises(RequestAuthError) as old:  # what the flooder forgot cannot be replayed: its floor refuses it
        cache.add("0xFlood", (0).to_bytes(16, "big"), timestamp=1000, now=1100)
    assert old.value.code is AuthFailure.NONCE_WINDOW
    cache.add("0xFlood", b"\x01" * 16, timestamp=1100, now=1100)  # a request it signs now is served


def test_a_discarded_nonce_can_be_used_again() -> None:
    cache = NonceCache()
    cache.add("0xA", b"\x01" * 16, timestamp=1000, now=1000)
    cache.discard("0xA", b"\x01" * 16)
    assert len(cache) == 0
    cache.add("0xA", b"\x01" * 16, timestamp=1000, now=1001)


def test_nonce_cache_admits_each_nonce_once_across_threads() -> None:
    cache = NonceCache()
    accepted: list[int] = []
    lock = threading.Lock()

    def worker(thread: int) -> None:
        for i in range(200):
            try:
                cache.add("0xA", i.to_bytes(16, "big"), timestamp=0, now=0)
            except RequestAuthError:
                continue
            with lock:
                accepted.append(i)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(accepted) == list(range(200))
