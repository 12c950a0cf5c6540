"""The ShardSearchers' autoscaling signal and policy, through Serve's public custom-metrics API.

A ShardSearcher's ongoing requests are the Routers' search passes, not users' requests: for one tenant a
group's passes are one at a time at any load (a pass carries every query that waited for it), so Serve's
default policy, which counts requests, cannot tell load from idle. Each replica instead reports, through
`record_autoscaling_stats`, its `ongoing_queries` (the queries of the passes it was working on or holding,
averaged over time since its last report: Serve's ongoing requests counted in the users' requests the passes
carry) and `search_busy` (the share of its search threads' time spent searching). `ShardSearcherPolicy`
(`autoscaling_config.policy`) asks for as many replicas as the group's queries need at the deployment's
`target_ongoing_requests` per replica, or its search threads at `target_busy`, whichever is more; Serve
applies `min_replicas`/`max_replicas`, the scaling factors and the upscale and downscale delays around it.
One closed-loop client makes at most one query in flight, so a target above 1 never scales on a trickle.

Serve ships the policy to its controller by value (cloudpickle): this module imports only the standard
library."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

ONGOING_QUERIES = "ongoing_queries"
SEARCH_BUSY = "search_busy"


class ShardLoad:
    """A replica's load since its last report, integrated over time: queries in its calls (from arrival to
    reply, waiting for a shard load or a search thread included) and search threads at work. Updated and
    read on the replica's event loop only."""

    def __init__(self, threads: int, clock: Callable[[], float] = time.monotonic):
        self.threads = max(1, threads)
        self.clock = clock
        self._queries = 0  # queries in calls now
        self._searching = 0  # search threads at work now
        self._since = clock()  # start of the window being reported
        self._changed = self._since  # the last time either count changed
        self._query_seconds = 0.0
        self._busy_seconds = 0.0

    def _advance(self) -> float:
        now = self.clock()
        elapsed = now - self._changed
        self._query_seconds += self._queries * elapsed
        self._busy_seconds += self._searching * elapsed
        self._changed = now
        return now

    @contextmanager
    def call(self, queries: int) -> Iterator[None]:
        """A search call carrying `queries` queries, for as long as the block runs."""
        self._advance()
        self._queries += queries
        try:
            yield
        finally:
            self._advance()
            self._queries -= queries

    @contextmanager
    def searching(self, threads: int) -> Iterator[None]:
        """`threads` of the pool's threads searching, for as long as the block runs."""
        self._advance()
        self._searching += threads
        try:
            yield
        finally:
            self._advance()
            self._searching -= threads

    def report(self) -> dict[str, float]:
        """The window's averages (what `record_autoscaling_stats` returns), and a new window."""
        now = self._advance()
        window = max(now - self._since, 1e-9)
        out = {ONGOING_QUERIES: self._query_seconds / window,
               SEARCH_BUSY: min(1.0, self._busy_seconds / (window * self.threads))}
        self._since = now
        self._query_seconds = 0.0
        self._busy_seconds = 0.0
        return out


def desired_replicas(queries: float, busy: float, target_queries: float, target_busy: float) -> int:
    """Replicas for a group whose replicas together hold `queries` queries on average and keep `busy` search
    threads' worth of time busy (sums over its replicas): enough for either target, at least one."""
    wanted = max(queries / target_queries, busy / target_busy)
    return max(1, math.ceil(wanted - 1e-9))


class ShardSearcherPolicy:
    """Serve's deployment-scoped custom policy for a ShardSearcher group (`autoscaling_config.policy:
    {policy_function: qrag_ray.serving.autoscaling:ShardSearcherPolicy, policy_kwargs: {target_busy: ...}}`):
    the replicas `desired_replicas` asks for from the replicas' last `look_back_period_s` of reports, queries
    at the deployment's `target_ongoing_requests` each. Before any running replica has reported it keeps the
    current target (a fresh deployment, or one whose replicas are all new)."""

    def __init__(self, target_busy: float = 0.75):
        if not 0 < target_busy <= 1:
            raise ValueError(f"target_busy must be in (0, 1], got {target_busy}")
        self.target_busy = target_busy

    def __call__(self, ctx: Any) -> tuple[int, dict]:
        """(the replicas wanted, the policy's state: none)."""
        metrics = ctx.aggregated_metrics or {}
        queries = metrics.get(ONGOING_QUERIES) or {}
        busy = metrics.get(SEARCH_BUSY) or {}
        if not queries and not busy:
            return ctx.target_num_replicas, {}
        target_queries = ctx.config.get_target_ongoing_requests()
        return desired_replicas(sum(queries.values()), sum(busy.values()), target_queries, self.target_busy), {}
