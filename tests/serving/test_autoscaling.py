"""serving/autoscaling.py: a ShardSearcher replica's load meter (queries in its calls and busy search threads,
averaged over each report's window) and the policy Serve runs on the group's reports, with Serve's own
config, context and policy objects (no controller)."""

from __future__ import annotations

import pytest
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from qrag_ray.serving.application import DEFAULT_OPTIONS, SHARD_SEARCHER_POLICY
from qrag_ray.serving.autoscaling import (
    ONGOING_QUERIES,
    SEARCH_BUSY,
    ShardLoad,
    ShardSearcherPolicy,
    desired_replicas,
)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_meter_reports_queries_in_calls_and_busy_threads_averaged_over_its_window():
    clock = Clock()
    load = ShardLoad(threads=2, clock=clock)
    clock.now += 1.0  # idle for a second
    with load.call(8):
        clock.now += 0.5  # waiting for a shard load
        with load.searching(2):
            clock.now += 1.0
        clock.now += 0.5
    with load.call(1):
        clock.now += 1.0  # a second call, open at the report
        report = load.report()
    # 8 queries for 2 s and 1 for 1 s over 4 s; 2 of 2 threads for 1 s over 4 s
    assert report == {ONGOING_QUERIES: pytest.approx(17 / 4), SEARCH_BUSY: pytest.approx(0.25)}
    clock.now += 2.0  # the next window starts at the report: the open call counts there
    assert load.report() == {ONGOING_QUERIES: pytest.approx(0.0), SEARCH_BUSY: pytest.approx(0.0)}


def test_the_meter_counts_the_time_of_an_open_call_in_each_window_it_spans():
    clock = Clock()
    load = ShardLoad(threads=1, clock=clock)
    with load.call(4):
        clock.now += 1.0
        first = load.report()
        clock.now += 3.0
        second = load.report()
    assert first[ONGOING_QUERIES] == pytest.approx(4.0) and second[ONGOING_QUERIES] == pytest.approx(4.0)


@pytest.mark.parametrize(("queries", "busy", "want"), [
    (0.0, 0.0, 1),  # idle: the minimum Serve allows, at least one
    (0.9, 0.2, 1),  # one closed-loop client: never more than one query in flight
    (3.4, 0.43, 2),  # a big tenant at 16 concurrent requests, target 2 queries per replica
    (4.0, 0.5, 2),  # exactly at target for two
    (4.01, 0.5, 3),
    (1.0, 1.6, 3),  # few queries, search threads saturated (a heavy query mix): the busy time decides
])
def test_desired_replicas_is_the_larger_of_the_two_targets(queries, busy, want):
    assert desired_replicas(queries, busy, target_queries=2.0, target_busy=0.75) == want


def _context(config: AutoscalingConfig, metrics: dict, current: int = 1, target: int | None = None):
    replicas = list(next(iter(metrics.values()), {})) or [f"r{n}" for n in range(current)]
    return AutoscalingContext(
        deployment_id=None, deployment_name="ShardSearcher0", app_name="qrag", current_num_replicas=current,
        target_num_replicas=current if target is None else target, running_replicas=replicas,
        total_num_requests=float(current), total_queued_requests=0.0, aggregated_metrics=metrics, raw_metrics={},
        capacity_adjusted_min_replicas=config.min_replicas, capacity_adjusted_max_replicas=config.max_replicas,
        policy_state={}, last_scale_up_time=None, last_scale_down_time=None, current_time=0.0, config=config)


def test_the_policy_sums_the_groups_replicas_and_reads_the_target_from_the_deployment():
    config = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=2)
    policy = ShardSearcherPolicy(target_busy=0.75)
    two_replicas = {ONGOING_QUERIES: {"a": 2.5, "b": 2.0}, SEARCH_BUSY: {"a": 0.4, "b": 0.3}}
    assert policy(_context(config, two_replicas, current=2)) == (3, {})
    quiet = {ONGOING_QUERIES: {"a": 0.2, "b": 0.0}, SEARCH_BUSY: {"a": 0.2, "b": 0.0}}
    assert policy(_context(config, quiet, current=2)) == (1, {})
    config_8 = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=8)
    assert policy(_context(config_8, two_replicas, current=2)) == (1, {})


def test_before_any_replica_reports_the_policy_keeps_the_current_target():
    config = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=2)
    assert ShardSearcherPolicy()(_context(config, {}, current=0, target=2)) == (2, {})


def test_a_steady_trickle_never_asks_for_a_second_replica():
    """One closed-loop client has at most one query in flight, whatever the search costs: with a target
    above 1 query per replica the trickle's reports never ask for more than one."""
    config = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=2)
    policy = ShardSearcherPolicy()
    for in_flight in (0.0, 0.2, 0.5, 0.99, 1.0):
        metrics = {ONGOING_QUERIES: {"a": in_flight}, SEARCH_BUSY: {"a": min(in_flight, 0.7)}}
        assert policy(_context(config, metrics))[0] == 1


def test_target_busy_out_of_range_is_refused():
    with pytest.raises(ValueError, match="target_busy"):
        ShardSearcherPolicy(target_busy=0)


def test_serve_loads_the_policy_the_default_options_name_by_value():
    """The deployments' policy as Serve parses it from a config: the import path resolves and the class
    travels to the controller pickled by value, where Serve instantiates it with policy_kwargs."""
    config = AutoscalingConfig(**{**DEFAULT_OPTIONS["ShardSearcher"]["autoscaling_config"]})
    assert config.policy.policy_function == SHARD_SEARCHER_POLICY["policy_function"]
    revived = AutoscalingPolicy.from_serialized_policy_def(
        {"policy_function": config.policy.policy_function, "policy_kwargs": config.policy.policy_kwargs},
        config.policy.get_serialized_policy_def()).get_policy()
    policy = revived(**config.policy.policy_kwargs)
    busy = {ONGOING_QUERIES: {"a": 0.5}, SEARCH_BUSY: {"a": 0.9}}
    assert policy.target_busy == 0.75 and policy(_context(config, busy))[0] == 2
