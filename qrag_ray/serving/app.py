"""`build_app(args) -> Application`: the import path serve configs name (`qrag_ray.serving.app:build_app`).

    Router (FastAPI ingress) -> QueryEmbedder
                             -> ShardSearcher0 .. ShardSearcher{S-1}   (asyncio.gather fan-out)
                             -> Synthesizer                             (only with args.generator)

The defaults below are the deployment options used by `qrag serve` without a config; a serve config's
`deployments:` entries override them by name (Serve does that for `serve deploy`; `qrag serve --config`
passes them as `deployment_options`).
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve
from ray.serve import Application

from qrag_ray.serving.config import EMBEDDER, ROUTER, SYNTHESIZER, parse_app_args, shard_deployment
from qrag_ray.serving.deployments import QueryEmbedder, ShardSearcherDeployment, Synthesizer

logger = logging.getLogger(__name__)


def _autoscaling(max_replicas: int, target: int) -> dict:
    return {"min_replicas": 1, "initial_replicas": 1, "max_replicas": max_replicas,
            "target_ongoing_requests": target}


DEFAULT_OPTIONS: dict[str, dict] = {
    ROUTER: {"max_ongoing_requests": 128, "autoscaling_config": _autoscaling(4, 32),
             "ray_actor_options": {"num_cpus": 0.5}},
    EMBEDDER: {"max_ongoing_requests": 32, "autoscaling_config": _autoscaling(4, 8),
               "ray_actor_options": {"num_cpus": 1}},
    "ShardSearcher": {"max_ongoing_requests": 32, "autoscaling_config": _autoscaling(4, 8),
                      "ray_actor_options": {"num_cpus": 1}},
    SYNTHESIZER: {"max_ongoing_requests": 64, "autoscaling_config": _autoscaling(2, 16),
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


def build_app(args: dict[str, Any] | None = None, deployment_options: dict[str, dict] | None = None) -> Application:
    """The qrag Serve application for `args` (AppArgs: `index` or `tenants`, limits, optional generator)."""
    from qrag_ray.errors import QragError
    from qrag_ray.index.format import load_manifest

    a = parse_app_args(args)
    tenants = a.load_tenants()
    shards, embedders = a.shards, set()
    most = 0
    for t in tenants.by_name.values():
        try:
            man = load_manifest(t.index)
        except QragError as e:  # one broken tenant must not take the others down: /healthz reports it
            logger.error("tenant %r: %s", t.name, e)
            continue
        most = max(most, man.num_shards)
        embedders.add(man.embedder_model)
    if shards is None:
        if most == 0:
            raise QragError("no tenant index could be read, so the number of shards is unknown: "
                            "fix the index path(s) or set args.shards")
        shards = most
    embedder = serve.deployment(QueryEmbedder).options(**_options(EMBEDDER, deployment_options)).bind(
        sorted(embedders) or ["all-MiniLM-L6-v2"])
    indexes = {t.name: t.index for t in tenants.by_name.values()}
    searchers = [
        serve.deployment(ShardSearcherDeployment).options(
            **_options(shard_deployment(i), deployment_options, "ShardSearcher")).bind(
            i, indexes, a.max_tenants_per_replica, a.faiss_threads)
        for i in range(shards)]
    synth = None
    if a.generator is not None:
        synth = serve.deployment(Synthesizer).options(**_options(SYNTHESIZER, deployment_options)).bind(
            a.generator.model_dump())
    from qrag_ray.serving.router import Router

    return serve.deployment(Router).options(**_options(ROUTER, deployment_options)).bind(
        embedder, searchers, synth, tenants.to_list(), tenants.open, a.model_dump())
