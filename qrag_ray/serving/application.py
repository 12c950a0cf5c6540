"""The Serve application: Router (ingress) -> ShardSearcher0 .. ShardSearcher{G-1} (each searching
`shards_per_searcher` consecutive shard numbers) -> Synthesizer (only with args.generator); the Writer (one
replica, unless args.writes.enabled is false) applies the tenants' logged writes. DEFAULT_OPTIONS are
`qrag serve`'s deployment options without a config; a serve config's `deployments:` override them by name.
Every queue is bounded (`max_queued_requests`): under a spike, callers get a fast 503 instead of an ever
longer wait."""

from __future__ import annotations

import logging
from typing import Any

from ray import serve
from ray.serve import Application

from qrag_ray.errors import QragError
from qrag_ray.index.format import load_manifest
from qrag_ray.index.versions import resolve_index
from qrag_ray.serving.answer import Synthesizer
from qrag_ray.serving.config import ROUTER, SYNTHESIZER, WRITER, AppArgs, parse_app_args
from qrag_ray.serving.shard_searcher import ShardSearcher, searcher_names
from qrag_ray.serving.writer import Writer

logger = logging.getLogger(__name__)


# The ShardSearchers' autoscaling policy (serving/autoscaling.py): replicas for the queries their passes carry
# (target_ongoing_requests counts queries there) or their search threads' busy time, whichever asks more.
SHARD_SEARCHER_POLICY = {"policy_function": "qrag_ray.serving.autoscaling:ShardSearcherPolicy",
                         "policy_kwargs": {"target_busy": 0.75}}


def _autoscaling(max_replicas: int, target: int) -> dict:
    return {"min_replicas": 1, "initial_replicas": 1, "max_replicas": max_replicas, "target_ongoing_requests": target}


DEFAULT_OPTIONS: dict[str, dict] = {
    # the Router and the ShardSearchers upscale after 10 s of load, not Serve's 30, so a load step gets a
    # replica within ~30 s
    ROUTER: {"max_ongoing_requests": 128, "max_queued_requests": 256,
             "autoscaling_config": {**_autoscaling(4, 32), "upscale_delay_s": 10},
             "ray_actor_options": {"num_cpus": 1}, "health_check_period_s": 5},
    "ShardSearcher": {"max_ongoing_requests": 32, "max_queued_requests": 128,
                      "autoscaling_config": {**_autoscaling(4, 2), "upscale_delay_s": 10,
                                             "policy": SHARD_SEARCHER_POLICY},
                      "ray_actor_options": {"num_cpus": 1}, "health_check_period_s": 5},
    SYNTHESIZER: {"max_ongoing_requests": 64, "max_queued_requests": 128, "autoscaling_config": _autoscaling(2, 16),
                  "ray_actor_options": {"num_cpus": 0.5}},
    # one replica: a root is applied by one process at a time (a file lock), so more would only wait
    WRITER: {"num_replicas": 1, "max_ongoing_requests": 256, "ray_actor_options": {"num_cpus": 0.5},
             "health_check_period_s": 10},
}


def _deployment(cls, name: str, overrides: dict[str, dict] | None, kind: str | None = None):
    """`cls` as deployment `name` with DEFAULT_OPTIONS[kind or name] under the overrides given for `name`."""
    base = dict(DEFAULT_OPTIONS[kind or name])
    given = dict((overrides or {}).get(name) or {})
    given.pop("name", None)
    if "num_replicas" in given:  # a fixed replica count replaces autoscaling
        base.pop("autoscaling_config", None)
    if "ray_actor_options" in given:
        given["ray_actor_options"] = {**base.get("ray_actor_options", {}), **given["ray_actor_options"]}
    return serve.deployment(cls).options(**{**base, **given, "name": name})


def shard_count(tenants) -> int:
    """ShardSearcher deployments needed: the most shards of any readable tenant index."""
    most = 0
    for tenant in tenants.by_name.values():
        try:
            most = max(most, load_manifest(resolve_index(tenant.index).dir).num_shards)
        except QragError as error:  # one broken tenant must not take the others down: the admin status reports it
            logger.error("tenant %r: %s", tenant.name, error)
    if most == 0:
        raise QragError("no tenant index could be read, so the number of shards is unknown: "
                        "fix the index path(s) or set args.shards")
    return most


def build_app(args: AppArgs | dict[str, Any]) -> Application:
    """Serve's application builder (a serve config's `import_path`): Serve calls it with the config's `args:`
    (one parameter, its rule) and applies the config's `deployments:` options by name itself."""
    return compose_app(args)


def compose_app(args: AppArgs | dict[str, Any], deployment_options: dict[str, dict] | None = None) -> Application:
    """The app's deployments bound together: one ShardSearcher per group of `shards_per_searcher` shard
    numbers, the Synthesizer when there is a generator, the Router over them; each with `deployment_options`
    (by deployment name, what a serve config's `deployments:` say: `qrag serve --config` applies them here)
    over DEFAULT_OPTIONS."""
    from qrag_ray.serving.router import Router

    args = parse_app_args(args)
    names = searcher_names(args.shards or shard_count(args.load_tenants()), args.shards_per_searcher)
    searchers = [_deployment(ShardSearcher, name, deployment_options, "ShardSearcher").bind(
        args.shard_cache_bytes, args.faiss_threads, args.shards_per_searcher, group, args)
        for group, name in enumerate(names)]
    synthesizer = None
    if args.generator is not None:
        synthesizer = _deployment(Synthesizer, SYNTHESIZER, deployment_options).bind(args.generator.model_dump())
    writer = None
    if args.writes.enabled:
        writer = _deployment(Writer, WRITER, deployment_options).bind(args)
    return _deployment(Router, ROUTER, deployment_options).bind(searchers, synthesizer, args, writer)
