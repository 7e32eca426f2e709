"""Token buckets on an explicit clock, and a bounded table of them keyed by who asks (an address, a signer, a peer).

The relay server keeps its own awaitable bucket (`shardcast.server.TokenBucket`): it makes a caller wait off a
byte debt, where these answer yes or no at once.
"""

from __future__ import annotations

from collections import OrderedDict


class TokenBucket:
    """`burst` tokens, refilled at `rate` a second; each accepted event takes one."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.last = float(burst), now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def full(self, now: float) -> bool:
        return self.tokens + (now - self.last) * self.rate >= self.burst


class RateLimiter:
    """One `TokenBucket` per key, at most `max_keys` of them: the least recently seen key is forgotten first (a
    forgotten key starts again with a full bucket, so forgetting only ever errs towards letting a request in)."""

    def __init__(self, rate: float, *, burst: int, max_keys: int = 10_000) -> None:
        if rate <= 0 or burst < 1 or max_keys < 1:
            raise ValueError(
                f"RateLimiter needs rate > 0, burst >= 1 and max_keys >= 1, got {rate}, {burst}, {max_keys}"
            )
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    @property
    def wait(self) -> float:
        """Seconds until an exhausted key may try again (one token)."""
        return 1.0 / self.rate

    def allow(self, key: str, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, now)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket.take(now)
