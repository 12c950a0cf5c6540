"""The Serve config: Ray's ServeDeploySchema, the import of every app, autoscaling, the CPU floor, and
the generated serveConfigV2 of the RayService."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import yaml

from tools.validate_deploy import REPO

SERVE_CONFIG = REPO / "serve_configs" / "qrag.yaml"
RAYSERVICE = REPO / "k8s" / "base" / "rayservice.yaml"
# A ShardSearcher's ongoing requests are the Routers' search passes (one at a time for one tenant at any load):
# its autoscaling must count the queries they carry, which this policy does (qrag_ray/serving/autoscaling.py).
SHARD_SEARCHER_POLICY = "qrag_ray.serving.autoscaling:ShardSearcherPolicy"


def import_attr(import_path: str) -> Any:
    """Import `module:attr` or `module.attr` as Serve does; raises ImportError/AttributeError."""
    if ":" in import_path:
        mod, attr = import_path.split(":", 1)
    else:
        mod, _, attr = import_path.rpartition(".")
    if not mod or not attr:
        raise ImportError(f"malformed import_path {import_path!r}")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def check_serve_config(cfg: Any) -> list[str]:
    """Ray's own schema, the import path of every app, autoscaling on every listed deployment but the
    Writer, which is one replica."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    from qrag_ray.serving.config import WRITER  # the Writer (serving/writer.py): one replica, never autoscaled

    if not isinstance(cfg, dict):
        return ["serve config is not a mapping"]
    out = []
    try:
        ServeDeploySchema.model_validate(cfg)
    except ValidationError as error:
        out.append("does not validate against ray.serve.schema.ServeDeploySchema: "
                   + "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in error.errors()))
        return out
    for app in cfg.get("applications", []):
        name = app.get("name", "?")
        try:
            obj = import_attr(app["import_path"])
            if not callable(obj) and type(obj).__name__ != "Application":
                out.append(f"application {name}: import_path {app['import_path']} is neither an Application nor a "
                           "builder")
        except (ImportError, AttributeError) as error:
            out.append(f"application {name}: import_path {app['import_path']!r} does not import ({error})")
        deps = app.get("deployments") or []
        if not deps:
            out.append(f"application {name}: no deployments listed (no autoscaling_config to apply)")
        for dep in deps:
            autoscaling = dep.get("autoscaling_config")
            if dep.get("name") == WRITER:
                if autoscaling or dep.get("num_replicas", 1) != 1:
                    out.append(f"application {name}: deployment {WRITER} must be num_replicas: 1 without "
                               "autoscaling_config (a root's writes are applied by one process at a time)")
            elif not autoscaling:
                out.append(f"application {name}: deployment {dep.get('name')} has no autoscaling_config")
            elif autoscaling.get("min_replicas", 1) > autoscaling.get("max_replicas", 1):
                out.append(f"application {name}: deployment {dep.get('name')}: min_replicas > max_replicas")
            elif str(dep.get("name", "")).startswith("ShardSearcher"):
                policy = (autoscaling.get("policy") or {}).get("policy_function")
                if policy != SHARD_SEARCHER_POLICY:
                    out.append(f"application {name}: deployment {dep.get('name')}: autoscaling_config.policy."
                               f"policy_function must be {SHARD_SEARCHER_POLICY} (Serve's default counts the "
                               "Router's search passes, which cannot tell load from idle)")
    return out


def serve_cpu_floor(cfg: dict) -> float:
    """CPUs the app needs with every deployment at min_replicas (what the cluster must at least hold)."""
    total = 0.0
    for app in cfg.get("applications", []):
        for dep in app.get("deployments") or []:
            replicas = (dep.get("autoscaling_config") or {}).get("min_replicas", dep.get("num_replicas", 1))
            total += replicas * float((dep.get("ray_actor_options") or {}).get("num_cpus", 1))
    return total


def load_canonical_serve_config(path: Path = SERVE_CONFIG) -> dict:
    return yaml.safe_load(Path(path).read_text())


def embed_serve_config(rayservice_text: str, serve_yaml_text: str, key: str = "serveConfigV2") -> str:
    """Replace the `<key>: |` block of a RayService file (keeping its comments) with the canonical serve
    config, comments included, indented as a YAML block scalar (`key`: `value` in a JSON patch of it)."""
    key_pattern = re.compile(rf"^(\s*){key}:\s*\|[-+]?\s*$")
    lines = rayservice_text.splitlines(keepends=True)
    key_line = next((number for number, line in enumerate(lines) if key_pattern.match(line)), None)
    if key_line is None:
        raise ValueError(f"no `{key}: |` block in the file")
    key_indent = len(key_pattern.match(lines[key_line]).group(1))
    block_end = key_line + 1
    while block_end < len(lines) and (not lines[block_end].strip()
                                      or len(lines[block_end]) - len(lines[block_end].lstrip()) > key_indent):
        block_end += 1
    pad = " " * (key_indent + 2)
    body = [pad + line if line.strip() else "\n" for line in serve_yaml_text.rstrip("\n").splitlines(keepends=True)]
    body[-1] = body[-1].rstrip("\n") + "\n"
    return "".join(lines[:key_line + 1] + body + lines[block_end:])


def sync_serve_config(rayservice: Path = RAYSERVICE, serve_config: Path = SERVE_CONFIG) -> bool:
    """Rewrite rayservice's serveConfigV2 from serve_config; True when the file changed."""
    old = rayservice.read_text()
    new = embed_serve_config(old, serve_config.read_text())
    if yaml.safe_load(yaml.safe_load(new)["spec"]["serveConfigV2"]) != yaml.safe_load(serve_config.read_text()):
        raise AssertionError("embedding the serve config changed its content")
    if new != old:
        rayservice.write_text(new)
    return new != old
