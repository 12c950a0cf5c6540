"""KubeRay resources: the cluster spec of a RayJob/RayService (groups, autoscaling, GPUs), the
RayService's Serve config and process environment, and the RayJob's lifecycle and entrypoint (parsed by
click's parser of the real `qrag` command, its paths on the shared volume, its index config)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from tools.validate_deploy.serve import check_serve_config, serve_cpu_floor

RAY_API = "ray.io/v1"
GPU = "nvidia.com/gpu"
REPO_SERVE_CONFIG = "serve_configs/qrag.yaml"


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity(value: Any) -> float:
    """A Kubernetes quantity ("12Gi", "500m", "8") as a number."""
    text = str(value)
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    for unit, mult in _UNITS.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * mult
    return float(text)


def containers(template: dict) -> list[dict]:
    return ((template or {}).get("spec") or {}).get("containers") or []


def check_cluster_spec(spec: dict, *, require_gpu: bool) -> list[str]:
    out = []
    if spec.get("enableInTreeAutoscaling") is not True:
        out.append("enableInTreeAutoscaling must be true (Serve/Data demand adds worker pods)")
    head = spec.get("headGroupSpec") or {}
    if not containers(head.get("template")):
        out.append("headGroupSpec.template has no containers")
    groups = spec.get("workerGroupSpecs") or []
    if not groups:
        out.append("no workerGroupSpecs")
    names = set()
    for group in groups:
        group_name = group.get("groupName")
        if not group_name or group_name in names:
            out.append(f"worker group name missing or duplicated: {group_name!r}")
        names.add(group_name)
        least = group.get("minReplicas")
        most = group.get("maxReplicas")
        replicas = group.get("replicas", least)
        if not all(isinstance(v, int) for v in (least, most, replicas)):
            out.append(f"group {group_name}: minReplicas/maxReplicas/replicas must be integers")
        elif not (0 <= least <= replicas <= most) or most < 1:
            out.append(f"group {group_name}: need 0 <= minReplicas ({least}) <= replicas ({replicas}) <= maxReplicas "
                       f"({most}), maxReplicas >= 1")
        group_containers = containers(group.get("template"))
        if not group_containers:
            out.append(f"group {group_name}: template has no containers")
        for container in group_containers:
            if not container.get("image"):
                out.append(f"group {group_name}: container {container.get('name')} has no image")
            if "cpu" not in ((container.get("resources") or {}).get("limits") or {}):
                out.append(f"group {group_name}: container {container.get('name')} has no cpu limit (Ray sizes "
                           "num-cpus from it)")
    if require_gpu and not gpu_groups(spec):
        out.append(f"no worker group with a {GPU} limit")
    return out


def gpu_groups(spec: dict) -> list[dict]:
    return [g for g in spec.get("workerGroupSpecs") or []
            if any(float(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0)) >= 1
                   for c in containers(g.get("template")))]


def max_cpus(spec: dict) -> float:
    return sum(g.get("maxReplicas", 0) * sum(quantity(((c.get("resources") or {}).get("limits") or {}).get("cpu", 0))
                                            for c in containers(g.get("template"))[:1])
               for g in spec.get("workerGroupSpecs") or [])


def pod_templates(doc: dict) -> list[tuple[str, dict, dict]]:
    """(role, rayStartParams, pod template) of every group of a RayJob/RayService."""
    spec = doc["spec"].get("rayClusterConfig") or doc["spec"].get("rayClusterSpec") or {}
    head = spec.get("headGroupSpec") or {}
    out = [("head", head.get("rayStartParams") or {}, head.get("template") or {})]
    out += [("worker", g.get("rayStartParams") or {}, g.get("template") or {})
            for g in spec.get("workerGroupSpecs") or []]
    return out


def check_serve_env(doc: dict) -> list[str]:
    """Serve reads its request-path switches and its ingress when each Ray process starts, so every pod that
    can host a replica or the ingress must carry them (the switches `qrag serve` sets for its local Ray, and
    HAProxy on the Serve port)."""
    from qrag_ray.serving.config import CLUSTER_INGRESS_ENV, SERVE_PROCESS_ENV

    out = []
    for role, _, template in pod_templates(doc):
        for container in containers(template):
            env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
            bad = sorted(k for k, v in {**SERVE_PROCESS_ENV, **CLUSTER_INGRESS_ENV}.items() if env.get(k) != v)
            if bad:
                out.append(f"{role} container {container.get('name')!r}: env {', '.join(bad)} missing or not "
                           "qrag_ray.serving.config's SERVE_PROCESS_ENV or CLUSTER_INGRESS_ENV value")
    return out


def check_haproxy_timeout(cfg: Any) -> list[str]:
    """HAProxy bounds a request to a replica by its own server timeout, not by http_options.request_timeout_s:
    the two must say the same."""
    from qrag_ray.serving.config import CLUSTER_INGRESS_ENV

    want = (cfg.get("http_options") or {}).get("request_timeout_s") if isinstance(cfg, dict) else None
    have = CLUSTER_INGRESS_ENV["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"]
    if want is None or str(want) != have:
        return [f"serveConfigV2 http_options.request_timeout_s is {want}, HAProxy's server timeout "
                f"(CLUSTER_INGRESS_ENV) {have}: set them equal"]
    return []


def check_rayservice(doc: dict, *, require_gpu: bool, canonical: dict | None) -> list[str]:
    out = []
    if doc.get("apiVersion") != RAY_API:
        out.append(f"apiVersion must be {RAY_API}")
    serve_config = (doc.get("spec") or {}).get("serveConfigV2")
    if not isinstance(serve_config, str):
        return out + ["spec.serveConfigV2 must be a YAML string"]
    try:
        cfg = yaml.safe_load(serve_config)
    except yaml.YAMLError as error:
        return out + [f"serveConfigV2 is not YAML: {error}"]
    out += [f"serveConfigV2 {m}" for m in check_serve_config(cfg)]
    if canonical is not None and cfg != canonical:
        out.append(f"serveConfigV2 differs from {REPO_SERVE_CONFIG}; run "
                   "`python -m tools.validate_deploy --sync-serve-config`")
    spec = doc["spec"].get("rayClusterConfig")
    if not isinstance(spec, dict):
        return out + ["spec.rayClusterConfig missing"]
    out += check_cluster_spec(spec, require_gpu=require_gpu)
    out += check_serve_env(doc)
    out += check_haproxy_timeout(cfg)
    if isinstance(cfg, dict) and not out:
        floor = serve_cpu_floor(cfg)
        cap = max_cpus(spec)
        if floor > cap:
            out.append(f"the Serve app needs {floor:g} CPUs at min_replicas but the worker groups top out at {cap:g}")
    return out


# ---------------------------------------------------------------- RayJob


def qrag_click_command():
    import typer

    from qrag_ray.cli.app import app, register_commands

    register_commands()
    return typer.main.get_command(app)


def parse_entrypoint(entrypoint: str) -> tuple[str, dict[str, Any]]:
    """Parse `qrag SUB ...` with click's parser of the real command; raises ValueError on any misuse."""
    argv = shlex.split(entrypoint)
    if argv[:1] == ["qrag"]:
        argv = argv[1:]
    elif argv[:3] == ["python", "-m", "qrag_ray.cli"]:
        argv = argv[3:]
    else:
        raise ValueError(f"entrypoint must run `qrag <subcommand>`: {entrypoint!r}")
    if not argv:
        raise ValueError("entrypoint has no qrag subcommand")
    root = qrag_click_command()
    commands = getattr(root, "commands", {})  # typer vendors click: duck-type the group
    sub = commands.get(argv[0])
    if sub is None:
        raise ValueError(f"`qrag {argv[0]}` is not a qrag subcommand (known: {', '.join(sorted(commands))})")
    try:
        ctx = sub.make_context(f"qrag {argv[0]}", list(argv[1:]), resilient_parsing=False)
    except Exception as error:  # click's UsageError/BadParameter (typer._click or click)
        if not hasattr(error, "format_message"):
            raise
        raise ValueError(f"`qrag {argv[0]}`: {error.format_message()}") from None
    return argv[0], dict(ctx.params)


def _mounts(template: dict) -> dict[str, dict]:
    """mountPath -> volume source, for the first container of a pod template."""
    spec = template.get("spec") or {}
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    pod_containers = spec.get("containers") or [{}]
    return {m["mountPath"]: vols.get(m["name"], {}) for m in pod_containers[0].get("volumeMounts") or []}


def _under(path: str, mounts: dict[str, dict], kind: str) -> bool:
    return any((path == mp or path.startswith(mp.rstrip("/") + "/")) and kind in src for mp, src in mounts.items())


def check_rayjob(doc: dict, *, require_gpu: bool, configmaps: dict[str, dict]) -> list[str]:
    out = []
    spec = doc.get("spec") or {}
    if doc.get("apiVersion") != RAY_API:
        out.append(f"apiVersion must be {RAY_API}")
    if spec.get("shutdownAfterJobFinishes") is not True:
        out.append("shutdownAfterJobFinishes must be true (the cluster is deleted after the job)")
    ttl = spec.get("ttlSecondsAfterFinished")
    if not isinstance(ttl, int) or ttl < 0:
        out.append("ttlSecondsAfterFinished must be a non-negative integer")
    entrypoint = spec.get("entrypoint")
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        out.append("spec.entrypoint missing")
        sub = None
        params = {}
    else:
        try:
            sub, params = parse_entrypoint(entrypoint)
        except ValueError as error:
            out.append(f"entrypoint: {error}")
            sub = None
            params = {}
    cluster = spec.get("rayClusterSpec")
    if not isinstance(cluster, dict):
        return out + ["spec.rayClusterSpec missing"]
    out += check_cluster_spec(cluster, require_gpu=require_gpu)
    if sub != "index":
        return out
    # paths of the job must be on shared storage (a PVC) mounted in the head and every worker group
    templates = pod_templates(doc)
    for flag, key in (("--input", "input"), ("--output", "output"), ("--cache-dir", "cache_dir")):
        path = params.get(key)
        if path and "://" not in path:
            for role, _, template in templates:
                if not _under(path, _mounts(template), "persistentVolumeClaim"):
                    out.append(f"entrypoint {flag} {path} is not on a shared volume (PVC) mounted in every {role} pod")
                    break
    if params.get("config"):
        out += [f"entrypoint --config: {m}" for m in _check_index_config(params, templates[0][2], configmaps)]
    return out


def _check_index_config(params: dict, head_template: dict, configmaps: dict[str, dict]) -> list[str]:
    """The --config file comes from a ConfigMap mounted in the head pod: it must parse as IndexConfig
    together with the entrypoint's flags."""
    import tempfile

    from qrag_ray.config.index import build_index_config
    from qrag_ray.errors import QragError

    path = params["config"]
    for mount_path, src in _mounts(head_template).items():
        if path.startswith(mount_path.rstrip("/") + "/") and "configMap" in src:
            configmap = configmaps.get(src["configMap"]["name"])
            if configmap is None:
                return [f"ConfigMap {src['configMap']['name']} (mounted at {mount_path}) is not in the manifests"]
            key = path[len(mount_path.rstrip("/")) + 1:]
            text = (configmap.get("data") or {}).get(key)
            if text is None:
                return [f"ConfigMap {src['configMap']['name']} has no key {key}"]
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
                file.write(text)
            try:
                build_index_config(file.name, input=params.get("input"), format=params.get("format"),
                                   shards=params.get("shards"), representation=params.get("representation"),
                                   **{"build.output": params.get("output"), "build.address": params.get("address")})
            except QragError as error:
                return [str(error)]
            finally:
                Path(file.name).unlink(missing_ok=True)
            return []
    return [f"{path} is not in a ConfigMap volume of the head pod"]
