"""The p2p layer (DESIGN section 10): a libp2p host per node, gossip per pool, status requests.

Transport: `host.P2PNode` (libp2p in a trio thread, `bridge.TrioThread`, behind an asyncio API) and
`identity` (the Ethereum key is the libp2p key). Protocol: `messages` (topics, signed messages, canonical
JSON), `guard` (what is dropped, and what a drop costs the peer), `status` (`/prime/status/1.0.0`).
See docs/p2p.md.
"""

from p2p.config import P2PConfig
from p2p.errors import MessageError, NotRunningError, P2PError, PeerError
from p2p.guard import DropReason
from p2p.host import P2PNode
from p2p.identity import address_of, peer_id_of
from p2p.messages import (
    RelayAdvert,
    SignedMessage,
    Topic,
    TopicKind,
    ValidatorHeartbeat,
    attestations_topic,
    checkpoints_topic,
    relays_topic,
    sign_message,
    validators_topic,
)
from p2p.subscription import Received, Subscription

__all__ = [
    "DropReason",
    "MessageError",
    "NotRunningError",
    "P2PConfig",
    "P2PError",
    "P2PNode",
    "PeerError",
    "Received",
    "RelayAdvert",
    "SignedMessage",
    "Subscription",
    "Topic",
    "TopicKind",
    "ValidatorHeartbeat",
    "address_of",
    "attestations_topic",
    "checkpoints_topic",
    "peer_id_of",
    "relays_topic",
    "sign_message",
    "validators_topic",
]
