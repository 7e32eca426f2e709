"""Where checkpoint bytes come from: `Source` (one origin or relay, as one download measures it) and `SourcePool`
(the sources a long-lived process keeps across downloads).

A `Source` lives for one download: its throughput, transfers in flight, failures and ban. A ban carries an
`offence` when the source proved itself hostile (bytes that failed their hash, a manifest the trainer did not
sign, a body larger than the manifest says), as opposed to being slow, busy or unreachable.

A `SourcePool` holds the configured sources (never dropped) and the ones learned from gossip adverts, which any
peer can send. Learned sources are therefore scored, capped and expire:
- at most `max_learned` of them, and at most `max_per_advertiser` from one advertiser;
- each expires `ttl` s after its last advert;
- each download scores them: +1 for delivering verified shards, -1 for failing without delivering; after
  `max_strikes` failed downloads in a row, or at once for an offence, a source is dropped and its URL refused
  for `deny_for` s;
- a full pool takes a new advert only in place of a source that has not delivered yet (score 0 or less), so a
  flood of adverts cannot push out relays that proved useful.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardcast import RelayError, SourceError

log = logging.getLogger(__name__)

MAX_FAILURES = 5  # consecutive transport failures before a source is dropped from a download


@dataclass
class Source:
    """One origin or relay, and what this download has measured of it."""

    url: str
    throughput: float = 0.0  # bytes/s, exponentially weighted; 0 until measured
    in_flight: int = 0
    failures: int = 0  # consecutive
    retry_at: float = 0.0  # monotonic time before which it is not asked again
    banned: str | None = None  # why it is out of this download
    received: int = 0  # bytes of verified shards
    offence: str | None = None  # set with `banned` when the source proved hostile, not merely unreliable

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise RelayError(f"source {self.url!r} must be an http:// or https:// URL")

    def succeeded(self, size: int, seconds: float) -> None:
        rate = size / max(seconds, 1e-6)
        self.throughput = rate if self.throughput == 0 else 0.7 * self.throughput + 0.3 * rate
        self.failures = 0
        self.received += size

    def failed(self, error: SourceError) -> None:
        """Back off: for as long as a busy source asked, else exponentially; drop it after repeated failures."""
        if error.busy_for is not None:
            self.retry_at = time.monotonic() + error.busy_for
            return
        self.failures += 1
        self.retry_at = time.monotonic() + 0.2 * 2 ** min(self.failures, 5)
        if self.failures >= MAX_FAILURES:
            self.banned = f"{self.failures} failures in a row, the last: {error.reason}"

    def convict(self, offence: str) -> bool:
        """Ban it for something only a hostile or broken peer does; True if this is news."""
        news = self.offence is None
        self.offence = self.offence or offence
        self.banned = self.banned or offence
        return news


def advert_url(url: str) -> str | None:
    """`url` without a trailing slash if it can be a source (http or https with a host), else None."""
    url = url.rstrip("/")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return url


@dataclass
class Learned:
    """A source known from adverts, and its record over the downloads it took part in."""

    url: str
    advertiser: str
    expires: float  # clock time of its last advert plus the pool's ttl
    score: int = 0
    strikes: int = 0  # downloads in a row it failed in without delivering


class SourcePool:
    """The configured sources plus those learned from adverts, kept across downloads (module docstring).

    `checkout()` gives one download its `Source`s, seeded with the throughput measured last time; `settle()`
    folds what the download saw back in. `fetch_checkpoint` accepts a pool in place of a URL list and does both.
    Single-threaded: use it from one event loop.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        max_learned: int = 16,
        max_per_advertiser: int = 2,
        ttl: float = 180.0,
        max_strikes: int = 3,
        deny_for: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_learned < 0 or max_per_advertiser < 1 or max_strikes < 1 or ttl <= 0 or deny_for < 0:
            raise ValueError("max_per_advertiser, max_strikes and ttl must be positive, the others not negative")
        self.fixed = [Source(url).url for url in urls]
        self.max_learned, self.max_per_advertiser = max_learned, max_per_advertiser
        self.ttl, self.max_strikes, self.deny_for = ttl, max_strikes, deny_for
        self.clock = clock
        self.learned: dict[str, Learned] = {}
        self._denied: dict[str, float] = {}  # url -> clock time until which its adverts are refused
        self._throughput: dict[str, float] = {}

    # --- adverts -------------------------------------------------------------------------------------

    def advertise(self, url: str, advertiser: str = "") -> bool:
        """Learn `url` from an advert by `advertiser` (a gossip signer), or refresh its expiry.

        True if it is a learned source now; False if it is not http(s), configured already, refused for an
        earlier offence or strikes, over the advertiser's share, or the pool is full of sources that delivered.
        """
        clean = advert_url(url)
        if clean is None or clean in self.fixed:
            return False
        now = self.clock()
        self._expire(now)
        if self._denied.get(clean, now) > now:
            return False
        known = self.learned.get(clean)
        if known is not None:
            known.expires = now + self.ttl
            return True
        if advertiser and sum(s.advertiser == advertiser for s in self.learned.values()) >= self.max_per_advertiser:
            return False
        if len(self.learned) >= self.max_learned:
            if not self.learned:
                return False
            worst = min(self.learned.values(), key=lambda s: (s.score, s.expires))
            if worst.score > 0:
                return False
            del self.learned[worst.url]
            log.info("source %s makes room for %s, advertised by %s", worst.url, clean, advertiser or "?")
        self.learned[clean] = Learned(clean, advertiser, now + self.ttl)
        return True

    def _expire(self, now: float) -> None:
        for url in [u for u, s in self.learned.items() if s.expires <= now]:
            del self.learned[url]
        for url in [u for u, until in self._denied.items() if until <= now]:
            del self._denied[url]

    def _deny(self, url: str, seconds: float, why: str) -> None:
        self.learned.pop(url, None)
        if len(self._denied) >= 4096:  # bounded: forget the refusal that ends first
            del self._denied[min(self._denied, key=self._denied.__getitem__)]
        self._denied[url] = self.clock() + seconds
        log.warning("dropping advertised source %s for %.0f s: %s", url, seconds, why)

    def denied(self, url: str) -> bool:
        return self._denied.get(url.rstrip("/"), 0.0) > self.clock()

    # --- downloads -----------------------------------------------------------------------------------

    def urls(self) -> list[str]:
        """The configured sources, then the live learned ones, best scored first."""
        self._expire(self.clock())
        learned = sorted(self.learned.values(), key=lambda s: -s.score)
        return self.fixed + [s.url for s in learned]

    def checkout(self) -> list[Source]:
        """Fresh `Source`s for one download, each starting from the throughput measured last time."""
        return [Source(url, throughput=self._throughput.get(url, 0.0)) for url in self.urls()]

    def settle(self, sources: Sequence[Source]) -> None:
        """Fold one download's outcome into the learned sources' scores; drop offenders and repeated failures."""
        for source in sources:
            if source.throughput > 0:
                self._throughput[source.url] = source.throughput
            learned = self.learned.get(source.url)
            if learned is None:
                if source.offence is not None:
                    log.warning("configured source %s: %s", source.url, source.offence)
                continue
            if source.offence is not None:
                self._deny(source.url, self.deny_for, source.offence)
            elif source.received > 0:
                learned.score += 1
                learned.strikes = 0
            elif source.failures > 0 or source.banned is not None:
                learned.score -= 1
                learned.strikes += 1
                if learned.strikes >= self.max_strikes:
                    self._deny(source.url, self.ttl, f"{learned.strikes} failed downloads in a row")
        for url in [u for u in self._throughput if u not in self.fixed and u not in self.learned]:
            del self._throughput[url]
