"""The Serve app's metrics (`ray.serve.metrics`), created inside replicas, never at import (no Ray needed).
`EXPORTED_METRICS` lists them as scraped (Ray adds the `ray_` prefix): the serving tests check each
against a live scrape, and the Grafana dashboard may query only these (or Serve's built-ins)."""

from __future__ import annotations

import asyncio

# Latency buckets in milliseconds: sub-ms FAISS calls up to multi-second LLM answers.
LATENCY_MS_BUCKETS = [0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000]
COUNT_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
LOAD_S_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]

REQUEST_LATENCY = "qrag_request_latency_ms"
SHARD_LATENCY = "qrag_shard_search_latency_ms"
CANDIDATES_BEFORE = "qrag_candidates_before_dedup"
CANDIDATES_AFTER = "qrag_candidates_after_dedup"
ERRORS = "qrag_errors"
INDEX_VERSION = "qrag_index_version_loaded"
CACHE_EVENTS = "qrag_shard_cache_events"
LOAD_SECONDS = "qrag_shard_load_seconds"

_HELP = {
    REQUEST_LATENCY: "End-to-end request latency in the router, ms, by route, tenant and HTTP status.",
    SHARD_LATENCY: "FAISS search time of one shard for one request, ms, by tenant and shard.",
    CANDIDATES_BEFORE: "Vector hits gathered from all shards for one query (last widening round), by tenant.",
    CANDIDATES_AFTER: "Distinct chunks returned for one query after dedup, by tenant.",
    ERRORS: "Requests that ended in an error, by route, tenant and kind (the `error` field of the body).",
    INDEX_VERSION: "1 for each (tenant, shard, index_version) loaded in a replica.",
    CACHE_EVENTS: "A replica's shard cache, by tenant, shard and event: hit, cold_load (read from disk), eviction.",
    LOAD_SECONDS: "Seconds one cold load of a tenant's shard took (read and verify), by tenant and shard.",
}

EXPORTED_METRICS: dict[str, str] = {
    **{f"ray_{name}_{s}": _HELP[name] for name in (REQUEST_LATENCY, SHARD_LATENCY, CANDIDATES_BEFORE, CANDIDATES_AFTER,
                                                   LOAD_SECONDS) for s in ("bucket", "sum", "count")},
    f"ray_{ERRORS}_total": _HELP[ERRORS], f"ray_{INDEX_VERSION}": _HELP[INDEX_VERSION],
    f"ray_{CACHE_EVENTS}_total": _HELP[CACHE_EVENTS],
}


def _histogram(name: str, boundaries: list, *tags: str):
    from ray.serve.metrics import Histogram

    return Histogram(name, _HELP[name], boundaries=boundaries, tag_keys=tags)


class AppMetrics:
    """The app's metrics as one replica records them: requests and their candidates (the Router), shard
    searches, cache events, loads and the loaded versions (whichever replica holds a shard cache)."""

    def __init__(self):
        from ray.serve.metrics import Counter, Gauge

        self.latency = _histogram(REQUEST_LATENCY, LATENCY_MS_BUCKETS, "route", "tenant", "status")
        self.before = _histogram(CANDIDATES_BEFORE, COUNT_BUCKETS, "tenant")
        self.after = _histogram(CANDIDATES_AFTER, COUNT_BUCKETS, "tenant")
        self.errors = Counter(ERRORS, _HELP[ERRORS], tag_keys=("route", "tenant", "kind"))
        self.shard_latency = _histogram(SHARD_LATENCY, LATENCY_MS_BUCKETS, "tenant", "shard")
        self.load_seconds = _histogram(LOAD_SECONDS, LOAD_S_BUCKETS, "tenant", "shard")
        self.cache = Counter(CACHE_EVENTS, _HELP[CACHE_EVENTS], tag_keys=("tenant", "shard", "event"))
        self.version = Gauge(INDEX_VERSION, _HELP[INDEX_VERSION], tag_keys=("tenant", "shard", "index_version"))

    def searched(self, tenant: str, replies) -> None:
        """Each shard's search time of one call (ShardReply.search_ms)."""
        for reply in replies:
            self.shard_latency.observe(reply.search_ms, tags={"tenant": tenant, "shard": str(reply.shard)})

    async def report_versions(self, cache) -> None:
        """Keep the loaded-version gauge set for every shard `cache` (a ShardCache) holds: Ray drops a gauge
        sample that is not re-reported within ~2 export intervals. Runs for the replica's life."""
        while True:
            for key, number in cache.loaded_versions():
                self.version.set(1, tags={"tenant": key.tenant, "shard": str(number), "index_version": key.version})
            await asyncio.sleep(2.0)


_process_metrics: list[AppMetrics] = []  # at most one: each Serve replica is a process of its own


def process_metrics() -> AppMetrics:
    """This process's AppMetrics, made on first use (a metric registered twice would count twice)."""
    if not _process_metrics:
        _process_metrics.append(AppMetrics())
    return _process_metrics[0]
