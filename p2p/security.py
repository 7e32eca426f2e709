"""How a host knows who it talks to and who wrote what: noise for connections, signatures for gossip.

Two different peers matter for every gossip message, and each is proven separately:

- the sender, the peer on the other end of the connection: its peer id is proven by the connection's
  security handshake. A host offers noise only (`security_options`). py-libp2p's default also offers
  `/plaintext/2.0.0`, where a dialer just states a public key and proves nothing: a js-libp2p dialer
  claimed the trainer's peer id that way and had the trainer banned for junk it relayed (issue 19, item 7).
  secio is deprecated across libp2p. TLS works between py-libp2p hosts, but py-libp2p reaches
  into CPython's `SSLContext` by struct offset through ctypes and calls whichever libssl it finds by name,
  which need not be the one `_ssl` uses; every prime node speaks noise, so TLS would add that risk and
  no peer.
- the author, gossipsub's `from`: libp2p's message signature (strict signing) binds it to the author's
  key. py-libp2p drops a message whose signature fails before any topic validator runs and tells nobody;
  `ForgeryReportingPubsub` reports the peer that handed it over first, since it, not the named author, is
  the one known to have sent it.
"""

from __future__ import annotations

from collections.abc import Callable

from libp2p.abc import IHost, IPubsubRouter
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TSecurityOptions
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import signature_validator
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

SECURITY_PROTOCOLS = (NOISE_PROTOCOL_ID,)  # what a host offers and accepts, in order of preference


def security_options(key_pair: KeyPair) -> TSecurityOptions:
    """`new_host(sec_opt=...)`: noise only, so that every connection proves the peer's key."""
    # noise's static key is a fresh X25519 key, signed in the handshake by the libp2p key; as in new_host
    return {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}


def signed_by_origin(msg: rpc_pb2.Message) -> bool:
    """Whether libp2p's signature on `msg` verifies with the key of the peer its `from` field names."""
    try:
        return bool(msg.signature) and signature_validator(msg)
    except Exception:  # a `from` or `key` that does not parse raises, of several types
        return False


class ForgeryReportingPubsub(Pubsub):
    """py-libp2p's `Pubsub` with strict signing, which calls `on_forged(forwarder, msg)` before it drops a
    message from another peer whose libp2p signature does not verify with its `from` peer's key.

    `Pubsub.push_msg` checks the same signature again; one more secp256k1 verification per message is the
    price of learning who handed a forgery over without copying py-libp2p's receive path.
    """

    def __init__(self, host: IHost, router: IPubsubRouter, on_forged: Callable[[ID, rpc_pb2.Message], None]) -> None:
        super().__init__(host, router, strict_signing=True)
        self._on_forged = on_forged

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        received = msg_forwarder != self.my_id
        if received and not self.is_peer_blacklisted(msg_forwarder) and not signed_by_origin(msg):
            self._on_forged(msg_forwarder, msg)
            return
        await super().push_msg(msg_forwarder, msg)
