"""One identity for chain and network: a node's secp256k1 Ethereum key is also its libp2p key.

A secp256k1 public key serialises to 37 bytes, under libp2p's 42-byte inlining limit, so the peer id is an
identity multihash that holds the compressed public key itself (`16Uiu2HAm...`). `address_of` reads that
key back and derives the Ethereum address from it: no lookup, no extra message, and a peer cannot claim
an address it does not hold the key of (the transport handshake proves the key).
"""

from __future__ import annotations

import functools

from eth_account.signers.local import LocalAccount
from eth_keys import keys
from eth_keys.exceptions import ValidationError as KeyValidationError
from libp2p.crypto.keys import KeyPair, KeyType
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.peer.id import ID

from p2p.errors import P2PError


def key_pair_of(account: LocalAccount) -> KeyPair:
    """The libp2p key pair of `account`: the same secp256k1 secret, so the same public key."""
    return create_new_key_pair(bytes(account.key))


def peer_id_of(account: LocalAccount) -> str:
    """The base58 peer id a host built from `account` has."""
    return ID.from_pubkey(key_pair_of(account).public_key).to_base58()


@functools.lru_cache(maxsize=4096)
def address_of(peer_id: str) -> str:
    """The checksummed Ethereum address of the secp256k1 key inlined in `peer_id` (base58).

    Raises P2PError for a peer id that is not base58, holds no inlined key, or holds another key type.
    """
    try:
        public_key = ID.from_base58(peer_id).extract_public_key()
    except Exception as exc:  # base58, multihash and protobuf decoders each raise their own types
        raise P2PError("not a peer id with an inlined public key", peer_id=peer_id, error=str(exc)) from None
    if public_key is None:
        raise P2PError("peer id holds no inlined public key (a hashed key, e.g. RSA)", peer_id=peer_id)
    if public_key.get_type() != KeyType.Secp256k1:
        raise P2PError("peer id key is not secp256k1", peer_id=peer_id, key_type=public_key.get_type().name)
    try:
        return keys.PublicKey.from_compressed_bytes(public_key.to_bytes()).to_checksum_address()
    except KeyValidationError as exc:
        raise P2PError("peer id holds an invalid secp256k1 key", peer_id=peer_id, error=str(exc)) from None
