"""What a KubeRay RayJob or RayService asks of its pods, read from the rendered overlay (pure): one node per
pod with the resources KubeRay gives its `ray start` (CPUs and memory from the Ray container's limits,
`num-cpus` of rayStartParams first, GPUs from its `nvidia.com/gpu` limit), the container's environment and
volumes; the pod paths mapped to a local folder; and what KubeRay submits (a RayJob's runtime env of
`runtimeEnvYAML`, its entrypoint and the ConfigMap files the head mounts; a RayService's serveConfigV2)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tools.validate_deploy.kuberay import GPU, quantity

POD_HOME = "/home/ray"  # the home of the `ray` user of Ray's images, the base of cluster/Dockerfile


@dataclass(frozen=True)
class Mount:
    path: str  # mountPath in the container
    kind: str  # emptyDir, persistentVolumeClaim, configMap, secret, ...
    source: str  # the volume's name, its claim's or its ConfigMap's
    sub_path: str = ""
    medium: str = ""  # an emptyDir's medium (Memory: tmpfs)
    read_only: bool = False  # the mount's readOnly (a ConfigMap or a Secret is read-only whatever it says)


@dataclass(frozen=True)
class Pod:
    name: str  # head, cpu-workers-0, ...
    group: str  # head, or the worker group's name
    num_cpus: int
    num_gpus: int
    memory: int  # bytes: the container's memory limit
    env: dict[str, str] = field(default_factory=dict)  # the Ray container's env (literal values)
    mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True)
class JobPlan:
    pods: tuple[Pod, ...]  # the head first
    entrypoint: str
    runtime_env: dict
    files: dict[str, str]  # pod path -> text of the ConfigMap files mounted in the head


def _container(template: dict) -> dict:
    return ((template.get("spec") or {}).get("containers") or [{}])[0]


def _mounts(template: dict) -> tuple[Mount, ...]:
    vols = {v["name"]: v for v in (template.get("spec") or {}).get("volumes") or []}
    out = []
    for mount in _container(template).get("volumeMounts") or []:
        vol = vols.get(mount["name"], {})
        kind = next((k for k in vol if k != "name"), "")
        src = vol.get(kind) or {}
        source = src.get("claimName") or src.get("name") or src.get("secretName") or mount["name"]
        out.append(Mount(mount["mountPath"], kind, source, mount.get("subPath", ""), src.get("medium", ""),
                         bool(mount.get("readOnly")) or kind in ("configMap", "secret")))
    return tuple(out)


def pod_of(name: str, group: str, params: dict, template: dict) -> Pod:
    """One pod as KubeRay starts Ray in it: `num-cpus`/`num-gpus`/`memory` of rayStartParams, else the Ray
    container's limits (CPUs rounded up, as Kubernetes quantities' Value() does)."""
    limits = (_container(template).get("resources") or {}).get("limits") or {}
    cpus = params.get("num-cpus", limits.get("cpu", 0))
    gpus = params.get("num-gpus", limits.get(GPU, 0))
    memory = params.get("memory", limits.get("memory", 0))
    env = {e["name"]: str(e["value"]) for e in _container(template).get("env") or [] if "value" in e}
    return Pod(name, group, math.ceil(quantity(cpus)), int(quantity(gpus)), int(quantity(memory)), env,
               _mounts(template))


def cluster_pods(cluster: dict, pods_per_group: dict[str, int] | None, owner: str) -> list[Pod]:
    """The pods of a RayCluster spec, the head first: each worker group's `replicas` (at least one: the
    autoscaler would add a pod for the first request), or `pods_per_group`."""
    counts = dict(pods_per_group or {})
    groups = {g["groupName"]: g for g in cluster.get("workerGroupSpecs") or []}
    if unknown := set(counts) - set(groups):
        raise ValueError(f"no worker group {sorted(unknown)} in {owner} (groups: {sorted(groups)})")
    head = cluster["headGroupSpec"]
    pods = [pod_of("head", "head", head.get("rayStartParams") or {}, head["template"])]
    for name, group in groups.items():
        count = counts.get(name, max(1, int(group.get("replicas") or 0)))
        pods += [pod_of(f"{name}-{i}", name, group.get("rayStartParams") or {}, group["template"])
                 for i in range(count)]
    return pods


def job_plan(docs: list[dict], pods_per_group: dict[str, int] | None = None, job: str = "qrag-index") -> JobPlan:
    """The RayJob `job` of rendered manifests as the pods a rehearsal starts and what KubeRay submits."""
    rayjob = next((d for d in docs if d.get("kind") == "RayJob" and d["metadata"]["name"] == job), None)
    if rayjob is None:
        raise ValueError(f"no RayJob {job} in the manifests")
    spec = rayjob["spec"]
    pods = cluster_pods(spec["rayClusterSpec"], pods_per_group, f"RayJob {job}")
    configmaps = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d.get("kind") == "ConfigMap"}
    files = {f"{m.path.rstrip('/')}/{key}": text for m in pods[0].mounts if m.kind == "configMap"
             for key, text in configmaps.get(m.source, {}).items()}
    runtime_env = yaml.safe_load(spec.get("runtimeEnvYAML") or "") or {}
    return JobPlan(tuple(pods), " ".join(str(spec["entrypoint"]).split()), runtime_env, files)


def service_plan(docs: list[dict], pods_per_group: dict[str, int] | None = None,
                 name: str = "qrag") -> tuple[tuple[Pod, ...], dict]:
    """The RayService `name` of rendered manifests: its pods (the head first) and its serveConfigV2 (parsed),
    what KubeRay's controller deploys on the head's dashboard."""
    svc = next((d for d in docs if d.get("kind") == "RayService" and d["metadata"]["name"] == name), None)
    if svc is None:
        raise ValueError(f"no RayService {name} in the manifests")
    pods = cluster_pods(svc["spec"]["rayClusterConfig"], pods_per_group, f"RayService {name}")
    return tuple(pods), yaml.safe_load(svc["spec"].get("serveConfigV2") or "") or {}


def local_paths(pod: Pod, root: Path) -> dict[str, Path]:
    """Pure: pod path -> local folder for one pod: its home (the image's, read-only) and each emptyDir its own,
    each claim, ConfigMap and Secret shared by every pod (as the cluster's volumes are); a Memory emptyDir
    (/dev/shm) stays the machine's own."""
    out: dict[str, Path] = {POD_HOME: root / "pods" / pod.name / "home"}
    for mount in pod.mounts:
        if mount.kind == "emptyDir" and mount.medium == "Memory":
            continue
        if mount.kind == "emptyDir":
            base = root / "pods" / pod.name / "volumes" / mount.source
        else:
            base = root / mount.kind / mount.source
        out[mount.path.rstrip("/")] = base / mount.sub_path if mount.sub_path else base
    return out


def map_text(text: str, paths: dict[str, Path]) -> str:
    """Every pod path in `text` (an entrypoint, a config file, an env value) as its local path; the longest
    mount wins, a path matches only whole (`/tmp` never rewrites `/tmpfoo`), and one pass rewrites each
    path once (a local folder under /tmp is not rewritten again)."""
    if not paths:
        return text
    alternatives = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    pattern = rf"(?<![\w./-])({alternatives})(?=/|$|[\s\"':,}}\]])"
    return re.sub(pattern, lambda m: str(paths[m.group(1)]), text)


def map_env(env: dict, paths: dict[str, Path]) -> dict[str, str]:
    return {k: map_text(str(v), paths) for k, v in env.items()}
