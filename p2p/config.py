"""`P2PConfig`: the limits and timeouts of one libp2p host, validated when it is built."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from p2p.errors import P2PError

KiB = 1024


def _in_range(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise P2PError(f"P2PConfig.{name} must lie in [{low}, {high}]", field=name, value=value)


@dataclass(frozen=True)
class P2PConfig:
    """How a node's p2p host listens, what it accepts from peers, and how long it waits for them.

    The defaults suit a pool's gossip: a few announcements, adverts and attestations a second, each under a
    few KiB. Scores start at 0, fall by a penalty per dropped message and climb back by `score_recovery_per_s`
    towards 0; a peer at or below `ban_score` is disconnected and ignored for the rest of the host's life.
    """

    listen_host: str = "127.0.0.1"  # DESIGN section 11: loopback unless told otherwise
    listen_port: int = 0  # 0: any free port
    max_message_bytes: int = 64 * KiB  # a gossip message's data; more is dropped as `oversized`
    rate_per_s: float = 10.0  # token bucket refill, messages a second per originating peer
    burst: int = 50  # token bucket size
    ban_score: float = -100.0  # at or below: disconnect and ignore the peer
    score_recovery_per_s: float = 0.1  # points a second back towards 0
    max_clock_skew_s: int = 300  # relay adverts older or newer than this are `stale` (DESIGN section 5)
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 10.0  # a whole status request: stream, request, response
    max_status_bytes: int = 64 * KiB  # a status response
    max_inbound_requests: int = 32  # status requests served at once; more are refused
    subscription_buffer: int = 1024  # messages queued per subscription before new ones are dropped
    heartbeat_interval_s: int = 1  # gossipsub mesh maintenance (py-libp2p's default is 120 s)
    start_timeout_s: float = 30.0
    stop_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        try:
            ipaddress.IPv4Address(self.listen_host)
        except ValueError:
            raise P2PError("P2PConfig.listen_host must be an IPv4 address", value=self.listen_host) from None
        _in_range("listen_port", self.listen_port, 0, 65535)
        _in_range("max_message_bytes", self.max_message_bytes, 256, 1024 * KiB)
        _in_range("rate_per_s", self.rate_per_s, 0.001, 10_000)
        _in_range("burst", self.burst, 1, 100_000)
        _in_range("ban_score", self.ban_score, -1e9, -1)
        _in_range("score_recovery_per_s", self.score_recovery_per_s, 0, 1e6)
        _in_range("max_clock_skew_s", self.max_clock_skew_s, 1, 86_400)
        for name in ("connect_timeout_s", "request_timeout_s", "start_timeout_s", "stop_timeout_s"):
            _in_range(name, getattr(self, name), 0.1, 600)
        _in_range("max_status_bytes", self.max_status_bytes, 256, 16 * 1024 * KiB)
        _in_range("max_inbound_requests", self.max_inbound_requests, 1, 10_000)
        _in_range("subscription_buffer", self.subscription_buffer, 1, 1_000_000)
        _in_range("heartbeat_interval_s", self.heartbeat_interval_s, 1, 600)
        integers = ("listen_port", "max_message_bytes", "burst", "max_status_bytes", "max_inbound_requests")
        for name in (*integers, "subscription_buffer", "heartbeat_interval_s", "max_clock_skew_s"):
            if not isinstance(getattr(self, name), int):
                raise P2PError(f"P2PConfig.{name} must be an integer", field=name, value=getattr(self, name))
