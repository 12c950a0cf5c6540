"""Application metrics of the Serve app, exported through Ray's metrics agent (`ray.serve.metrics`).

Ray prefixes custom metrics with `ray_` on the Prometheus endpoint of every node (the
`metrics_export_port`, scraped the same way as Serve's built-in `ray_serve_*` metrics; docs/SERVING.md),
and adds the Serve tags `deployment`, `replica`, `application`. `EXPORTED_METRICS` lists the names exactly
as scraped: the serving tests check each against a live scrape, and the Grafana dashboard may only
query these (or Serve's built-ins).

Metric objects are created inside replicas (`ServingMetrics()`), never at import, so importing this
module needs no Ray.
"""

from __future__ import annotations

# Latency buckets in milliseconds: sub-ms FAISS calls up to multi-second LLM answers.
LATENCY_MS_BUCKETS = [0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000]
COUNT_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]

REQUEST_LATENCY = "qrag_request_latency_ms"
SHARD_LATENCY = "qrag_shard_search_latency_ms"
CANDIDATES_BEFORE = "qrag_candidates_before_dedup"
CANDIDATES_AFTER = "qrag_candidates_after_dedup"
ERRORS = "qrag_errors"
INDEX_VERSION = "qrag_index_version_loaded"

_HELP = {
    REQUEST_LATENCY: "End-to-end request latency in the router, ms, by route, tenant and HTTP status.",
    SHARD_LATENCY: "FAISS search time of one shard for one request, ms, by tenant and shard.",
    CANDIDATES_BEFORE: "Vector hits gathered from all shards for one query (last widening round), by tenant.",
    CANDIDATES_AFTER: "Distinct chunks returned for one query after dedup, by tenant.",
    ERRORS: "Requests that ended in an error, by route, tenant and kind (the `error` field of the body).",
    INDEX_VERSION: "1 for each (tenant, shard, index_version) loaded in a replica.",
}


def _histogram_names(name: str) -> dict[str, str]:
    return {f"ray_{name}_{s}": _HELP[name] for s in ("bucket", "sum", "count")}


EXPORTED_METRICS: dict[str, str] = {
    **_histogram_names(REQUEST_LATENCY),
    **_histogram_names(SHARD_LATENCY),
    **_histogram_names(CANDIDATES_BEFORE),
    **_histogram_names(CANDIDATES_AFTER),
    f"ray_{ERRORS}_total": _HELP[ERRORS],
    f"ray_{INDEX_VERSION}": _HELP[INDEX_VERSION],
}


class RouterMetrics:
    def __init__(self):
        from ray.serve.metrics import Counter, Histogram

        self.latency = Histogram(REQUEST_LATENCY, _HELP[REQUEST_LATENCY], boundaries=LATENCY_MS_BUCKETS,
                                 tag_keys=("route", "tenant", "status"))
        self.before = Histogram(CANDIDATES_BEFORE, _HELP[CANDIDATES_BEFORE], boundaries=COUNT_BUCKETS,
                                tag_keys=("tenant",))
        self.after = Histogram(CANDIDATES_AFTER, _HELP[CANDIDATES_AFTER], boundaries=COUNT_BUCKETS,
                               tag_keys=("tenant",))
        self.errors = Counter(ERRORS, _HELP[ERRORS], tag_keys=("route", "tenant", "kind"))


class ShardMetrics:
    def __init__(self):
        from ray.serve.metrics import Gauge, Histogram

        self.latency = Histogram(SHARD_LATENCY, _HELP[SHARD_LATENCY], boundaries=LATENCY_MS_BUCKETS,
                                 tag_keys=("tenant", "shard"))
        self.version = Gauge(INDEX_VERSION, _HELP[INDEX_VERSION], tag_keys=("tenant", "shard", "index_version"))
