"""The autoscaler rehearsal's plan (cluster/rehearse_autoscaler.py runs it): what it starts, derived from an
overlay's rendered RayService. KubeRay's own translation of the RayService into the autoscaler's config
(what the autoscaler sidecar runs) with Ray's fake multi-node provider in place of Kubernetes, the head's
resources and environment, and serveConfigV2 as the rehearsal deploys it (one Router replica, one ShardSearcher
group that scales 1..2 at a low target, Serve's proxy on the head only). Pure but for Ray's translation.
docs/CLUSTER.md, "Nodes follow replicas: the autoscaler rehearsal".
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import yaml

from cluster import local_cluster
from qrag_ray.serving.config import ROUTER, SERVE_PROCESS_ENV, WRITER
from tools.validate_deploy.autoscaling import kuberay_autoscaling_config

# Ray's fake multi-node provider, named by module: its `fake_multinode` type needs a defaults file that Ray's
# wheel does not ship, while an `external` provider needs none
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
HEAD_TYPE = "ray.head.default"  # the node type the fake provider gives the head
HEAD_NODE_ID = "f" * 51 + "00000"  # the head's node id under RAY_FAKE_CLUSTER; added nodes count up from it
SEARCHER = "ShardSearcher0"  # one ShardSearcher group serves every shard of the tenant
# The ShardSearcher's autoscaling here: one replica more than the head holds, and a target so low that the
# closed loop's millisecond searches ask for it (ShardSearcherPolicy counts the queries in its calls, averaged
# over time: a few clients whose requests spend most of their time in the Router keep a few hundredths there);
# metrics every second over 5 s and short delays, so the rehearsal takes a minute instead of Serve's 10 s pushes,
# 30 s windows and 600 s downscale delay.
SEARCHER_AUTOSCALING = {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 0.01,
                        "metrics_interval_s": 1.0, "look_back_period_s": 5.0, "upscale_delay_s": 2.0,
                        "downscale_delay_s": 10.0}
NODE_OBJECT_STORE_BYTES = 200 * 2**20  # each added node's object store: the app moves only small replies


@dataclass
class AutoscalerPlan:
    """What the rehearsal starts: the autoscaler's config, the serve config, and the numbers behind them."""

    overlay: str
    group: str  # the worker group whose node type the autoscaler adds
    version: str  # the autoscaler: v1 or v2
    autoscaling: dict  # the config `ray start --autoscaling-config` reads
    serve_config: dict
    head_cpus: int
    searcher_cpus: float
    worker_cpus: float
    idle_timeout_s: float


def fake_autoscaling_config(kuberay_config: dict, *, head_resources: dict[str, float], gcs_address: str,
                            idle_timeout_s: float, version: str) -> dict:
    """Pure: KubeRay's autoscaler config with nodes from Ray's fake multi-node provider on this machine. What
    changes: the provider; the head's node type (the provider's name for it, the rehearsal head's resources);
    every worker group from 0 pods (its `maxReplicas` stays) without the `memory` resource (the fake provider
    cannot start a node that declares it, and no replica asks for memory); the idle timeout. The upscaling speed
    and everything else stay KubeRay's."""
    config = copy.deepcopy(kuberay_config)
    kuberay_provider = config["provider"]
    provider = {key: value for key, value in kuberay_provider.items() if key not in ("type", "namespace")}
    provider |= {"type": "external", "module": FAKE_PROVIDER, "gcs_address": gcs_address, "use_node_id_as_ip": True}
    if version == "v2":  # the v2 instance manager launches each node of a request and knows the head by id
        provider |= {"launch_multiple": True, "head_node_id": HEAD_NODE_ID}
    config["provider"] = provider
    node_types = {}
    for name, node_type in config["available_node_types"].items():
        if name == config["head_node_type"]:
            continue
        resources = {key: value for key, value in node_type["resources"].items() if key != "memory"}
        node_types[name] = {**node_type, "min_workers": 0,
                            "resources": {**resources, "object_store_memory": NODE_OBJECT_STORE_BYTES}}
    node_types[HEAD_TYPE] = {"resources": dict(head_resources), "node_config": {}, "min_workers": 0, "max_workers": 0}
    config["available_node_types"] = node_types
    config["head_node_type"] = HEAD_TYPE
    config["max_workers"] = sum(node_type["max_workers"] for name, node_type in node_types.items() if name != HEAD_TYPE)
    config["idle_timeout_minutes"] = idle_timeout_s / 60.0
    return config


def rehearsal_serve_config(serve_config: dict, *, tenants: str, shards: int, http_port: int,
                           request_timeout_s: float | None = None) -> dict:
    """Pure: serveConfigV2 as the rehearsal deploys it. The app serves the tenants file with one ShardSearcher
    group over all `shards` (ShardSearcher0) and every search goes through it (`local_search_max_bytes: 0`), no
    LLM; the Router stays at one replica, ShardSearcher0 scales by SEARCHER_AUTOSCALING and the Writer is as
    listed; each keeps the manifest's other options (its CPUs, queues). Serve's proxy runs on the head only, on
    `http_port` of loopback: on one machine every node's proxy would bind the same port. `request_timeout_s`
    replaces the app's deadline of a search."""
    config = copy.deepcopy(serve_config)
    config["proxy_location"] = "HeadOnly"
    config["http_options"] = {**(config.get("http_options") or {}), "host": local_cluster.HOST, "port": http_port}
    apps = config.get("applications") or []
    if len(apps) != 1:
        raise ValueError(f"the rehearsal serves one application, serveConfigV2 has {len(apps)}")
    app = apps[0]
    args = dict(app.get("args") or {})
    args.pop("generator", None)
    args.pop("index", None)
    args |= {"tenants": tenants, "shards": shards, "shards_per_searcher": shards, "local_search_max_bytes": 0}
    if request_timeout_s is not None:
        args["request_timeout_s"] = request_timeout_s
    app["args"] = args
    by_name = {deployment.get("name"): deployment for deployment in app.get("deployments") or []}
    missing = [name for name in (ROUTER, SEARCHER, WRITER) if name not in by_name]
    if missing:
        raise ValueError(f"serveConfigV2 lists no deployment {', '.join(missing)}")
    router = {key: value for key, value in by_name[ROUTER].items() if key != "autoscaling_config"}
    router["num_replicas"] = 1
    searcher = dict(by_name[SEARCHER])
    searcher["autoscaling_config"] = {**(searcher.get("autoscaling_config") or {}), **SEARCHER_AUTOSCALING}
    app["deployments"] = [router, searcher, dict(by_name[WRITER])]
    return config


def actor_cpus(deployment: dict) -> float:
    """Pure: the CPUs one replica of a deployment entry holds (Serve's default is 1)."""
    return float((deployment.get("ray_actor_options") or {}).get("num_cpus", 1))


def plan(rendered: list[dict], overlay: str, *, tenants: str, shards: int, http_port: int, gcs_address: str,
         idle_timeout_s: float, group: str | None = None, version: str | None = None,
         request_timeout_s: float | None = None) -> AutoscalerPlan:
    """Pure but for Ray's translation: the rehearsal of the rendered manifests' RayService. The head declares the
    CPUs of one Router, one ShardSearcher0 and the Writer replica and nothing else, so a second ShardSearcher0
    replica does not fit; `group` (default: the first worker group) must hold one."""
    rayservice = next((doc for doc in rendered if doc.get("kind") == "RayService"), None)
    if rayservice is None:
        raise ValueError("no RayService in the manifests")
    cluster_spec = rayservice["spec"]["rayClusterConfig"]
    groups = [worker_group["groupName"] for worker_group in cluster_spec.get("workerGroupSpecs") or []]
    group = group or (groups[0] if groups else "")
    if group not in groups:
        raise ValueError(f"no worker group {group!r} in the RayService (groups: {groups})")
    options = cluster_spec.get("autoscalerOptions") or {}
    version = version or str(options.get("version") or "v2")
    serve_config = rehearsal_serve_config(yaml.safe_load(rayservice["spec"]["serveConfigV2"]), tenants=tenants,
                                          shards=shards, http_port=http_port, request_timeout_s=request_timeout_s)
    deployments = {entry["name"]: entry for entry in serve_config["applications"][0]["deployments"]}
    searcher_cpus = actor_cpus(deployments[SEARCHER])
    others_cpus = actor_cpus(deployments[ROUTER]) + actor_cpus(deployments[WRITER])
    # the head holds a Router, a ShardSearcher0 and the app's Writer replica (one, not autoscaled), in whole CPUs
    # (`ray start` declares whole CPUs): the spare part of a CPU is less than a second ShardSearcher needs
    head_cpus = math.ceil(others_cpus + searcher_cpus)
    if head_cpus - others_cpus >= 2 * searcher_cpus:
        raise ValueError(f"a head of {head_cpus} CPUs would hold two ShardSearcher replicas")
    kuberay = kuberay_autoscaling_config(rayservice)
    worker_cpus = float(kuberay["available_node_types"][group]["resources"].get("CPU", 0))
    if worker_cpus < searcher_cpus:
        raise ValueError(f"a {group} pod has {worker_cpus:g} CPUs, a ShardSearcher replica needs {searcher_cpus:g}")
    head_resources = {"CPU": int(head_cpus), "head": 1.0}  # `head`: the custom resource local_cluster gives it
    autoscaling = fake_autoscaling_config(kuberay, head_resources=head_resources, gcs_address=gcs_address,
                                          idle_timeout_s=idle_timeout_s, version=version)
    return AutoscalerPlan(overlay, group, version, autoscaling, serve_config, int(head_cpus), searcher_cpus,
                          worker_cpus, idle_timeout_s)


def head_env(version: str) -> dict[str, str]:
    """The head's environment: Ray's fake cluster (the provider refuses to start without it, and the head gets
    the provider's head id), the autoscaler's loop every second instead of every 5, the autoscaler version, and
    Serve's request-path switches every RayService pod carries. The autoscaler process inherits it, and so does
    every node it starts."""
    env = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1", **SERVE_PROCESS_ENV,
           # what replaces the autoscaling_config's deprecated metrics_interval_s in later Rays
           "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
           "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1"}
    if version == "v2":
        env |= {"RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": HEAD_NODE_ID,
                "RAY_OVERRIDE_NODE_ID_FOR_TESTING": HEAD_NODE_ID}
    else:
        env |= {"RAY_enable_autoscaler_v2": "0"}
    return env
