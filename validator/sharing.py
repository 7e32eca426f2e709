"""Validators that share a pool: which of them checks each work key, and which of them may slash it.

A pool may appoint several validators (ComputePool `setValidator`). Each one reads every submission, but checks
only its share, so K validators check K times the files one could, and none verifies what another has already
judged. The split is rendezvous hashing (highest random weight): every validator ranks the appointed
validators for a key by `sha256(work key || validator address)`, the same ranking on every machine, and the key
belongs to the first `replication` of them that are alive (`replicas`). The pool's spec fixes `replication`
(`protocol.terms.PoolTerms.replication`), so every validator splits alike.

- **Every key has exactly one primary**, the first live validator of its ranking; with `replication` r, the next
  r - 1 live ones check it too, and the trainer trains on it once `min_attestations` distinct validators accepted.
- **Who sends invalidateBatch**: a replica that rejects a key waits `rank x takeover_seconds` (`slash_delay`), reads
  the chain again, and sends only if the work is still pending: the primary sends at once and a second replica
  finds it invalidated, yet a primary that accepted a file its replica rejects does not let the cheater escape.
- **Liveness** comes from gossip: each validator publishes a signed heartbeat on the pool's validators topic, and
  only its signed timestamp counts. A validator not heard of for `takeover_seconds` is taken for gone, and its keys
  pass to the next validator of each key's ranking; removing one validator moves only its own keys (the property
  of rendezvous hashing). Attestations are no sign of life: they carry no time, and one replayed would look like
  one new. A validator never heard of is presumed alive until `takeover_seconds` after this one
  started, so validators starting together do not each take the whole pool.
- **The safety net**: a key of another validator's share whose verdict has not been heard half-way through its
  challenge window is checked by every validator that holds it (the coordinator is asked first, so a verdict
  merely lost on gossip costs no download): a validator that heartbeats but never judges cannot let a cheater
  be paid.
- **The set** is the chain's (`ledger.validators.ValidatorSet`), never a configuration list; a heartbeat from an
  address the chain does not list is ignored.

The rules here are pure: a `Peers` view in, a list of addresses out. `validator.daemon` applies them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from eth_utils import to_canonical_address, to_checksum_address


def rank(work_key: bytes, validators: Iterable[str]) -> list[str]:
    """`validators` (checksummed) in the order they hold `work_key`: the highest `sha256(key || address)` first."""

    def weight(address: str) -> bytes:
        return hashlib.sha256(work_key + to_canonical_address(address)).digest()

    return sorted({to_checksum_address(v) for v in validators}, key=weight, reverse=True)


def replicas(work_key: bytes, validators: Iterable[str], live: Iterable[str], replication: int) -> list[str]:
    """The validators that check `work_key`: the first `replication` live ones of its ranking, primary first."""
    alive = {to_checksum_address(v) for v in live}
    return [v for v in rank(work_key, validators) if v in alive][:replication]


@dataclass
class Peers:
    """What one validator knows of the pool's validators: the chain's set, and when each was last heard.

    Times are the caller's clock (monotonic seconds); `started` is when this validator began listening.
    """

    me: str
    takeover_seconds: float
    started: float
    validators: frozenset[str] = frozenset()  # the chain's set (this validator is always counted in)
    heard: dict[str, float] = field(default_factory=dict)  # validator -> last heartbeat or attestation

    def __post_init__(self) -> None:
        self.me = to_checksum_address(self.me)
        self.set_validators(self.validators)

    def set_validators(self, validators: Iterable[str]) -> None:
        self.validators = frozenset(to_checksum_address(v) for v in validators) | {self.me}

    def hear(self, validator: str, now: float) -> bool:
        """Notes a sign of life of `validator`; False (ignored) when the chain does not list it."""
        address = to_checksum_address(validator)
        if address not in self.validators:
            return False
        self.heard[address] = max(now, self.heard.get(address, now))
        return True

    def alive(self, validator: str, now: float) -> bool:
        if validator == self.me:
            return True
        last = self.heard.get(validator, self.started)  # never heard of: presumed alive for a while after we start
        return now - last < self.takeover_seconds

    def heard_recently(self, now: float) -> frozenset[str]:
        """The other validators whose heartbeat arrived within the takeover period (not merely presumed alive)."""
        return frozenset(
            v for v, last in self.heard.items() if v in self.validators and now - last < self.takeover_seconds
        )

    def live(self, now: float) -> frozenset[str]:
        return frozenset(v for v in self.validators if self.alive(v, now))

    def replicas(self, work_key: bytes, replication: int, now: float) -> list[str]:
        return replicas(work_key, self.validators, self.live(now), replication)

    def mine(self, work_key: bytes, replication: int, now: float) -> bool:
        """Whether this validator is one of the key's live replicas."""
        return self.me in self.replicas(work_key, replication, now)

    def slash_delay(self, work_key: bytes, replication: int, now: float) -> float | None:
        """Seconds this validator waits after rejecting `work_key` before it reads the chain and invalidates: 0 for
        the primary, `rank x takeover_seconds` for the rank-th replica; None when it is no replica of the key."""
        holders = self.replicas(work_key, replication, now)
        if self.me not in holders:
            return None
        return holders.index(self.me) * self.takeover_seconds
