"""RequestWindow (serving/request_window.py): a tenant's requests in the last minute, as the console's
operate view shows them: counts, rate, nearest-rank percentiles, errors, and the bounds on what it keeps."""

from __future__ import annotations

import pytest

from qrag_ray.serving.request_window import RequestWindow, percentile


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_percentiles_are_nearest_rank():
    values = sorted(float(v) for v in range(1, 101))
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile(values, 100) == 100.0
    assert percentile([7.0], 50) == 7.0 and percentile([1.0, 9.0], 50) == 1.0 and percentile([1.0, 9.0], 99) == 9.0


def test_window_counts_each_tenants_requests_and_errors():
    clock = Clock()
    window = RequestWindow(seconds=60, clock=clock)
    for i in range(100):
        window.record("acme", float(i + 1), 200 if i < 97 else (422 if i < 99 else 503))
    window.record("-", 2.0, 401)
    stats = window.stats()
    assert stats["acme"] == {"requests": 100, "per_s": pytest.approx(100 / 60), "p50_ms": 50.0, "p99_ms": 99.0,
                             "errors": 3, "server_errors": 1}
    assert stats["-"]["errors"] == 1 and set(stats) == {"acme", "-"}


def test_requests_leave_the_window_after_its_seconds():
    clock = Clock()
    window = RequestWindow(seconds=60, clock=clock)
    window.record("acme", 5.0, 200)
    clock.now += 30
    window.record("acme", 7.0, 500)
    assert window.stats()["acme"]["requests"] == 2
    clock.now += 31  # the first is 61 s old
    assert window.stats()["acme"] == {"requests": 1, "per_s": pytest.approx(1 / 60), "p50_ms": 7.0, "p99_ms": 7.0,
                                      "errors": 1, "server_errors": 1}
    clock.now += 60
    assert window.stats() == {}


def test_a_busy_tenant_keeps_its_last_requests_and_rates_them_over_their_span():
    clock = Clock()
    window = RequestWindow(seconds=60, kept=10, clock=clock)
    for _ in range(25):
        clock.now += 0.5
        window.record("busy", 1.0, 200)
    stats = window.stats()["busy"]
    assert stats["requests"] == 10 and stats["per_s"] == pytest.approx(10 / 4.5)
