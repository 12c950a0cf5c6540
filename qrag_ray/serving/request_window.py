"""The last minute of API requests of one Router replica, per tenant: their rate, latency percentiles and
errors, as the console's operate view shows them live (pure; the latency middleware records, serving/http.py).
Prometheus holds the same requests of every replica (`qrag_request_latency_ms`); this window is what one
replica can tell at once without a metrics server."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 60.0
# requests kept per tenant: a busy tenant's window is its last this-many requests (its rate then over
# the seconds they span), so the memory per tenant is bounded whatever the traffic
KEPT_PER_TENANT = 4096


def percentile(sorted_values: list[float], percent: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of values sorted ascending."""
    rank = max(1, -(-len(sorted_values) * percent // 100))
    return sorted_values[int(rank) - 1]


class RequestWindow:
    """Per tenant, (time, milliseconds, status) of its requests in the last `seconds`."""

    def __init__(self, seconds: float = WINDOW_S, kept: int = KEPT_PER_TENANT,
                 clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.kept = kept
        self.clock = clock
        self._requests: dict[str, deque] = {}

    def record(self, tenant: str, elapsed_ms: float, status: int) -> None:
        """One finished request of `tenant` ("-": no known key)."""
        found = self._requests.get(tenant)
        if found is None:
            found = self._requests[tenant] = deque(maxlen=self.kept)
        found.append((self.clock(), elapsed_ms, status))

    def stats(self) -> dict[str, dict]:
        """tenant -> {requests, per_s, p50_ms, p99_ms, errors (status >= 400), server_errors (>= 500)}
        over the window; tenants with no request in it are left out."""
        now = self.clock()
        out = {}
        for tenant, found in list(self._requests.items()):
            while found and found[0][0] < now - self.seconds:
                found.popleft()
            if not found:
                del self._requests[tenant]
                continue
            span = self.seconds if len(found) < self.kept else max(now - found[0][0], 1e-3)
            latencies = sorted(ms for _, ms, _ in found)
            out[tenant] = {"requests": len(found), "per_s": len(found) / span,
                           "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
                           "errors": sum(1 for *_, status in found if status >= 400),
                           "server_errors": sum(1 for *_, status in found if status >= 500)}
        return out
