"""Offline validation of the deployment files: KubeRay manifests, kustomize overlays, the Serve config
embedded in the RayService, the Grafana dashboard and the Ray cluster-launcher config.

Why offline and this deep: a manifest that parses can still deploy an app whose import path is wrong,
run `qrag index` with a flag that does not exist, or chart a metric nobody exports; each of those is
found only hours later on a real cluster. Every check here uses the real thing instead of a copy of
it: Ray's own ServeDeploySchema and cluster-launcher schema (`ray/autoscaler/ray-schema.json` via
Ray's validate_config), the import of the app builder, click's parser of the real `qrag` command,
`build_index_config` for the index config, and `EXPORTED_METRICS` of the serving package. No cluster,
no network; `kubectl kustomize` is used for a cross-check only when it is installed.

    python scripts/validate_deploy.py                       # every overlay + cluster/cloud-gpu.yaml
    python scripts/validate_deploy.py k8s/overlays/cpu-dev  # one overlay (or a single YAML file)
    python scripts/validate_deploy.py --sync-serve-config   # regenerate serveConfigV2 from serve_configs/
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

REPO = Path(__file__).resolve().parents[1]
SERVE_CONFIG = REPO / "serve_configs" / "qrag.yaml"
RAYSERVICE = REPO / "k8s" / "base" / "rayservice.yaml"
OVERLAYS = {"cpu-dev": {"gpu": False}, "gpu-prod": {"gpu": True}}
CLUSTER_LAUNCHER = REPO / "cluster" / "cloud-gpu.yaml"
RAY_API = "ray.io/v1"
GPU = "nvidia.com/gpu"


@dataclass
class Report:
    """Problems found, each prefixed with where it is (file or resource)."""

    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def add(self, where: str, msg: str) -> None:
        self.problems.append(f"{where}: {msg}")

    def extend(self, where: str, msgs: Iterable[str]) -> None:
        for m in msgs:
            self.add(where, m)

    @property
    def ok(self) -> bool:
        return not self.problems


# ---------------------------------------------------------------- kustomize (subset) renderer


def _load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render_kustomization(path: str | Path) -> list[dict]:
    """Render a kustomization directory with the features our overlays use.

    Supported (and nothing else, an unknown field raises): resources (files and directories),
    namespace, labels (metadata only), configMapGenerator with files and labels (with
    generatorOptions.disableNameSuffixHash), and JSON 6902 patches selected by kind/name. The result is
    cross-checked against `kubectl kustomize` in the tests wherever kubectl is installed.
    """
    import jsonpatch

    d = Path(path)
    k = yaml.safe_load((d / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "resources", "namespace", "labels", "generatorOptions", "configMapGenerator",
             "patches"}
    unknown = set(k) - known
    if unknown:
        raise ValueError(f"{d}/kustomization.yaml: unsupported fields {sorted(unknown)}")
    docs: list[dict] = []
    for r in k.get("resources", []):
        p = (d / r).resolve()
        if p.is_dir():
            docs += render_kustomization(p)
        elif p.is_file():
            docs += _load_docs(p)
        else:
            raise ValueError(f"{d}/kustomization.yaml: resource {r} not found")
    if k.get("configMapGenerator") and not (k.get("generatorOptions") or {}).get("disableNameSuffixHash"):
        raise ValueError(f"{d}: configMapGenerator needs generatorOptions.disableNameSuffixHash (stable names)")
    for g in k.get("configMapGenerator", []):
        data = {}
        for f in g.get("files", []):
            fp = d / f
            if not fp.is_file():
                raise ValueError(f"{d}/kustomization.yaml: configMapGenerator file {f} not found")
            data[fp.name] = fp.read_text()
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data}
        if (g.get("options") or {}).get("labels"):
            cm["metadata"]["labels"] = dict(g["options"]["labels"])
        docs.append(cm)
    for p in k.get("patches", []):
        t = p.get("target") or {}
        ops = yaml.safe_load((d / p["path"]).read_text()) if "path" in p else yaml.safe_load(p["patch"])
        hits = [x for x in docs if x.get("kind") == t.get("kind") and x["metadata"].get("name") == t.get("name")]
        if not hits:
            raise ValueError(f"{d}: patch {p.get('path')} matches no resource ({t})")
        for x in hits:
            docs[docs.index(x)] = jsonpatch.apply_patch(x, ops)
    ns = k.get("namespace")
    for x in docs:
        if ns and x.get("kind") != "Namespace":
            x["metadata"]["namespace"] = ns
        for lab in k.get("labels", []):
            if lab.get("includeSelectors") or lab.get("includeTemplates"):
                raise ValueError(f"{d}: labels with includeSelectors/includeTemplates are not supported")
            x["metadata"].setdefault("labels", {}).update(lab["pairs"])
    return docs


def kubectl_kustomize(path: str | Path) -> list[dict] | None:
    """The real kustomize's rendering, or None when kubectl is not installed."""
    import shutil
    import subprocess

    exe = shutil.which("kubectl")
    if not exe:
        return None
    out = subprocess.run([exe, "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=True)
    return [x for x in yaml.safe_load_all(out.stdout) if x]


def canonical_docs(docs: list[dict]) -> list[dict]:
    return sorted(docs, key=lambda x: (x.get("kind", ""), x.get("metadata", {}).get("name", "")))


# ---------------------------------------------------------------- Serve config


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
    """Ray's own schema, the import path of every app, autoscaling on every listed deployment."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    if not isinstance(cfg, dict):
        return ["serve config is not a mapping"]
    out = []
    try:
        ServeDeploySchema.model_validate(cfg) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema.parse_obj(cfg)
    except ValidationError as e:
        out.append("does not validate against ray.serve.schema.ServeDeploySchema: "
                   + "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()))
        return out
    for app in cfg.get("applications", []):
        name = app.get("name", "?")
        try:
            obj = import_attr(app["import_path"])
            if not callable(obj) and type(obj).__name__ != "Application":
                out.append(f"application {name}: import_path {app['import_path']} is neither an Application nor a builder")
        except (ImportError, AttributeError) as e:
            out.append(f"application {name}: import_path {app['import_path']!r} does not import ({e})")
        deps = app.get("deployments") or []
        if not deps:
            out.append(f"application {name}: no deployments listed (no autoscaling_config to apply)")
        for dep in deps:
            ac = dep.get("autoscaling_config")
            if not ac:
                out.append(f"application {name}: deployment {dep.get('name')} has no autoscaling_config")
            elif ac.get("min_replicas", 1) > ac.get("max_replicas", 1):
                out.append(f"application {name}: deployment {dep.get('name')}: min_replicas > max_replicas")
    return out


def serve_cpu_floor(cfg: dict) -> float:
    """CPUs the app needs with every deployment at min_replicas (what the cluster must at least hold)."""
    total = 0.0
    for app in cfg.get("applications", []):
        for dep in app.get("deployments") or []:
            n = (dep.get("autoscaling_config") or {}).get("min_replicas", dep.get("num_replicas", 1))
            total += n * float((dep.get("ray_actor_options") or {}).get("num_cpus", 1))
    return total


# ---------------------------------------------------------------- Ray cluster specs (KubeRay)


def _cpu(q: Any) -> float:
    s = str(q)
    return float(s[:-1]) / 1000 if s.endswith("m") else float(s)


def _containers(template: dict) -> list[dict]:
    return ((template or {}).get("spec") or {}).get("containers") or []


def check_cluster_spec(spec: dict, *, require_gpu: bool) -> list[str]:
    out = []
    if spec.get("enableInTreeAutoscaling") is not True:
        out.append("enableInTreeAutoscaling must be true (Serve/Data demand adds worker pods)")
    head = spec.get("headGroupSpec") or {}
    if not _containers(head.get("template")):
        out.append("headGroupSpec.template has no containers")
    groups = spec.get("workerGroupSpecs") or []
    if not groups:
        out.append("no workerGroupSpecs")
    names = set()
    for g in groups:
        gn = g.get("groupName")
        if not gn or gn in names:
            out.append(f"worker group name missing or duplicated: {gn!r}")
        names.add(gn)
        lo, hi, n = g.get("minReplicas"), g.get("maxReplicas"), g.get("replicas", g.get("minReplicas"))
        if not all(isinstance(v, int) for v in (lo, hi, n)):
            out.append(f"group {gn}: minReplicas/maxReplicas/replicas must be integers")
        elif not (0 <= lo <= n <= hi) or hi < 1:
            out.append(f"group {gn}: need 0 <= minReplicas ({lo}) <= replicas ({n}) <= maxReplicas ({hi}), maxReplicas >= 1")
        cs = _containers(g.get("template"))
        if not cs:
            out.append(f"group {gn}: template has no containers")
        for c in cs:
            if not c.get("image"):
                out.append(f"group {gn}: container {c.get('name')} has no image")
            if "cpu" not in ((c.get("resources") or {}).get("limits") or {}):
                out.append(f"group {gn}: container {c.get('name')} has no cpu limit (Ray sizes num-cpus from it)")
    if require_gpu and not gpu_groups(spec):
        out.append(f"no worker group with a {GPU} limit")
    return out


def gpu_groups(spec: dict) -> list[dict]:
    return [g for g in spec.get("workerGroupSpecs") or []
            if any(float(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0)) >= 1
                   for c in _containers(g.get("template")))]


def max_cpus(spec: dict) -> float:
    return sum(g.get("maxReplicas", 0) * sum(_cpu(((c.get("resources") or {}).get("limits") or {}).get("cpu", 0))
                                            for c in _containers(g.get("template"))[:1])
               for g in spec.get("workerGroupSpecs") or [])


def pod_templates(doc: dict) -> list[tuple[str, dict, dict]]:
    """(role, rayStartParams, pod template) of every group of a RayJob/RayService."""
    spec = doc["spec"].get("rayClusterConfig") or doc["spec"].get("rayClusterSpec") or {}
    head = spec.get("headGroupSpec") or {}
    out = [("head", head.get("rayStartParams") or {}, head.get("template") or {})]
    out += [("worker", g.get("rayStartParams") or {}, g.get("template") or {}) for g in spec.get("workerGroupSpecs") or []]
    return out


def check_serve_env(doc: dict) -> list[str]:
    """Serve reads its request-path switches when each Ray process starts, so every pod that can host a
    replica or the proxy must carry them (the same values `qrag serve` sets for its local Ray)."""
    from qrag_ray.serving.config import SERVE_PROCESS_ENV

    out = []
    for role, _, template in pod_templates(doc):
        for c in _containers(template):
            env = {e.get("name"): e.get("value") for e in c.get("env") or [] if isinstance(e, dict)}
            bad = sorted(k for k, v in SERVE_PROCESS_ENV.items() if env.get(k) != v)
            if bad:
                out.append(f"{role} container {c.get('name')!r}: env {', '.join(bad)} missing or not "
                           "qrag_ray.serving.config.SERVE_PROCESS_ENV's value")
    return out


def check_rayservice(doc: dict, *, require_gpu: bool, canonical: dict | None) -> list[str]:
    out = []
    if doc.get("apiVersion") != RAY_API:
        out.append(f"apiVersion must be {RAY_API}")
    sc = (doc.get("spec") or {}).get("serveConfigV2")
    if not isinstance(sc, str):
        return out + ["spec.serveConfigV2 must be a YAML string"]
    try:
        cfg = yaml.safe_load(sc)
    except yaml.YAMLError as e:
        return out + [f"serveConfigV2 is not YAML: {e}"]
    out += [f"serveConfigV2 {m}" for m in check_serve_config(cfg)]
    if canonical is not None and cfg != canonical:
        out.append(f"serveConfigV2 differs from {SERVE_CONFIG.relative_to(REPO)}; run "
                   "`python scripts/validate_deploy.py --sync-serve-config`")
    spec = doc["spec"].get("rayClusterConfig")
    if not isinstance(spec, dict):
        return out + ["spec.rayClusterConfig missing"]
    out += check_cluster_spec(spec, require_gpu=require_gpu)
    out += check_serve_env(doc)
    if isinstance(cfg, dict) and not out:
        floor, cap = serve_cpu_floor(cfg), max_cpus(spec)
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
    except Exception as e:  # click's UsageError/BadParameter (typer._click or click)
        if not hasattr(e, "format_message"):
            raise
        raise ValueError(f"`qrag {argv[0]}`: {e.format_message()}") from None
    return argv[0], dict(ctx.params)


def _mounts(template: dict) -> dict[str, dict]:
    """mountPath -> volume source, for the first container of a pod template."""
    spec = template.get("spec") or {}
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    cs = spec.get("containers") or [{}]
    return {m["mountPath"]: vols.get(m["name"], {}) for m in cs[0].get("volumeMounts") or []}


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
    ep = spec.get("entrypoint")
    if not isinstance(ep, str) or not ep.strip():
        out.append("spec.entrypoint missing")
        sub, params = None, {}
    else:
        try:
            sub, params = parse_entrypoint(ep)
        except ValueError as e:
            out.append(f"entrypoint: {e}")
            sub, params = None, {}
    rc = spec.get("rayClusterSpec")
    if not isinstance(rc, dict):
        return out + ["spec.rayClusterSpec missing"]
    out += check_cluster_spec(rc, require_gpu=require_gpu)
    if sub != "index":
        return out
    # paths of the job must be on shared storage (a PVC) mounted in the head and every worker group
    templates = pod_templates(doc)
    for flag, key in (("--input", "input"), ("--output", "output"), ("--cache-dir", "cache_dir")):
        p = params.get(key)
        if p and "://" not in p:
            for role, _, t in templates:
                if not _under(p, _mounts(t), "persistentVolumeClaim"):
                    out.append(f"entrypoint {flag} {p} is not on a shared volume (PVC) mounted in every {role} pod")
                    break
    if params.get("config"):
        out += [f"entrypoint --config: {m}" for m in _check_index_config(params, templates[0][2], configmaps)]
    return out


def _check_index_config(params: dict, head_template: dict, configmaps: dict[str, dict]) -> list[str]:
    """The --config file comes from a ConfigMap mounted in the head pod: it must parse as IndexConfig
    together with the entrypoint's flags."""
    import tempfile

    from qrag_ray.config import build_index_config
    from qrag_ray.errors import QragError

    path = params["config"]
    for mp, src in _mounts(head_template).items():
        if path.startswith(mp.rstrip("/") + "/") and "configMap" in src:
            cm = configmaps.get(src["configMap"]["name"])
            if cm is None:
                return [f"ConfigMap {src['configMap']['name']} (mounted at {mp}) is not in the manifests"]
            key = path[len(mp.rstrip("/")) + 1:]
            text = (cm.get("data") or {}).get(key)
            if text is None:
                return [f"ConfigMap {src['configMap']['name']} has no key {key}"]
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write(text)
            try:
                build_index_config(f.name, input=params.get("input"), format=params.get("format"),
                                   output=params.get("output"), shards=params.get("shards"),
                                   representation=params.get("representation"), address=params.get("address"))
            except QragError as e:
                return [str(e)]
            finally:
                Path(f.name).unlink(missing_ok=True)
            return []
    return [f"{path} is not in a ConfigMap volume of the head pod"]


# ---------------------------------------------------------------- monitoring


def check_podmonitors(docs: list[dict]) -> list[str]:
    out = []
    if any(d.get("kind") == "ServiceMonitor" for d in docs):
        out.append("use PodMonitors, not a ServiceMonitor (a RayService has two head services; workers have none)")
    pms = [d for d in docs if d.get("kind") == "PodMonitor"]
    roles = {}
    for pm in pms:
        if pm.get("apiVersion") != "monitoring.coreos.com/v1":
            out.append(f"PodMonitor {pm['metadata'].get('name')}: apiVersion must be monitoring.coreos.com/v1")
        sel = ((pm.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        role = sel.get("ray.io/node-type")
        eps = (pm.get("spec") or {}).get("podMetricsEndpoints") or []
        if role not in ("head", "worker") or not eps:
            out.append(f"PodMonitor {pm['metadata'].get('name')}: needs matchLabels ray.io/node-type head|worker and podMetricsEndpoints")
            continue
        roles[role] = [e.get("port") for e in eps]
    for role in ("head", "worker"):
        if role not in roles:
            out.append(f"no PodMonitor selects Ray {role} pods")
    # the named port must exist in every Ray pod of that role and be Ray's metrics-export-port
    for d in docs:
        if d.get("kind") not in ("RayJob", "RayService"):
            continue
        for role, params, t in pod_templates(d):
            for port_name in roles.get(role, []):
                ports = {p.get("name"): p.get("containerPort") for c in _containers(t) for p in c.get("ports") or []}
                if port_name not in ports:
                    out.append(f"{d['kind']} {d['metadata']['name']}: a {role} pod has no container port named {port_name!r}")
                elif str(params.get("metrics-export-port")) != str(ports[port_name]):
                    out.append(f"{d['kind']} {d['metadata']['name']}: {role} port {port_name} ({ports[port_name]}) "
                               f"is not rayStartParams.metrics-export-port ({params.get('metrics-export-port')})")
    return out


_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                    "offset", "inf", "nan", "le"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label names
    or durations."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # range / subquery durations
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", s):  # not the unit of a duration (5m)
        tok = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or tok.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(tok)
    return names


def dashboard_exprs(dash: dict) -> list[str]:
    exprs = []

    def walk(panels):
        for p in panels or []:
            exprs.extend(t["expr"] for t in p.get("targets") or [] if t.get("expr"))
            walk(p.get("panels"))

    walk(dash.get("panels"))
    return exprs


def check_dashboard(dash: dict, exported: Iterable[str]) -> list[str]:
    exported = set(exported)
    out = []
    exprs = dashboard_exprs(dash)
    if not exprs:
        return ["the dashboard has no queries"]
    used_ours = False
    for e in exprs:
        for name in promql_metric_names(e):
            if name in exported:
                used_ours = True
            elif not name.startswith("ray_serve_"):
                out.append(f"query {e!r} uses {name}, which is neither in qrag_ray.serving.metrics.EXPORTED_METRICS "
                           "nor a Ray Serve built-in (ray_serve_*)")
    if not used_ours and not out:
        out.append("the dashboard charts none of our exported metrics")
    return out


def exported_metrics() -> dict[str, str]:
    from qrag_ray.serving.metrics import EXPORTED_METRICS

    return dict(EXPORTED_METRICS)


# ---------------------------------------------------------------- cluster launcher


def check_cluster_launcher(cfg: Any) -> list[str]:
    """Ray's validate_config (jsonschema against ray/autoscaler/ray-schema.json + its own checks),
    plus the shape the plan needs: a CPU-only head, a GPU worker type, a CPU worker type."""
    import jsonschema
    from ray.autoscaler._private.util import validate_config

    try:
        validate_config(copy.deepcopy(cfg))
    except (jsonschema.ValidationError, ValueError, RuntimeError) as e:
        return [f"Ray cluster-launcher schema: {getattr(e, 'message', e)}"]
    out = []
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    if head.get("resources", {}).get("CPU", None) != 0 or head.get("resources", {}).get("GPU", 0):
        out.append("head node type must be CPU-only with CPU: 0 (no work on the head)")
    workers = {k: v for k, v in types.items() if k != cfg["head_node_type"]}
    if not any(v.get("resources", {}).get("GPU", 0) >= 1 for v in workers.values()):
        out.append("no GPU worker type")
    if not any(not v.get("resources", {}).get("GPU", 0) and v.get("resources", {}).get("CPU", 0) >= 1
               for v in workers.values()):
        out.append("no CPU worker type")
    for k, v in workers.items():
        if "max_workers" not in v or v.get("min_workers", 0) > v["max_workers"]:
            out.append(f"worker type {k}: autoscaling bounds need min_workers <= max_workers")
    return out


# ---------------------------------------------------------------- whole overlays / repo


def validate_docs(docs: list[dict], *, require_gpu: bool, canonical_serve: dict | None = None,
                  exported: Iterable[str] | None = None, report: Report | None = None, where: str = "") -> Report:
    report = report or Report()
    kinds = [d.get("kind") for d in docs]
    for need in ("RayJob", "RayService", "PodMonitor"):
        if need not in kinds:
            report.add(where, f"no {need} in the manifests")
    configmaps = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}
    for d in docs:
        if not isinstance(d, dict) or not d.get("apiVersion") or not d.get("kind") or not (d.get("metadata") or {}).get("name"):
            report.add(where, f"a resource lacks apiVersion/kind/metadata.name: {str(d)[:80]}")
            continue
        w = f"{where}{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "RayService":
            report.extend(w, check_rayservice(d, require_gpu=require_gpu, canonical=canonical_serve))
        elif d["kind"] == "RayJob":
            report.extend(w, check_rayjob(d, require_gpu=require_gpu, configmaps=configmaps))
        elif d["kind"] == "ConfigMap" and any(k.endswith(".json") for k in d.get("data") or {}):
            for k, v in d["data"].items():
                if k.endswith(".json"):
                    try:
                        dash = json.loads(v)
                    except json.JSONDecodeError as e:
                        report.add(w, f"{k} is not JSON: {e}")
                        continue
                    report.extend(f"{w}[{k}]", check_dashboard(dash, exported if exported is not None else exported_metrics()))
        report.checked.append(w)
    report.extend(where + "monitoring", check_podmonitors(docs))
    return report


def validate_overlay(path: str | Path, *, require_gpu: bool, canonical_serve: dict | None = None,
                     exported: Iterable[str] | None = None, report: Report | None = None) -> Report:
    path = Path(path)
    report = report or Report()
    try:
        docs = render_kustomization(path)
    except (ValueError, OSError, yaml.YAMLError) as e:
        report.add(str(path), f"cannot render: {e}")
        return report
    return validate_docs(docs, require_gpu=require_gpu, canonical_serve=canonical_serve, exported=exported,
                         report=report, where=f"{path.name}: ")


def load_canonical_serve_config(path: Path = SERVE_CONFIG) -> dict:
    return yaml.safe_load(path.read_text())


def validate_repo(root: Path = REPO) -> Report:
    report = Report()
    canonical = load_canonical_serve_config(root / "serve_configs" / "qrag.yaml")
    report.extend("serve_configs/qrag.yaml", check_serve_config(canonical))
    for name, opts in OVERLAYS.items():
        validate_overlay(root / "k8s" / "overlays" / name, require_gpu=opts["gpu"], canonical_serve=canonical,
                         report=report)
    report.extend("cluster/cloud-gpu.yaml", check_cluster_launcher(yaml.safe_load((root / "cluster" / "cloud-gpu.yaml").read_text())))
    return report


# ---------------------------------------------------------------- serveConfigV2 generation


def embed_serve_config(rayservice_text: str, serve_yaml_text: str) -> str:
    """Replace the `serveConfigV2: |` block of a RayService file (keeping its comments) with the
    canonical serve config, comments included, indented as a YAML block scalar."""
    lines = rayservice_text.splitlines(keepends=True)
    for i, ln in enumerate(lines):
        m = re.match(r"^(\s*)serveConfigV2:\s*\|[-+]?\s*$", ln)
        if m:
            break
    else:
        raise ValueError("no `serveConfigV2: |` block in the RayService file")
    key_indent = len(m.group(1))
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > key_indent):
        j += 1
    pad = " " * (key_indent + 2)
    body = [pad + l if l.strip() else "\n" for l in serve_yaml_text.rstrip("\n").splitlines(keepends=True)]
    body[-1] = body[-1].rstrip("\n") + "\n"
    return "".join(lines[:i + 1] + body + lines[j:])


def sync_serve_config(rayservice: Path = RAYSERVICE, serve_config: Path = SERVE_CONFIG) -> bool:
    """Rewrite rayservice's serveConfigV2 from serve_config; True when the file changed."""
    old = rayservice.read_text()
    new = embed_serve_config(old, serve_config.read_text())
    if yaml.safe_load(yaml.safe_load(new)["spec"]["serveConfigV2"]) != yaml.safe_load(serve_config.read_text()):
        raise AssertionError("embedding the serve config changed its content")
    if new != old:
        rayservice.write_text(new)
    return new != old


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/validate_deploy.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="overlay directories or YAML files (default: the whole repo)")
    ap.add_argument("--gpu", action="store_true", help="require a GPU worker group (for given paths)")
    ap.add_argument("--sync-serve-config", action="store_true",
                    help=f"regenerate serveConfigV2 in {RAYSERVICE.relative_to(REPO)} from {SERVE_CONFIG.relative_to(REPO)}")
    a = ap.parse_args(argv)
    if a.sync_serve_config:
        changed = sync_serve_config()
        print(f"{RAYSERVICE.relative_to(REPO)}: serveConfigV2 {'updated' if changed else 'already in sync'}")
    if a.paths:
        report = Report()
        canonical = load_canonical_serve_config()
        for p in map(Path, a.paths):
            if p.is_dir():
                validate_overlay(p, require_gpu=a.gpu, canonical_serve=canonical, report=report)
            elif p.name == CLUSTER_LAUNCHER.name or "available_node_types" in p.read_text():
                report.extend(str(p), check_cluster_launcher(yaml.safe_load(p.read_text())))
            else:
                validate_docs(_load_docs(p), require_gpu=a.gpu, canonical_serve=canonical, report=report, where=f"{p}: ")
    else:
        report = validate_repo()
    for msg in report.problems:
        print(f"error: {msg}", file=sys.stderr)
    print(f"{len(report.checked)} resources checked, {len(report.problems)} problems")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
