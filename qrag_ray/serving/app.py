"""`build_app(args) -> Application`: the import path serve configs name (`qrag_ray.serving.app:build_app`).

    Router (FastAPI ingress; embeds the query, batched)
        -> ShardSearcher0 .. ShardSearcher{S-1}   (asyncio.gather fan-out, one retry on a dead replica)
        -> Synthesizer                             (only with args.generator)

The defaults below are the deployment options used by `qrag serve` without a config; a serve config's
`deployments:` entries override them by name (Serve does that for `serve deploy`; `qrag serve --config`
passes them as `deployment_options`). Every queue is bounded (`max_queued_requests`): under a spike,
callers get a fast 503 instead of an ever longer wait.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve
from ray.serve import Application

from qrag_ray.serving.config import ROUTER, SYNTHESIZER, parse_app_args, shard_deployment
from qrag_ray.serving.answer import Synthesizer
from qrag_ray.serving.shard_deployment import ShardSearcherDeployment

logger = logging.getLogger(__name__)


def _autoscaling(max_replicas: int, target: int) -> dict:
    return {"min_replicas": 1, "initial_replicas": 1, "max_replicas": max_replicas,
            "target_ongoing_requests": target}


DEFAULT_OPTIONS: dict[str, dict] = {
    ROUTER: {"max_ongoing_requests": 128, "max_queued_requests": 256, "autoscaling_config": _autoscaling(4, 32),
             "ray_actor_options": {"num_cpus": 1}, "health_check_period_s": 5},
    "ShardSearcher": {"max_ongoing_requests": 32, "max_queued_requests": 128, "autoscaling_config": _autoscaling(4, 8),
                      "ray_actor_options": {"num_cpus": 1}, "health_check_period_s": 5},
    SYNTHESIZER: {"max_ongoing_requests": 64, "max_queued_requests": 128, "autoscaling_config": _autoscaling(2, 16),
                  "ray_actor_options": {"num_cpus": 0.5}},
}


def _options(name: str, overrides: dict[str, dict] | None, kind: str | None = None) -> dict:
    base = dict(DEFAULT_OPTIONS[kind or name])
    o = dict((overrides or {}).get(name) or {})
    o.pop("name", None)
    if "num_replicas" in o:  # a fixed replica count replaces autoscaling
        base.pop("autoscaling_config", None)
    if "ray_actor_options" in o:
        o["ray_actor_options"] = {**base.get("ray_actor_options", {}), **o["ray_actor_options"]}
    return {**base, **o, "name": name}


def shard_count(tenants) -> int:
    """ShardSearcher deployments needed: the most shards of any readable tenant index."""
    from qrag_ray.errors import QragError
    from qrag_ray.index.format import load_manifest
    from qrag_ray.index.versions import resolve_index

    most = 0
    for t in tenants.by_name.values():
        try:
            most = max(most, load_manifest(resolve_index(t.index).dir).num_shards)
        except QragError as e:  # one broken tenant must not take the others down: the admin status reports it
            logger.error("tenant %r: %s", t.name, e)
    if most == 0:
        raise QragError("no tenant index could be read, so the number of shards is unknown: "
                        "fix the index path(s) or set args.shards")
    return most


def build_app(args: dict[str, Any]) -> Application:
    """The import path of serve configs (`serve deploy`, KubeRay): Serve calls an app builder with
    exactly one parameter, the `args:` dict; deployment options come from the config's `deployments:`."""
    return build_application(args)


def build_application(args: dict[str, Any] | None = None,
                      deployment_options: dict[str, dict] | None = None) -> Application:
    """The qrag Serve application for `args` (AppArgs: `index` or `tenants`, limits, optional generator),
    with per-deployment option overrides by name (`qrag serve --config`, tests)."""
    a = parse_app_args(args)
    shards = a.shards or shard_count(a.load_tenants())
    searchers = [
        serve.deployment(ShardSearcherDeployment).options(
            **_options(shard_deployment(i), deployment_options, "ShardSearcher")).bind(
            i, a.shard_cache_bytes, a.faiss_threads)
        for i in range(shards)]
    synth = None
    if a.generator is not None:
        synth = serve.deployment(Synthesizer).options(**_options(SYNTHESIZER, deployment_options)).bind(
            a.generator.model_dump())
    from qrag_ray.serving.router import Router

    return serve.deployment(Router).options(**_options(ROUTER, deployment_options)).bind(
        searchers, synth, a.model_dump(mode="json"))
