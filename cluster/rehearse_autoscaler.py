"""Rehearse the RayService's autoscaling on this machine: nodes follow replicas.

    python -m cluster.rehearse_autoscaler --overlay cpu-dev
    python -m cluster.rehearse_autoscaler --overlay cpu-dev --idle-timeout-s 30 --clients 4 --keep

The overlay's RayService is rendered and KubeRay's own translation (Ray's
`ray.autoscaler._private.kuberay.autoscaling_config`, what the autoscaler sidecar runs) turns its cluster into
the autoscaler's config: a node type per worker group with the group's CPUs and `maxReplicas`, and the
`autoscalerOptions` (upscaling mode, idle timeout). Here the nodes come from Ray's fake multi-node provider
instead of Kubernetes (the provider starts a real Ray node on this machine where KubeRay would create a pod),
the worker groups start at 0 pods, and the idle timeout is short (`--idle-timeout-s`). The autoscaler is Ray's
real one, v2 by default: what Ray 2.60 runs under KubeRay unless `autoscalerOptions.version` says v1.

The head (one node, started with `ray start --autoscaling-config`) declares just the CPUs of one Router replica and
one ShardSearcher replica, so the app's second ShardSearcher replica does not fit on it. The real app
(serveConfigV2 with a tenants file of one small tenant index, served by one ShardSearcher group, the Router at one
replica, Serve's proxy on the head only: every node of this machine would bind the same port) is deployed through
the head's dashboard with the cluster's token, as KubeRay's controller deploys it. Once it is ready and settled
(one ShardSearcher replica, the head alone), closed-loop HTTP clients search the tenant without pause: the
ShardSearcher's autoscaling (a low target, so that a millisecond search still asks for a replica) wants a second
replica, which waits for CPUs; the autoscaler starts a node of the worker group's type; the replica lands on it.
The load then drops to a trickle (one search a second, still checked): Serve stops the replica on the added node
(Serve stops replicas off the head first), the node is idle, and the autoscaler removes it after the idle timeout.
Exit 0 only when Serve's controller logged the upscale and the autoscaler then logged the launch and the removal
of a node of the group's type, the replica ran on the added node, the node went no sooner than the idle timeout
after its replica stopped, and not one search failed (HTTP status and rank 1). Every process the rehearsal starts
is found by the cluster's marker (cluster/node_processes.py) and stopped at the end.

What differs from Kubernetes because every node shares this machine's cores: the added nodes run at a lower CPU
priority (ADDED_NODE_NICE; a pod has CPUs of its own, here its start-up would stall the head's Router), and a
search's deadline is `--request-timeout-s` (30 s) instead of the manifest's 10 s.
docs/CLUSTER.md, "Nodes follow replicas: the autoscaler rehearsal".
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import yaml

from cluster import local_cluster as lc
from cluster.gcs_nodes import live_nodes
from cluster.node_processes import cluster_pids, read_cmdline
from cluster.rehearse import REPO, write_corpus
from cluster.rehearse_service import QUERY, deploy_config
from qrag_ray.serving.config import ROUTER, SERVE_PROCESS_ENV
from tools.validate_deploy.autoscaling import kuberay_autoscaling_config

# Ray's fake multi-node provider, named by module: its `fake_multinode` type needs a defaults file that Ray's
# wheel does not ship, while an `external` provider needs none
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
HEAD_TYPE = "ray.head.default"  # the node type the fake provider gives the head
HEAD_NODE_ID = "f" * 51 + "00000"  # the head's node id under RAY_FAKE_CLUSTER; added nodes count up from it
SEARCHER = "ShardSearcher0"  # one ShardSearcher group serves every shard of the tenant
# The ShardSearcher's autoscaling here: one replica more than the head holds, and a target so low that the
# closed loop's millisecond searches ask for it; metrics every second over 5 s and short delays, so the
# rehearsal takes a minute instead of Serve's 10 s pushes, 30 s windows and 600 s downscale delay.
SEARCHER_AUTOSCALING = {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 0.1,
                        "metrics_interval_s": 1.0, "look_back_period_s": 5.0, "upscale_delay_s": 2.0,
                        "downscale_delay_s": 10.0}
# The nodes the autoscaler adds run at this CPU priority: on Kubernetes an added pod has CPUs of its own, here its
# start-up (a raylet, its agents, a replica importing torch and FAISS) would take the cores of the head's Router
ADDED_NODE_NICE = 10
# how much sooner than the idle timeout after the replica stopped the node may seem to go: the dashboard shows a
# replica gone some seconds after it stopped on a busy machine
IDLE_SLACK_S = 5.0
NODE_OBJECT_STORE_BYTES = 200 * 2**20  # each added node's object store: the app moves only small replies
SCALING_LINE = re.compile(r"^\w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) controller \d+ -- (Upscaling|Downscaling) "
                          r"Deployment\(name='([^']+)'.*? from (\d+) to (\d+) replicas")
EVENT_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*?\b((Adding|Removing) (\d+) node(?:\(s\)|s) "
                        r"of type (\S+?)(?: \(([^)]*)\))?\.)\s*$")


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


@dataclass
class Answer:
    """One search of the load: when it was sent (epoch seconds), how long it took and what came back."""

    sent: float
    seconds: float
    phase: str  # busy or trickle
    status: int  # HTTP status, 0 when no answer came
    rank1: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """HTTP 200 with the expected chunk at rank 1."""
        return self.status == 200 and self.rank1 == QUERY[1]


@dataclass
class Timeline:
    """Epoch seconds of what the rehearsal saw happen, None until it happens."""

    load_started: float | None = None
    serve_asked: float | None = None  # Serve's controller upscaled the ShardSearcher (its log)
    node_joined: float | None = None  # the GCS lists the added node alive
    replica_ready: float | None = None  # a ShardSearcher replica RUNNING on the added node
    load_dropped: float | None = None
    serve_released: float | None = None  # Serve's controller downscaled the ShardSearcher (its log)
    replica_stopped: float | None = None  # the last replica of the app on the added node stopped
    node_removed: float | None = None  # the GCS no longer lists the added node alive
    node_id: str | None = None  # the added node


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
    LLM; the Router stays at one replica and ShardSearcher0 scales by SEARCHER_AUTOSCALING; each keeps the
    manifest's other options (its CPUs, queues). Serve's proxy runs on the head only, on `http_port` of
    loopback: on one machine every node's proxy would bind the same port. `request_timeout_s` replaces the app's
    deadline of a search."""
    config = copy.deepcopy(serve_config)
    config["proxy_location"] = "HeadOnly"
    config["http_options"] = {**(config.get("http_options") or {}), "host": lc.HOST, "port": http_port}
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
    missing = [name for name in (ROUTER, SEARCHER) if name not in by_name]
    if missing:
        raise ValueError(f"serveConfigV2 lists no deployment {', '.join(missing)}")
    router = {key: value for key, value in by_name[ROUTER].items() if key != "autoscaling_config"}
    router["num_replicas"] = 1
    searcher = dict(by_name[SEARCHER])
    searcher["autoscaling_config"] = {**(searcher.get("autoscaling_config") or {}), **SEARCHER_AUTOSCALING}
    app["deployments"] = [router, searcher]
    return config


def actor_cpus(deployment: dict) -> float:
    """Pure: the CPUs one replica of a deployment entry holds (Serve's default is 1)."""
    return float((deployment.get("ray_actor_options") or {}).get("num_cpus", 1))


def plan(rendered: list[dict], overlay: str, *, tenants: str, shards: int, http_port: int, gcs_address: str,
         idle_timeout_s: float, group: str | None = None, version: str | None = None,
         request_timeout_s: float | None = None) -> AutoscalerPlan:
    """Pure but for Ray's translation: the rehearsal of the rendered manifests' RayService. The head declares the
    CPUs of one Router and one ShardSearcher0 replica and nothing else, so a second ShardSearcher0 replica does not
    fit; `group` (default: the first worker group) must hold one."""
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
    head_cpus = actor_cpus(deployments[ROUTER]) + searcher_cpus
    if head_cpus != int(head_cpus):
        raise ValueError(f"the head would need {head_cpus:g} CPUs for a Router and a ShardSearcher replica; "
                         "`ray start` declares whole CPUs")
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


def autoscaler_events(log_text: str) -> list[dict]:
    """Pure: the node launches and removals the autoscaler logged (`Adding 1 node(s) of type cpu-serve.`,
    `Removing 1 nodes of type cpu-serve (idle).`), each with its time (epoch seconds, the log's local time)."""
    out = []
    for line in log_text.splitlines():
        match = EVENT_LINE.match(line)
        if match:
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append({"time": stamp, "action": match.group(3).lower(), "count": int(match.group(4)),
                        "node_type": match.group(5), "reason": match.group(6), "line": match.group(2)})
    return out


def serve_decisions(log_text: str, deployment: str) -> list[dict]:
    """Pure: the upscale and downscale decisions Serve's controller logged for a deployment (`Upscaling
    Deployment(name='ShardSearcher0', app='qrag') from 1 to 2 replicas.`), each with its time (epoch seconds)."""
    out = []
    for line in log_text.splitlines():
        match = SCALING_LINE.match(line)
        if match and match.group(3) == deployment:
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append({"time": stamp, "action": match.group(2).lower(), "from": int(match.group(4)),
                        "to": int(match.group(5))})
    return out


def read_serve_decisions(state: lc.ClusterState, deployment: str) -> list[dict]:
    """What Serve's controller of the cluster decided so far for a deployment (its logs in the session's logs)."""
    logs = sorted((Path(state.temp_dir) / "session_latest" / "logs" / "serve").glob("controller_[0-9]*.log"))
    decisions = [decision for log in logs for decision in serve_decisions(log.read_text(errors="replace"), deployment)]
    return sorted(decisions, key=lambda decision: decision["time"])


def read_autoscaler_events(state: lc.ClusterState) -> list[dict]:
    """What the autoscaler of the cluster logged so far (its monitor.log in the session's logs)."""
    log = Path(state.temp_dir) / "session_latest" / "logs" / "monitor.log"
    return autoscaler_events(log.read_text(errors="replace")) if log.exists() else []


class ClosedLoop:
    """The load: `clients` threads that each send the next search as soon as the last one answered (a closed loop),
    until `trickle()`, from which on one client sends one search every `trickle_gap_s`. Every answer is kept."""

    def __init__(self, url: str, key: str, clients: int, trickle_gap_s: float = 1.0) -> None:
        self.url = f"{url}/v1/search"
        self.headers = {"Authorization": f"Bearer {key}"}
        self.clients = clients
        self.trickle_gap_s = trickle_gap_s
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._busy = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start every client in the busy phase."""
        self._busy.set()
        self._threads = [threading.Thread(target=self._run, args=(number,), daemon=True)
                         for number in range(self.clients)]
        for thread in self._threads:
            thread.start()

    def trickle(self) -> None:
        """From now on one search every `trickle_gap_s`."""
        self._busy.clear()

    def stop(self) -> list[Answer]:
        """Stop every client (each finishes its search in flight) and return every answer."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        return list(self.answers)

    def _run(self, number: int) -> None:
        body = {"query": QUERY[0], "k": 3}
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                busy = self._busy.is_set()
                if not busy and number > 0:
                    self._stop.wait(0.2)
                    continue
                self._record(self._search(client, body, "busy" if busy else "trickle"))
                if not busy:
                    self._stop.wait(self.trickle_gap_s)

    def _search(self, client: httpx.Client, body: dict, phase: str) -> Answer:
        sent = time.time()
        try:
            reply = client.post(self.url, json=body, headers=self.headers)
        except httpx.HTTPError as error:
            return Answer(sent, time.time() - sent, phase, 0, None, f"{type(error).__name__}: {error}"[:300])
        results = (reply.json().get("results") or []) if reply.status_code == 200 else []
        rank1 = results[0].get("doc_id") if results else None
        error = None if reply.status_code == 200 else reply.text[:300]
        return Answer(sent, time.time() - sent, phase, reply.status_code, rank1, error)

    def _record(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)


def serve_status(state: lc.ClusterState, token: str) -> dict:
    """The dashboard's answer on the Serve applications (with the cluster's token), {} when it does not answer."""
    try:
        reply = httpx.get(f"{state.dashboard_url}/api/serve/applications/",
                          headers={"Authorization": f"Bearer {token}"}, timeout=10)
        return reply.json() if reply.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def replicas(status: dict) -> list[dict]:
    """Pure: every replica of every app in the dashboard's answer: deployment, state, node id."""
    return [{"deployment": name, "state": replica.get("state"), "node_id": replica.get("node_id")}
            for app in (status.get("applications") or {}).values()
            for name, deployment in (app.get("deployments") or {}).items()
            for replica in deployment.get("replicas") or []]


def watch(state: lc.ClusterState, token: str, timeline: Timeline, until: str, timeout: float) -> None:
    """Poll the dashboard and the GCS twice a second and note what happens in `timeline`, until `until` has
    happened (a Timeline field name) or `timeout` seconds pass (RuntimeError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = serve_status(state, token)
        try:
            alive = {node["node_id"] for node in live_nodes(state.address)}
        except Exception:
            alive = None
        now = time.time()
        if alive is not None:
            added = sorted(alive - {HEAD_NODE_ID})
            if timeline.node_id is None and added:
                timeline.node_id = added[0]
                timeline.node_joined = now
            if timeline.node_id and timeline.node_removed is None and timeline.node_id not in alive:
                timeline.node_removed = now
        on_node = [replica for replica in replicas(status) if replica["node_id"] == timeline.node_id]
        if timeline.node_id and timeline.replica_ready is None and any(
                replica["deployment"] == SEARCHER and replica["state"] == "RUNNING" for replica in on_node):
            timeline.replica_ready = now
        if on_node:  # the last stop counts: Serve may take a replica off the node and put one back
            timeline.replica_stopped = None
        elif timeline.replica_ready and timeline.replica_stopped is None and status:
            timeline.replica_stopped = now
        if getattr(timeline, until) is not None:
            return
        time.sleep(0.5)
    raise RuntimeError(f"waited {timeout:.0f}s for {until.replace('_', ' ')}: {json.dumps(asdict(timeline))}")


def seconds_of(timeline: Timeline, events: list[dict]) -> dict[str, float | None]:
    """Pure: the rehearsal's timings. From the start of the load: Serve asks for the replica, the autoscaler logs
    the launch, the node joins, the replica runs there. From the drop of the load: Serve lets the replica go, it
    stops, the autoscaler logs the removal, the node is gone. And the spans the docs quote: node launch (Serve
    asks -> node joined), replica start (node joined -> replica running), idle (replica stopped -> node
    removed). Serve's decisions are those its controller logged."""
    added = next((event["time"] for event in events if event["action"] == "adding"), None)
    removed = next((event["time"] for event in events if event["action"] == "removing"), None)

    def since(start: float | None, end: float | None) -> float | None:
        return round(end - start, 1) if start is not None and end is not None else None

    return {"serve_asked": since(timeline.load_started, timeline.serve_asked),
            "launch_logged": since(timeline.load_started, added),
            "node_joined": since(timeline.load_started, timeline.node_joined),
            "replica_ready": since(timeline.load_started, timeline.replica_ready),
            "serve_released": since(timeline.load_dropped, timeline.serve_released),
            "replica_stopped": since(timeline.load_dropped, timeline.replica_stopped),
            "removal_logged": since(timeline.load_dropped, removed),
            "node_removed": since(timeline.load_dropped, timeline.node_removed),
            "node_launch": since(timeline.serve_asked, timeline.node_joined),
            "replica_start": since(timeline.node_joined, timeline.replica_ready),
            "idle": since(timeline.replica_stopped, timeline.node_removed)}


def verdict(rehearsal: AutoscalerPlan, timeline: Timeline, events: list[dict], answers: list[Answer],
            initial: list[dict]) -> list[str]:
    """Pure: what is wrong with a rehearsal's run (nothing: the node followed the replica)."""
    problems = []
    on_head = sorted(replica["deployment"] for replica in initial if replica["node_id"] == HEAD_NODE_ID)
    if on_head != sorted([ROUTER, SEARCHER]):
        problems.append(f"before the load the head held {on_head}, not one {ROUTER} and one {SEARCHER} replica")
    group_events = [event for event in events if event["node_type"] == rehearsal.group]
    launches = [event["time"] for event in group_events if event["action"] == "adding"]
    if timeline.serve_asked is None:
        problems.append(f"Serve's controller logged no upscale of {SEARCHER} under the load")
    if not launches:
        problems.append(f"the autoscaler logged no launch of a {rehearsal.group} node")
    elif timeline.serve_asked is not None and launches[0] < timeline.serve_asked - 1.0:
        problems.append("the autoscaler launched the node before Serve asked for the replica")
    if not any(event["action"] == "removing" and event["reason"] == "idle" for event in group_events):
        problems.append(f"the autoscaler logged no removal of an idle {rehearsal.group} node")
    if timeline.replica_ready is None:
        problems.append(f"no {SEARCHER} replica ran on an added node")
    if timeline.node_removed is None:
        problems.append("the added node was not removed")
    elif timeline.replica_stopped is not None:
        idle = timeline.node_removed - timeline.replica_stopped
        if idle < rehearsal.idle_timeout_s - IDLE_SLACK_S:
            problems.append(f"the node went {idle:.1f}s after its replica stopped, before the idle timeout "
                            f"({rehearsal.idle_timeout_s:g}s)")
    failed = [answer for answer in answers if not answer.ok]
    if failed:
        samples = "; ".join(f"{answer.phase} HTTP {answer.status} rank 1 {answer.rank1!r} {answer.error or ''}"
                            for answer in failed[:3])
        problems.append(f"{len(failed)} of {len(answers)} searches failed: {samples}")
    busy = sum(answer.phase == "busy" for answer in answers)
    trickle = sum(answer.phase == "trickle" for answer in answers)
    if busy < 20 or trickle < 5:
        problems.append(f"too little load to show anything: {busy} busy and {trickle} trickle searches")
    return problems


def load_summary(answers: list[Answer], load_started: float | None) -> dict:
    """Pure: the searches of each phase, the failed ones, the slowest answer, and the first failures (with their
    time after the start of the load)."""
    failed = [answer for answer in answers if not answer.ok]
    slowest = max(answers, key=lambda answer: answer.seconds, default=None)
    return {"total": len(answers), "failed": len(failed),
            "busy": sum(answer.phase == "busy" for answer in answers),
            "trickle": sum(answer.phase == "trickle" for answer in answers),
            "slowest_s": round(max((answer.seconds for answer in answers), default=0.0), 2),
            "slowest_at": round(slowest.sent - (load_started or slowest.sent), 1) if slowest else None,
            "failures": [{"at": round(answer.sent - (load_started or answer.sent), 1), "phase": answer.phase,
                          "status": answer.status, "rank1": answer.rank1, "error": answer.error}
                         for answer in failed[:5]]}


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((lc.HOST, 0))
        return sock.getsockname()[1]


def start_index_build(work: Path) -> subprocess.Popen:
    """A chunk index of a few documents in one shard (plain `qrag index`), built in the background while the
    cluster starts."""
    corpus = work / "corpus.jsonl"
    write_corpus(corpus, "jsonl", 6)
    log = open(work / "index.log", "wb")  # noqa: SIM115 - the child writes it until it ends
    return subprocess.Popen([sys.executable, "-m", "qrag_ray.cli", "index", "--input", str(corpus), "--output",
                             str(work / "index"), "--representation", "chunk", "--generator", "none", "--shards", "1",
                             "--no-bm25", "--overwrite"], stdout=log, stderr=subprocess.STDOUT)


def add_tenant(index: Path, tenants: Path) -> str:
    """Write a tenants file with one tenant on `index` (`qrag tenants add`); its API key."""
    add = subprocess.run([sys.executable, "-m", "qrag_ray.cli", "tenants", "add", "--file", str(tenants), "--name",
                          "rehearsal", "--index", str(index)], capture_output=True, text=True, timeout=120)
    if add.returncode != 0:
        raise RuntimeError(f"qrag tenants add failed: {add.stderr[-2000:]}")
    return add.stdout.strip().splitlines()[-1]


def index_shards(index: Path) -> int:
    """The number of shards of an index folder (its manifest)."""
    from qrag_ray.index.format import load_manifest
    from qrag_ray.index.versions import resolve_index

    return load_manifest(resolve_index(str(index)).dir).num_shards


@dataclass
class Run:
    """One rehearsal's run: the plan, the cluster, what was seen."""

    rehearsal: AutoscalerPlan
    work: Path
    token: str
    name: str = field(default_factory=lambda: f"ra{os.getpid() % 100000}")
    state: lc.ClusterState | None = None
    timeline: Timeline = field(default_factory=Timeline)
    events: list[dict] = field(default_factory=list)  # the autoscaler's, from the start of the load
    events_before_load: int = 0
    answers: list[Answer] = field(default_factory=list)
    initial: list[dict] = field(default_factory=list)
    seconds: dict[str, float | None] = field(default_factory=dict)


def start_head(run: Run, base_port: int, timeout: float) -> None:
    """The head, with the autoscaler (`ray start --head --autoscaling-config`)."""
    cdir = lc.default_dir(run.name)
    cdir.mkdir(parents=True, exist_ok=True)
    config_path = cdir / "autoscaling.yaml"
    config_path.write_text(yaml.safe_dump(run.rehearsal.autoscaling, sort_keys=False))
    shape = lc.NodeShape("head", run.rehearsal.head_cpus, env=head_env(run.rehearsal.version),
                         start_args=["--autoscaling-config", str(config_path)])
    run.state = lc.up(name=run.name, shapes=[shape], base_port=base_port, object_store_mb=200, timeout=timeout,
                      quiet=True, env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": run.token})
    if not lower_autoscaler_priority(cdir):
        raise RuntimeError(f"no autoscaler process in the cluster (see {cdir / 'ray' / 'session_latest' / 'logs'})")


def lower_autoscaler_priority(cdir: Path, nice: int = ADDED_NODE_NICE) -> int:
    """Set every thread of the cluster's autoscaler process to `nice`, so the nodes it starts (processes inherit
    the niceness of the thread that starts them) and their workers yield the CPU to the head's processes;
    returns the threads changed (0: no autoscaler found)."""
    changed = 0
    for pid in cluster_pids(cdir):
        if b"monitor.py" not in read_cmdline(pid):
            continue
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
                changed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return changed


def wait_ready(url: str, timeout: float) -> None:
    """Wait for the app's /readyz (200 once the Router's embedder and the tenant's shards are loaded): a cold app's
    first searches are not what the rehearsal measures. No search is sent: at the rehearsal's target a single
    search in flight is enough for Serve to ask for the second replica."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the app's /readyz did not answer 200 in {timeout:.0f}s")


def settle(run: Run, timeout: float) -> list[dict]:
    """Wait until the head is the only node and ShardSearcher0 has its one replica, running, and return the app's
    replicas then. The app's start may have asked for a second one already (at start-up the Router has every
    shard loaded: a call in flight, which the rehearsal's low target counts): then Serve lets it go when its
    window has passed, and a node added for it goes after the idle timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = replicas(serve_status(run.state, run.token))
        searchers = [replica for replica in current if replica["deployment"] == SEARCHER]
        try:
            alone = len(live_nodes(run.state.address)) == 1
        except Exception:
            alone = False
        if alone and len(searchers) == 1 and searchers[0]["state"] == "RUNNING":
            return current
        time.sleep(1.0)
    raise RuntimeError(f"the app did not settle at one {SEARCHER} replica on the head alone in {timeout:.0f}s")


def rehearse(run: Run, key: str, clients: int, timeout: float, hold_s: float = 5.0) -> None:
    """Deploy the app and wait until it is ready, load it until the replica runs on an added node (then `hold_s`
    more), drop the load to a trickle and wait for the node to go."""
    started = time.monotonic()
    deploy_config(run.state.dashboard_url, run.token, run.rehearsal.serve_config, timeout)
    run.seconds["deploy"] = round(time.monotonic() - started, 1)
    url = f"http://{lc.HOST}:{run.rehearsal.serve_config['http_options']['port']}"
    wait_ready(url, timeout)
    settled = time.monotonic()
    run.initial = settle(run, run.rehearsal.idle_timeout_s + timeout)
    run.seconds["settle"] = round(time.monotonic() - settled, 1)
    load = ClosedLoop(url, key, clients)
    run.timeline.load_started = time.time()
    load.start()
    try:
        watch(run.state, run.token, run.timeline, "replica_ready", timeout)
        time.sleep(hold_s)  # both replicas serve for a while
        run.timeline.load_dropped = time.time()
        load.trickle()
        watch(run.state, run.token, run.timeline, "node_removed", run.rehearsal.idle_timeout_s + timeout)
    finally:
        run.answers = load.stop()
        events = read_autoscaler_events(run.state)
        run.events = [event for event in events if event["time"] >= run.timeline.load_started]
        run.events_before_load = len(events) - len(run.events)
        decisions = read_serve_decisions(run.state, SEARCHER)
        run.timeline.serve_asked = next((decision["time"] for decision in decisions if decision["action"] == "upscaling"
                                         and decision["time"] >= run.timeline.load_started), None)
        if run.timeline.load_dropped is not None:
            run.timeline.serve_released = next(
                (decision["time"] for decision in decisions
                 if decision["action"] == "downscaling" and decision["time"] >= run.timeline.load_dropped), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.rehearse_autoscaler", description=__doc__.split("\n\n")[0])
    parser.add_argument("--overlay", default="cpu-dev", help="k8s/overlays/<name> or a kustomization folder")
    parser.add_argument("--group", default=None, help="the worker group the autoscaler adds (default: the first)")
    parser.add_argument("--autoscaler", choices=("v1", "v2"), default=None,
                    help="the autoscaler (default: autoscalerOptions.version, else v2 as KubeRay runs Ray 2.60)")
    parser.add_argument("--idle-timeout-s", type=float, default=15.0,
                    help="seconds an added node may idle before it is removed (the manifest's is minutes)")
    parser.add_argument("--clients", type=int, default=2, help="closed-loop clients of the busy phase")
    parser.add_argument("--request-timeout-s", type=float, default=30.0,
                    help="the app's deadline of a search here (the manifest's is for a pod with CPUs of its own; "
                         "on this machine the Router shares its cores with the whole cluster)")
    parser.add_argument("--index", default=None, help="serve this index (default: build a small one)")
    parser.add_argument("--work", default=None, help="folder for the index and tenants (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder and the cluster's logs")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds each step may take")
    args = parser.parse_args(argv)
    token = secrets.token_hex(32)
    # this process asks the cluster's GCS: Ray reads the token once, so it is set before anything imports Ray
    os.environ["RAY_AUTH_TOKEN"] = token
    os.environ["RAY_AUTH_MODE"] = "token"
    from tools.validate_deploy.render import render_kustomization

    work = Path(args.work or tempfile.mkdtemp(prefix="qra-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    overlay = Path(args.overlay) if Path(args.overlay).is_dir() else REPO / "k8s" / "overlays" / args.overlay
    started = time.monotonic()
    build = None if args.index else start_index_build(work)
    index = Path(args.index).resolve() if args.index else work / "index"
    base_port = lc.pick_base_port(0)
    problems: list[str] = []
    run = None
    stopped = True
    try:
        rehearsal = plan(render_kustomization(overlay), overlay.name, tenants=str(work / "tenants.yaml"),
                         shards=1 if build else index_shards(index), http_port=free_port(),
                         gcs_address=f"{lc.HOST}:{base_port}", idle_timeout_s=args.idle_timeout_s,
                         group=args.group, version=args.autoscaler, request_timeout_s=args.request_timeout_s)
        run = Run(rehearsal, work, token)
        most = rehearsal.autoscaling["available_node_types"][rehearsal.group]["max_workers"]
        print(f"  head: {rehearsal.head_cpus} CPUs ({ROUTER} + {SEARCHER}); {rehearsal.group}: "
              f"{rehearsal.worker_cpus:g} CPUs, 0..{most} nodes; autoscaler {rehearsal.version}, idle timeout "
              f"{rehearsal.idle_timeout_s:g}s", file=sys.stderr)
        start_head(run, base_port, args.timeout)
        run.seconds["cluster"] = round(time.monotonic() - started, 1)
        if build is not None and build.wait(timeout=args.timeout * 4) != 0:
            raise RuntimeError(f"qrag index failed: {(work / 'index.log').read_text()[-2000:]}")
        run.seconds["index"] = round(time.monotonic() - started, 1)
        key = add_tenant(index, work / "tenants.yaml")
        rehearse(run, key, args.clients, args.timeout)
    except (RuntimeError, ValueError, OSError, httpx.HTTPError, subprocess.TimeoutExpired) as error:
        problems.append(f"{type(error).__name__}: {error}" if not isinstance(error, RuntimeError) else str(error))
    finally:
        if build is not None and build.poll() is None:
            build.kill()
            build.wait()
        if run is not None:
            stopped = lc.down(name=run.name, keep_logs=args.keep, quiet=True)
    if run is not None:
        run.seconds |= seconds_of(run.timeline, run.events)
        if not problems:
            problems = verdict(run.rehearsal, run.timeline, run.events, run.answers, run.initial)
        for event in run.events:
            print(f"  autoscaler: {event['line']}", file=sys.stderr)
    if not stopped:
        problems.append("some processes of the cluster survived its teardown")
    summary = load_summary(run.answers, run.timeline.load_started) if run else {}
    print("\n".join(problems) or "the autoscaler added a node for the replica and removed it when idle",
          file=sys.stderr)
    print(json.dumps({"overlay": overlay.name, "ok": not problems, "group": run.rehearsal.group if run else None,
                      "autoscaler": run.rehearsal.version if run else None,
                      "idle_timeout_s": args.idle_timeout_s, "node_id": run.timeline.node_id if run else None,
                      "events": [{key: value for key, value in event.items() if key != "time"}
                                 for event in (run.events if run else [])],
                      "events_before_load": run.events_before_load if run else 0,
                      "requests": summary, "seconds": run.seconds if run else {},
                      "seconds_total": round(time.monotonic() - started, 1), "problems": problems,
                      "cluster_dir": str(lc.default_dir(run.name)) if run else None, "work": str(work)}))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
