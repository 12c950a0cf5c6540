"""The RayService's two autoscalers agree: KubeRay's autoscaler options, and the pods it may start against the
replicas Serve may ask for.

Serve adds replicas up to each deployment's `max_replicas`; a replica that fits no running pod waits until
KubeRay's autoscaler starts one, which it does only up to each worker group's `maxReplicas`. So the pods must
hold every replica at once: Serve's replicas at `max_replicas`, each with its `ray_actor_options` (num_cpus,
num_gpus), packed first-fit into the pods the groups may have at `maxReplicas` and the head (when its Ray has
CPUs). A replica that asks for a GPU goes on a GPU group's pod, one that does not on a CPU group's pod or the head
(Ray keeps CPU work off GPU nodes while it can). The pods' resources are Ray's own reading of the groups (its
KubeRay translation, what the autoscaler computes), not a copy of it. The reverse is a warning: CPU groups that
may hold more than twice the CPUs Serve can use (the autoscaler never starts those pods for Serve, and the
number misleads whoever sizes the cluster); a GPU group no deployment asks a GPU of is left alone (it waits at
0 pods for a GPU deployment).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import yaml

UPSCALING_MODES = ("Default", "Aggressive", "Conservative")  # KubeRay's upscalingMode values
HEAD_GROUP = "headgroup"  # the head's node type in KubeRay's translation
SURPLUS_FACTOR = 2.0  # CPU groups holding more than this many times Serve's CPUs are reported


@dataclass(frozen=True)
class Replica:
    """One replica Serve may ask for: its deployment and what it holds."""

    deployment: str
    cpus: float
    gpus: float


@dataclass
class Pod:
    """A pod the autoscaler may start (or the head): its group, what is still free on it, whether it has GPUs."""

    group: str
    cpus: float
    gpus: float
    gpu_pod: bool = False

    @classmethod
    def of(cls, group: str, node_type: dict) -> "Pod":
        """An empty pod of a node type."""
        cpus = float(node_type["resources"].get("CPU", 0))
        gpus = float(node_type["resources"].get("GPU", 0))
        return cls(group, cpus, gpus, gpus > 0)

    def holds(self, replica: Replica) -> bool:
        """The replica fits in what is free, on a pod of its kind (GPU replicas on GPU pods only, the others
        on pods without GPUs)."""
        return self.gpu_pod == (replica.gpus > 0) and self.cpus >= replica.cpus and self.gpus >= replica.gpus

    def take(self, replica: Replica) -> None:
        """Place the replica on the pod."""
        self.cpus -= replica.cpus
        self.gpus -= replica.gpus


def check_autoscaler_options(cluster_spec: dict) -> list[str]:
    """`autoscalerOptions` names an upscaling mode and an idle timeout: KubeRay's defaults are not written down
    anywhere a reader of the manifest sees them."""
    options = cluster_spec.get("autoscalerOptions") or {}
    problems = []
    mode = options.get("upscalingMode")
    if mode not in UPSCALING_MODES:
        problems.append(f"autoscalerOptions.upscalingMode is {mode!r}: set one of {', '.join(UPSCALING_MODES)}")
    idle = options.get("idleTimeoutSeconds")
    if not isinstance(idle, int) or isinstance(idle, bool) or idle <= 0:
        problems.append(f"autoscalerOptions.idleTimeoutSeconds is {idle!r}: set the seconds an idle worker pod "
                        "stays (a positive integer)")
    return problems


def serve_replicas(serve_config: dict) -> list[Replica]:
    """Pure: every replica the serve config's deployments may have at once (autoscaling_config.max_replicas, else
    num_replicas, else 1), each with its num_cpus (Serve's default 1) and num_gpus."""
    replicas = []
    for app in serve_config.get("applications") or []:
        for deployment in app.get("deployments") or []:
            autoscaling = deployment.get("autoscaling_config") or {}
            fixed = deployment.get("num_replicas")
            count = autoscaling.get("max_replicas", fixed if isinstance(fixed, int) else 1)
            options = deployment.get("ray_actor_options") or {}
            replica = Replica(str(deployment.get("name")), float(options.get("num_cpus", 1)),
                              float(options.get("num_gpus", 0)))
            replicas += [replica] * int(count)
    return replicas


def kuberay_autoscaling_config(rayservice: dict) -> dict:
    """The autoscaler config KubeRay's autoscaler derives from the RayService's cluster (Ray's own translation of a
    RayCluster: a node type per group with its resources and replica bounds, the head as `headgroup`, the
    upscaling speed and idle timeout of `autoscalerOptions`)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    metadata = rayservice.get("metadata") or {}
    identity = {"name": metadata.get("name", "qrag"), "namespace": metadata.get("namespace", "default")}
    return _derive_autoscaling_config_from_ray_cr({"metadata": identity,
                                                   "spec": rayservice["spec"]["rayClusterConfig"]})


def node_types(rayservice: dict) -> dict[str, dict]:
    """The node types of KubeRay's autoscaler config: {group: {"min_workers", "max_workers", "resources"}}. They do
    not depend on `autoscalerOptions`, which are left out (check_autoscaler_options reports bad ones)."""
    cluster_spec = {key: value for key, value in rayservice["spec"]["rayClusterConfig"].items()
                    if key != "autoscalerOptions"}
    config = kuberay_autoscaling_config({**rayservice, "spec": {"rayClusterConfig": cluster_spec}})
    return config["available_node_types"]


def is_gpu_type(node_type: dict) -> bool:
    """Pure: a node type whose pods have a GPU."""
    return float(node_type["resources"].get("GPU", 0)) > 0


def pods_at_max(types: dict[str, dict]) -> list[Pod]:
    """Pure: the head (when its Ray has CPUs) and every pod each worker group may have, in the groups' order."""
    pods = []
    for name, node_type in types.items():
        count = 1 if name == HEAD_GROUP else int(node_type["max_workers"])
        if name == HEAD_GROUP and not float(node_type["resources"].get("CPU", 0)):
            continue
        pods += [Pod.of(name, node_type) for _ in range(count)]
    return pods


def largest_first(replica: Replica) -> tuple[float, float]:
    """Sort key: GPU replicas first, then by CPUs, largest first (first-fit decreasing packs tighter)."""
    return (-replica.gpus, -replica.cpus)


def pack(replicas: list[Replica], pods: list[Pod]) -> list[Replica]:
    """Pure: place the replicas, largest first, each on the first pod with room (GPU replicas on GPU pods, the
    others on pods without GPUs); returns the replicas that fit nowhere. `pods` are used up."""
    left = []
    for replica in sorted(replicas, key=largest_first):
        pod = next((pod for pod in pods if pod.holds(replica)), None)
        if pod is None:
            left.append(replica)
        else:
            pod.take(replica)
    return left


def pods_needed(replicas: list[Replica], node_type: dict) -> int | None:
    """Pure: how many pods of one node type hold these replicas (packed as `pack` packs), None when one does not
    fit in a pod."""
    pods: list[Pod] = []
    for replica in sorted(replicas, key=largest_first):
        pod = next((pod for pod in pods if pod.holds(replica)), None)
        if pod is None:
            pod = Pod.of("", node_type)
            if not pod.holds(replica):
                return None
            pods.append(pod)
        pod.take(replica)
    return len(pods)


def check_capacity(types: dict[str, dict], replicas: list[Replica]) -> list[str]:
    """Pure: every replica Serve may ask for fits in the pods the autoscaler may start, or a line per kind of
    replica (GPU or CPU) that does not, saying which group's maxReplicas would hold them."""
    problems = []
    left = pack(replicas, pods_at_max(types))
    for gpu in (False, True):
        missing = [replica for replica in left if (replica.gpus > 0) == gpu]
        if not missing:
            continue
        kind = "GPU" if gpu else "CPU"
        wanted = [replica for replica in replicas if (replica.gpus > 0) == gpu]
        need = sum(replica.gpus if gpu else replica.cpus for replica in wanted)
        groups = [name for name, node_type in types.items() if name != HEAD_GROUP and is_gpu_type(node_type) == gpu]
        hints = []
        for name in groups:
            needed = pods_needed(wanted, types[name])
            if needed is not None:
                hints.append(f"{name} maxReplicas {needed}")
        if hints:
            hint = f": {' or '.join(hints)} would hold them all (or lower max_replicas)"
        else:
            hint = f": no {kind} worker group has a pod one of them fits in"
        held = len(wanted) - len(missing)
        problems.append(f"Serve's deployments at max_replicas ask for {len(wanted)} {kind} replicas ({need:g} "
                        f"{kind}s), the pods the worker groups may have at maxReplicas hold {held} of them, so the "
                        f"autoscaler would leave {len(missing)} pending{hint}")
    return problems


def surplus_warnings(types: dict[str, dict], replicas: list[Replica]) -> list[str]:
    """Pure: CPU groups whose pods at maxReplicas hold more than SURPLUS_FACTOR times the CPUs of Serve's
    CPU replicas at max_replicas; GPU groups likewise for GPUs, when a deployment asks for one."""
    warnings = []
    for gpu in (False, True):
        key = "GPU" if gpu else "CPU"
        groups = {name: node_type for name, node_type in types.items()
                  if name != HEAD_GROUP and is_gpu_type(node_type) == gpu}
        need = sum(replica.gpus if gpu else replica.cpus for replica in replicas if (replica.gpus > 0) == gpu)
        if not groups or (gpu and not need):
            continue
        have = sum(node_type["max_workers"] * float(node_type["resources"].get(key, 0))
                   for node_type in groups.values())
        if have > SURPLUS_FACTOR * need:
            sizes = ", ".join(f"{name} maxReplicas {node_type['max_workers']}" for name, node_type in groups.items())
            per_pod = max(float(node_type["resources"].get(key, 0)) for node_type in groups.values())
            warnings.append(f"the {key} worker groups ({sizes}) may hold {have:g} {key}s, Serve's deployments at "
                            f"max_replicas use at most {need:g} (about {math.ceil(need / per_pod)} pods): pods beyond "
                            "those are never started for Serve")
    return warnings


def serve_config_of(rayservice: dict) -> dict | None:
    """The RayService's serveConfigV2 parsed, None when it is not a YAML mapping (the Serve checks say why)."""
    try:
        config = yaml.safe_load((rayservice.get("spec") or {}).get("serveConfigV2") or "")
    except yaml.YAMLError:
        return None
    return config if isinstance(config, dict) else None


def check_rayservice(rayservice: dict) -> tuple[list[str], list[str]]:
    """(problems, warnings) of one RayService: its autoscaler options, and Serve's replicas against its pods."""
    cluster_spec = (rayservice.get("spec") or {}).get("rayClusterConfig")
    if not isinstance(cluster_spec, dict):
        return [], []  # the KubeRay checks report the missing spec
    problems = check_autoscaler_options(cluster_spec)
    serve_config = serve_config_of(rayservice)
    if serve_config is None:
        return problems, []
    try:
        types = node_types(rayservice)
    except (KeyError, TypeError, ValueError) as error:
        return problems + [f"KubeRay's autoscaler cannot read the cluster's groups: {error}"], []
    replicas = serve_replicas(serve_config)
    return problems + check_capacity(types, replicas), surplus_warnings(types, replicas)


def validate(rayservice: dict, report: Any, where: str) -> None:
    """Add a RayService's problems to the validation report, and print its warnings (they do not fail it)."""
    problems, warnings = check_rayservice(rayservice)
    report.extend(where, problems)
    for warning in warnings:
        print(f"warning: {where}: {warning}", file=sys.stderr)
