"""What a host checks before a gossip message reaches the application, and what a drop costs the peer.

`MessageGuard.inspect` runs on every message from another peer, as gossipsub's topic validator, so a
dropped message is neither delivered nor forwarded. The checks, cheapest first, so that a flood costs
little before it is refused:

0. forged      libp2p's signature fails (`reject_forged`; pubsub checks it before `inspect` runs)
1. banned      the originating peer is banned already (gossipsub's blacklist catches most of these first)
2. oversized   more than `max_message_bytes`
3. rate        the originating peer's token bucket is empty
4. malformed   not the canonical JSON of a well-formed message (messages.SignedMessage.decode)
5. topic       the message's type or pool is not the topic's
6. stale       a relay advert or validator heartbeat whose timestamp is more than `max_clock_skew_s` off this
               host's clock
7. signature   unrecoverable (`bad_signature`), or recovers to another address than the originating
               peer's (`signer_mismatch`); the peer's address comes from its peer id (identity.address_of)

The originating peer, the author, is gossipsub's `from` field. libp2p's message signature binds it to the
author's key, and pubsub checks that signature before `inspect` runs (strict signing), so every message
`inspect` sees was written by its originating peer. Each drop is logged, counted in
`p2p_messages_dropped_total{reason}`, and costs the author `PENALTY[reason]` points. The forwarding peer,
when it is another, pays nothing: it only handed over bytes their author signed, and an honest relay whose
limits differ (size, clock, a newer message type) forwards what this host refuses.

A message whose libp2p signature fails (`forged_origin`, reported by security.ForgeryReportingPubsub) is
the other way round: anyone can write any `from`, so the named author pays nothing, and the forwarding peer,
proven by the noise handshake, pays, since honest hosts check that signature before they forward.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from core.metrics import Registry
from core.ratelimit import TokenBucket
from p2p.config import P2PConfig
from p2p.errors import MessageError, P2PError
from p2p.identity import address_of
from p2p.messages import TOPIC_PAYLOAD, RelayAdvert, SignedMessage, Topic, ValidatorHeartbeat
from protocol.signing import SignatureError, SigningDomain

log = logging.getLogger("p2p")

MAX_TRACKED_PEERS = 10_000  # buckets and scores kept; neutral ones are forgotten beyond this


class DropReason(StrEnum):
    BANNED = "banned"
    OVERSIZED = "oversized"
    RATE_LIMITED = "rate_limited"
    MALFORMED = "malformed"
    WRONG_TOPIC = "wrong_topic"
    STALE = "stale"
    BAD_SIGNATURE = "bad_signature"
    SIGNER_MISMATCH = "signer_mismatch"
    FORGED_ORIGIN = "forged_origin"  # libp2p's signature does not verify with the `from` peer's key


PENALTY: dict[DropReason, float] = {
    DropReason.BANNED: 0.0,
    DropReason.OVERSIZED: 20.0,
    DropReason.RATE_LIMITED: 2.0,
    DropReason.MALFORMED: 20.0,
    DropReason.WRONG_TOPIC: 20.0,
    DropReason.STALE: 5.0,
    DropReason.BAD_SIGNATURE: 50.0,
    DropReason.SIGNER_MISMATCH: 50.0,
    DropReason.FORGED_ORIGIN: 50.0,
}


class PeerScores:
    """A score per peer: 0 when unknown, lowered by penalties, recovering linearly back to 0.

    A peer whose score reaches `ban_score` is banned for good (for this host's life).
    """

    def __init__(self, ban_score: float, recovery_per_s: float) -> None:
        self.ban_score, self.recovery_per_s = ban_score, recovery_per_s
        self._scores: dict[str, tuple[float, float]] = {}  # peer -> (score, when)
        self.banned: set[str] = set()

    def score(self, peer: str, now: float) -> float:
        value, when = self._scores.get(peer, (0.0, now))
        return min(0.0, value + (now - when) * self.recovery_per_s)

    def penalize(self, peer: str, points: float, now: float) -> bool:
        """Lowers `peer`'s score; True when this penalty bans it."""
        value = self.score(peer, now) - points
        self._scores[peer] = (value, now)
        if value <= self.ban_score and peer not in self.banned:
            self.banned.add(peer)
            return True
        return False

    def forget_neutral(self, now: float) -> None:
        self._scores = {p: s for p, s in self._scores.items() if p in self.banned or self.score(p, now) < 0}


@dataclass(frozen=True)
class Verdict:
    """`message` when accepted; else `reason`. `banned`: peers this message's drop has just banned."""

    message: SignedMessage | None
    reason: DropReason | None = None
    banned: tuple[str, ...] = ()


class MessageGuard:
    """Checks incoming gossip for one host; used from the host's trio thread only."""

    def __init__(
        self,
        config: P2PConfig,
        domain: SigningDomain,
        registry: Registry,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config, self.domain = config, domain
        self.clock, self.wall_clock = clock, wall_clock
        self.scores = PeerScores(config.ban_score, config.score_recovery_per_s)
        self._buckets: dict[str, TokenBucket] = {}
        self._dropped = registry.counter("p2p_messages_dropped_total", "Gossip messages dropped, by reason.")
        self._accepted = registry.counter("p2p_messages_accepted_total", "Gossip messages from peers accepted.")
        self._bans = registry.counter("p2p_peers_banned_total", "Peers banned for a score at the threshold.")

    def inspect(self, topic: str, data: bytes, origin: str, forwarder: str) -> Verdict:
        """Accepts or drops `data`, which peer `origin` wrote (its libp2p signature verified) on `topic`, and
        peer `forwarder` handed over. A drop costs `origin` only."""
        now = self.clock()
        reason, detail, message = self._check(topic, data, origin, now)
        if reason is None:
            self._accepted.inc()
            return Verdict(message)
        return self._drop(reason, detail, topic, origin, forwarder, now)

    def reject_forged(self, topic: str, origin: str, forwarder: str) -> Verdict:
        """Drops a message naming `origin` as its author whose libp2p signature does not verify with that key.

        Costs `forwarder`, the peer proven to have sent it, and not `origin`, whom anyone can name.
        """
        return self._drop(DropReason.FORGED_ORIGIN, "libp2p signature fails", topic, origin, forwarder, self.clock())

    def is_banned(self, peer: str) -> bool:
        return peer in self.scores.banned

    def _drop(self, reason: DropReason, detail: str, topic: str, origin: str, forwarder: str, now: float) -> Verdict:
        level = logging.DEBUG if reason is DropReason.BANNED else logging.WARNING
        log.log(level, "dropped gossip from %s (via %s) on %s: %s: %.300s", origin, forwarder, topic, reason, detail)
        blamed = self._blame(reason, origin, forwarder)
        banned = [p for p in blamed if self.scores.penalize(p, PENALTY[reason], now)]
        # counted once the penalty is in: whoever sees the drop in the metrics sees its cost in the scores
        self._dropped.inc(reason=reason.value)
        for peer in banned:
            self._bans.inc()
            log.warning(
                "banning peer %s: score %.1f <= %.1f", peer, self.scores.score(peer, now), self.config.ban_score
            )
        if len(self._buckets) > MAX_TRACKED_PEERS:
            self._buckets = {p: b for p, b in self._buckets.items() if not b.full(now)}
            self.scores.forget_neutral(now)
        return Verdict(None, reason, tuple(banned))

    @staticmethod
    def _blame(reason: DropReason, origin: str, forwarder: str) -> list[str]:
        """Who pays for a drop: the peer proven to have done it, never one whom another could name."""
        if reason is DropReason.BANNED:
            return []
        if reason is DropReason.FORGED_ORIGIN:
            return [forwarder]  # the noise handshake proved who sent it; `from` proves nothing here
        return [origin]  # libp2p's signature proved who wrote it; the forwarder only relayed the author's bytes

    def _check(
        self, topic: str, data: bytes, origin: str, now: float
    ) -> tuple[DropReason | None, str, SignedMessage | None]:
        if self.is_banned(origin):
            return DropReason.BANNED, "peer is banned", None
        if len(data) > self.config.max_message_bytes:
            return DropReason.OVERSIZED, f"{len(data)} bytes > {self.config.max_message_bytes}", None
        bucket = self._buckets.get(origin)
        if bucket is None:
            bucket = self._buckets[origin] = TokenBucket(self.config.rate_per_s, self.config.burst, now)
        if not bucket.take(now):
            return DropReason.RATE_LIMITED, f"more than {self.config.rate_per_s}/s (burst {self.config.burst})", None
        try:
            message = SignedMessage.decode(data)
        except MessageError as exc:
            return DropReason.MALFORMED, str(exc), None
        expected = Topic.parse(topic)
        if not isinstance(message.payload, TOPIC_PAYLOAD[expected.kind]) or message.pool_id != expected.pool_id:
            return DropReason.WRONG_TOPIC, f"a {message.type_name} message of pool {message.pool_id}", None
        if isinstance(message.payload, (RelayAdvert, ValidatorHeartbeat)):
            skew = abs(self.wall_clock() - message.payload.timestamp)
            if skew > self.config.max_clock_skew_s:
                return DropReason.STALE, f"timestamp {message.payload.timestamp} is {skew:.0f} s off", None
        try:
            signer = message.signer(self.domain)
        except SignatureError as exc:
            return DropReason.BAD_SIGNATURE, str(exc), None
        try:
            peer_address = address_of(origin)
        except P2PError as exc:
            return DropReason.SIGNER_MISMATCH, f"the peer has no Ethereum address: {exc}", None
        if signer != peer_address:
            return DropReason.SIGNER_MISMATCH, f"signed by {signer}, the peer is {peer_address}", None
        return None, "", message
