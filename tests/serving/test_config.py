"""Serve configs, app args and the application graph (no Ray cluster needed)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from qrag_ray.errors import QragError
from qrag_ray.serving.app_metrics import EXPORTED_METRICS
from qrag_ray.serving.config import parse_app_args

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "serve_configs").glob("*.yaml"))


def test_there_are_serve_configs():
    assert {p.name for p in CONFIGS} >= {"qrag.yaml", "local.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_serve_config_matches_rays_schema_and_our_app(path, tmp_path):
    from ray.serve._private.build_app import build_app as ray_build
    from ray.serve.schema import ServeDeploySchema

    data = yaml.safe_load(path.read_text())
    schema = ServeDeploySchema.model_validate(data)
    assert len(schema.applications) == 1
    app = schema.applications[0]
    for deployment in app.deployments:  # per-deployment autoscaling, but for the Writer's one replica
        if deployment.name == "Writer":
            assert deployment.num_replicas == 1, f"{path.name}: the Writer is one replica"
            continue
        assert deployment.autoscaling_config, f"{path.name}: {deployment.name} has no autoscaling_config"
        assert deployment.autoscaling_config["min_replicas"] >= 1
        assert deployment.autoscaling_config["max_replicas"] >= deployment.autoscaling_config["min_replicas"]
    module, _, attr = app.import_path.partition(":")
    builder = getattr(importlib.import_module(module), attr)
    assert app.import_path == "qrag_ray.serving.application:build_app"
    args = parse_app_args(app.args)  # the args are valid AppArgs (typos would fail here)
    # every deployment the config names exists in the app the builder makes from these args
    fake_args = dict(app.args)
    if args.tenants:
        fake_args["tenants"] = str(tmp_path / "t.yaml")
        tenant = "{name: a, index: /nonexistent, key_sha256: '" + "0" * 64 + "'}"
        (tmp_path / "t.yaml").write_text(f"tenants:\n  - {tenant}\n")
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    # exactly as Serve's controller calls it for `serve deploy` / KubeRay (one-parameter builders only)
    built = ray_build(call_user_app_builder_with_args_if_necessary(builder, fake_args), name=app.name)
    names = {d.name for d in built.deployments}
    assert {d.name for d in app.deployments} <= names, names
    assert built.ingress_deployment_name == "Router"
    assert "Router" in names and "QueryEmbedder" not in names  # the Router embeds queries itself
    groups = -(-args.shards // args.shards_per_searcher)
    assert {n for n in names if n.startswith("ShardSearcher")} == {f"ShardSearcher{g}" for g in range(groups)}
    assert ("Synthesizer" in names) == (args.generator is not None)


def test_canonical_config_is_for_a_cluster():
    data = yaml.safe_load((ROOT / "serve_configs/qrag.yaml").read_text())
    assert data["http_options"]["host"] == "0.0.0.0"
    assert data["applications"][0]["args"]["tenants"], "a shared endpoint must require keys"
    local = yaml.safe_load((ROOT / "serve_configs/local.yaml").read_text())
    assert local["http_options"]["host"] == "127.0.0.1"


def test_deployment_overrides_apply(tmp_path):
    from ray.serve._private.build_app import build_app as ray_build

    from qrag_ray.serving.application import compose_app

    app = compose_app({"index": str(tmp_path), "shards": 2},
                      {"ShardSearcher1": {"num_replicas": 3, "ray_actor_options": {"num_cpus": 0.25}}})
    deployments = {d.name: d for d in ray_build(app, name="x").deployments}
    assert deployments["ShardSearcher1"].num_replicas == 3
    assert deployments["ShardSearcher1"].ray_actor_options["num_cpus"] == 0.25
    assert deployments["ShardSearcher0"]._deployment_config.autoscaling_config is not None
    # five shard numbers, two per ShardSearcher: three deployments, the last searching shard 4 alone
    grouped = ray_build(compose_app({"index": str(tmp_path), "shards": 5, "shards_per_searcher": 2}), name="y")
    assert sorted(d.name for d in grouped.deployments if d.name.startswith("ShardSearcher")) == [
        "ShardSearcher0", "ShardSearcher1", "ShardSearcher2"]


@pytest.mark.parametrize("args,message", [
    ({}, "exactly one of"),
    ({"index": "/a", "tenants": "/b"}, "exactly one of"),
    ({"index": "/a", "shard": 2}, "shard"),
    ({"index": "/a", "shards": 0}, "shards"),
    ({"index": "/a", "generator": {"backend": "none"}}, "backend"),
    ({"index": "/a", "generator": {"backend": "gpt"}}, "generator.backend"),
    ({"index": "/a", "generator": {"base_url": "http://llm/v1"}}, "generator.backend"),
    ({"index": "/a", "generator": {"backend": "openai"}}, "needs generator.base_url"),
    # serving's LLM takes no index-time generation settings
    ({"index": "/a", "generator": {"backend": "vllm", "questions_per_atom": 3}}, "generator.questions_per_atom"),
    ({"index": "/a", "generator": {"backend": "vllm", "sampling": {"n": 4}}}, "generator.sampling.n"),
])
def test_bad_app_args(args, message):
    with pytest.raises(QragError, match=message):
        parse_app_args(args)


def test_build_app_without_any_readable_index_is_a_clear_error(tmp_path):
    from qrag_ray.serving.application import build_app

    with pytest.raises(QragError, match="number of shards"):
        build_app({"index": str(tmp_path / "missing")})


def test_exported_metric_names_are_as_scraped():
    assert EXPORTED_METRICS and all(n.startswith("ray_qrag_") for n in EXPORTED_METRICS)
    assert all(h for h in EXPORTED_METRICS.values())
    histograms = {n.rsplit("_", 1)[0] for n in EXPORTED_METRICS if n.endswith("_bucket")}
    assert histograms == {"ray_qrag_request_latency_ms", "ray_qrag_shard_search_latency_ms",
                          "ray_qrag_candidates_before_dedup", "ray_qrag_candidates_after_dedup",
                          "ray_qrag_shard_load_seconds"}
    for histogram in histograms:
        assert {f"{histogram}_sum", f"{histogram}_count"} <= set(EXPORTED_METRICS)
    counters = {"ray_qrag_errors_total", "ray_qrag_index_version_loaded", "ray_qrag_shard_cache_events_total"}
    assert counters <= set(EXPORTED_METRICS)


def test_a_replica_embeds_on_the_gpu_ray_assigned_it_and_on_cpu_otherwise(monkeypatch):
    """The Writer's device (serving/writer.py): a GPU in its ray_actor_options puts its embedder there."""
    import ray

    from qrag_ray.serving.config import assigned_cpus, assigned_device

    class Context:
        def __init__(self, resources):
            self.resources = resources

        def get_assigned_resources(self):
            return self.resources

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context({"CPU": 2.0, "GPU": 1.0}))
    assert (assigned_device(), assigned_cpus()) == ("cuda", 2)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context({"CPU": 0.5}))
    assert (assigned_device(), assigned_cpus()) == ("cpu", 1)
