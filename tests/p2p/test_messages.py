"""Topics, the canonical encoding of signed messages, and peer id <-> address: pure, no hosts."""

from __future__ import annotations

import json

import pytest
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair as ed25519_key_pair
from libp2p.peer.id import ID

from core.safejson import json_too_deep
from p2p import (
    MessageError,
    P2PError,
    RelayAdvert,
    SignedMessage,
    Topic,
    TopicKind,
    address_of,
    checkpoints_topic,
    peer_id_of,
    sign_message,
)
from p2p.messages import Payload
from protocol.signing import Attestation, Checkpoint, SigningDomain

DOMAIN = SigningDomain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
ACCOUNT = Account.from_key(b"\x01" * 32)
PAYLOADS: list[Payload] = [
    Checkpoint(7, 3, b"\xab" * 32),
    RelayAdvert(7, "https://relay.example.org:8443/x", 12_345, 1_700_000_000),
    Attestation(2**256 - 1, b"\x00" * 32, True, 0),
]


def test_peer_id_maps_to_the_ethereum_address_of_the_same_key() -> None:
    peer_id = peer_id_of(ACCOUNT)
    assert peer_id.startswith("16Uiu2HAm")  # an identity multihash of a secp256k1 key
    assert address_of(peer_id) == ACCOUNT.address


@pytest.mark.parametrize("text", ["", "not-base58-0OIl", "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"])
def test_address_of_refuses_what_is_not_a_secp256k1_peer_id(text: str) -> None:
    with pytest.raises(P2PError):
        address_of(text)


def test_address_of_refuses_an_ed25519_peer_id() -> None:
    with pytest.raises(P2PError, match="not secp256k1"):
        address_of(ID.from_pubkey(ed25519_key_pair().public_key).to_base58())


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_signed_messages_round_trip_through_their_canonical_encoding(payload: Payload) -> None:
    message = sign_message(payload, ACCOUNT, DOMAIN)
    data = message.encode()
    assert SignedMessage.decode(data) == message
    assert json.loads(data)["type"] in ("checkpoint", "relay", "attestation")
    assert message.signer(DOMAIN) == ACCOUNT.address
    assert message.signer(SigningDomain(1, DOMAIN.verifying_contract)) != ACCOUNT.address  # bound to the chain


def _document() -> dict[str, object]:
    return json.loads(sign_message(PAYLOADS[0], ACCOUNT, DOMAIN).encode())


def _encode(document: dict[str, object]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: d.update(step=True), "uint64"),
        (lambda d: d.update(step=-1), "uint64"),
        (lambda d: d.update(step=2**64), "uint64"),
        (lambda d: d.update(manifest_hash="0x" + "AB" * 32), "hex"),
        (lambda d: d.update(manifest_hash="0xabab"), "hex"),
        (lambda d: d.update(signature="0x00"), "hex"),
        (lambda d: d.update(type="manifest"), "unknown message type"),
        (lambda d: d.update(extra=1), "wrong fields"),
        (lambda d: d.pop("pool_id"), "wrong fields"),
    ],
)
def test_decode_refuses_a_bad_field(change: object, why: str) -> None:
    document = _document()
    change(document)  # type: ignore[operator]
    with pytest.raises(MessageError, match=why):
        SignedMessage.decode(_encode(document))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b"\xff\xfe",
        b"[" * 100_000,
        json.dumps(_document(), sort_keys=True).encode(),  # whitespace: another spelling of the same message
        json.dumps(_document(), separators=(",", ":")).encode()[::-1],
    ],
)
def test_decode_refuses_what_is_not_one_canonical_json_object(data: bytes) -> None:
    with pytest.raises(MessageError):
        SignedMessage.decode(data)


def test_decode_refuses_a_relay_advert_for_a_non_http_url() -> None:
    document = json.loads(sign_message(PAYLOADS[1], ACCOUNT, DOMAIN).encode())
    document["url"] = "file:///etc/passwd"
    with pytest.raises(MessageError, match="http"):
        SignedMessage.decode(_encode(document))


def test_topics_are_per_pool_and_parse_back() -> None:
    assert checkpoints_topic(7) == "/prime/7/checkpoints"
    assert Topic.parse("/prime/7/relays") == Topic(7, TopicKind.RELAYS)
    for bad in ("/prime/7/weights", "/prime/07/relays", "/prime//relays", "prime/7/relays", f"/prime/{2**256}/relays"):
        with pytest.raises(MessageError):
            Topic.parse(bad)


def test_nesting_is_bounded_before_parsing_but_brackets_in_strings_do_not_count() -> None:
    assert json_too_deep(b"[" * 5, 4)
    assert json_too_deep(b'{"a":[[[[1]]]]}', 4)
    assert not json_too_deep(b'{"url":"[[[[[[\\"[[[[["}', 1)
    ipv6 = RelayAdvert(7, "http://[::1]:8000/", 1, 1_700_000_000)  # brackets in a string, depth 1
    message = sign_message(ipv6, ACCOUNT, DOMAIN)
    assert SignedMessage.decode(message.encode()) == message
    with pytest.raises(MessageError, match="nested deeper"):
        SignedMessage.decode(b"[" * 32768 + b"]" * 32768)  # would overflow the C stack if parsed
