"""Per-tenant token buckets (pure), per Router replica: one noisy tenant must not starve the others.
A bucket survives a tenants-file reload that keeps its limit, so rotating a key gives no fresh burst."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class TokenBucket:
    rate: float  # tokens per second
    burst: int  # bucket size
    tokens: float = -1.0  # -1: not used yet (the first use finds a full bucket)
    stamp: float = 0.0

    def take(self, now: float) -> float:
        """Spend one token: 0.0 when allowed, else the seconds until one is available."""
        if self.tokens < 0:
            self.tokens, self.stamp = float(self.burst), now
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RateLimiter:
    """tenant -> bucket for the tenants that have a limit; others pass."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.buckets: dict[str, TokenBucket] = {}

    def configure(self, limits: dict[str, tuple[float, int] | None]) -> None:
        """Set every tenant's (rate, burst); keep a bucket whose limit is unchanged."""
        old = self.buckets
        self.buckets = {t: old[t] if t in old and (old[t].rate, old[t].burst) == lim else TokenBucket(*lim)
                        for t, lim in limits.items() if lim is not None}

    def retry_after(self, tenant: str) -> int:
        """0 when the request may go on; else whole seconds to put in a Retry-After header (>= 1)."""
        b = self.buckets.get(tenant)
        wait = b.take(self.clock()) if b is not None else 0.0
        return 0 if wait == 0.0 else max(1, math.ceil(wait))
