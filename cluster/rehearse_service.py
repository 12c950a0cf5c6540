"""Rehearse the KubeRay RayService on this machine, the way the cluster runs it.

    python -m cluster.rehearse_service --overlay cpu-dev
    python -m cluster.rehearse_service --overlay cpu-dev --pods cpu-serve=1 --set local_search_max_bytes=0

The overlay is rendered and its RayService becomes a local Ray cluster laid out as cluster/rehearse.py lays
out a RayJob's (one node per pod with its pod's resources and its container's environment, its home
read-only, its volumes local folders), and here each pod also has a network of its own
(cluster/pod_network.py): its own address and ports, so Serve's port 8000 and the Router replicas' own
ports are on every pod and what one pod asks of another goes between addresses, as on Kubernetes. A small
index is published on the claim as the first version of a root (`qrag index`, `qrag publish`) and a tenants
file with one tenant on it, its key of scope write, is written into the Secret's (`qrag tenants add`);
serveConfigV2 is deployed as KubeRay's controller deploys it (PUT /api/serve/applications/ on the head's
dashboard, with the cluster's token); `--set` changes an app arg (`local_search_max_bytes=0` sends a small
tenant through the ShardSearchers too). When the app is RUNNING, every pod's port 8000 is asked from this
machine, as a Service asks a pod: /-/healthz 200, a search with the key whose rank 1 is the expected chunk, a
wrong key 401; and what listens on the pod's port 8000 must be what its environment asks for (HAProxy with
RAY_SERVE_ENABLE_HA_PROXY=1, else Serve's proxy). Then a document is written through the head's port 8000
and must become searchable, and rank first for its question on every pod (the Writer writes into the root
on the claim, so the claim's mount must be writable). Exit 0 only then.
Needs root (network namespaces). docs/CLUSTER.md, "Rehearsing the serving endpoint".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from cluster import local_cluster, pod_network
from cluster.gcs_nodes import live_nodes
from cluster.pod_layout import Pod, map_text, service_plan
from cluster.readonly import make_readonly
from cluster.rehearse import REPO, parse_pairs, pod_shapes, readonly_folders, write_corpus
from qrag_client import QragClient, QragClientError

TENANT = "rehearsal"
INDEX = "/mnt/qrag/indexes/rehearsal"  # pod path on the claim every pod mounts
HAPROXY_FILES = "/tmp/haproxy-serve"  # Ray's default folder of Serve's HAProxy files (the manifests keep it)
QUERY = ("What does the break statement do inside a loop?", "break")  # a question and its chunk's document
# a document written through one pod's write route, and the question every pod is then asked about it
WRITTEN = {"id": "walrus", "title": "The walrus operator",
           "text": "The walrus operator := assigns a value to a name inside an expression, such as the condition "
                   "of a while loop, and the expression takes that value."}
WRITTEN_QUERY = "What does the walrus operator := do?"


@dataclass
class ServiceRehearsal:
    overlay: str
    pods: tuple[Pod, ...]
    work: Path
    net: pod_network.PodNetwork
    token: str
    shapes: list[local_cluster.NodeShape]
    serve_config: dict  # serveConfigV2 with local paths and the --set app args
    paths: dict[str, Path]  # the head's pod path -> local folder (claims and Secrets are every pod's)
    key: str = ""
    node_ids: list[str] = field(default_factory=list)
    name: str = field(default_factory=lambda: f"rs{os.getpid() % 100000}")
    state: local_cluster.ClusterState | None = None

    @property
    def readonly(self) -> list[str]:
        return readonly_folders(self.shapes)


def prepare(overlay: str, work: Path, *, pods: dict[str, int] | None = None, app_args: dict[str, str] | None = None,
            code: str | None = None, token: str | None = None) -> ServiceRehearsal:
    """Render the overlay and lay out its pods, their network plan and the serve config (no process started).
    The cluster's token is new unless given: a process reads Ray's token once, so one that watches several
    rehearsals in turn gives them all its own."""
    from tools.validate_deploy.render import render_kustomization

    path = Path(overlay) if Path(overlay).is_dir() else REPO / "k8s" / "overlays" / overlay
    pod_list, config = service_plan(render_kustomization(path), pods)
    token = token or secrets.token_hex(32)
    net = pod_network.plan(len(pod_list))
    shapes, head_paths = pod_shapes(pod_list, work, token, code, net)
    for app in config.get("applications") or []:
        app["args"] = {**(app.get("args") or {}), **{k: yaml.safe_load(v) for k, v in (app_args or {}).items()}}
    config = json.loads(map_text(json.dumps(config), head_paths))
    return ServiceRehearsal(path.name, pod_list, work, net, token, shapes, config, head_paths)


def build_tenant(rehearsal: ServiceRehearsal, timeout: float = 900.0) -> None:
    """A chunk index of a few documents published as the first version of a root on the claim (`qrag index`,
    then `qrag publish`, as the indexing job publishes one) and a tenants file in the Secret's folder with one
    tenant on that root, its key of scope write kept."""
    root = Path(map_text(INDEX, rehearsal.paths))
    built = root.with_name(root.name + "-build")
    corpus = rehearsal.work / "corpus.jsonl"
    write_corpus(corpus, "jsonl", 6)
    shards = max(1, min(4, int(app_config(rehearsal).get("args", {}).get("shards") or 1)))
    cli = [sys.executable, "-m", "qrag_ray.cli"]
    run = subprocess.run([*cli, "index", "--input", str(corpus), "--output", str(built), "--representation", "chunk",
                          "--generator", "none", "--shards", str(shards), "--no-bm25", "--overwrite"],
                         capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"qrag index failed: {(run.stdout + run.stderr)[-2000:]}")
    publish = subprocess.run([*cli, "publish", str(built), "--root", str(root)], capture_output=True, text=True,
                             timeout=300)
    if publish.returncode != 0:
        raise RuntimeError(f"qrag publish failed: {publish.stderr[-2000:]}")
    tenants = Path(app_config(rehearsal)["args"]["tenants"])
    add = subprocess.run([*cli, "tenants", "add", "--file", str(tenants), "--name", TENANT, "--index", str(root),
                          "--scope", "write"], capture_output=True, text=True, timeout=120)
    if add.returncode != 0:
        raise RuntimeError(f"qrag tenants add failed: {add.stderr[-2000:]}")
    rehearsal.key = add.stdout.strip().splitlines()[-1]


def app_config(rehearsal: ServiceRehearsal) -> dict:
    """The app's entry of the serve config the rehearsal deploys (its args, deployments; change before `deploy`)."""
    return (rehearsal.serve_config.get("applications") or [{}])[0]


def deployments(rehearsal: ServiceRehearsal) -> list[dict]:
    """The app's `deployments:` entries of the serve config the rehearsal deploys (change them before `deploy`)."""
    return app_config(rehearsal).setdefault("deployments", [])


def start(rehearsal: ServiceRehearsal, timeout: float = 300.0) -> local_cluster.ClusterState:
    pod_network.up(rehearsal.net)
    make_readonly(rehearsal.readonly)
    rehearsal.state = local_cluster.up(name=rehearsal.name, shapes=rehearsal.shapes, object_store_mb=300,
                                       timeout=timeout, quiet=False,
                            env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": rehearsal.token})
    rehearsal.node_ids = [n["node_id"] for n in live_nodes(rehearsal.state.address)]
    return rehearsal.state


def stop(rehearsal: ServiceRehearsal) -> bool:
    # also after a failed start: its folder (local_cluster.up ended its processes)
    stopped = local_cluster.down(name=rehearsal.name, quiet=True)
    pod_network.down(rehearsal.net)
    make_readonly(rehearsal.readonly, writable=True)
    # Serve's HAProxy files: a folder per node under Ray's default, on the pods' /tmp
    for node_id in rehearsal.node_ids:
        shutil.rmtree(Path(HAPROXY_FILES) / node_id, ignore_errors=True)
    return stopped


def replicas_per_pod(rehearsal: ServiceRehearsal, status: dict) -> dict[str, int]:
    """Pure: how many running replicas of the app each pod holds, from the dashboard's answer."""
    by_ip = {rehearsal.net.ip(i): pod.name for i, pod in enumerate(rehearsal.pods)}
    out = dict.fromkeys(by_ip.values(), 0)
    for app in (status.get("applications") or {}).values():
        for dep in (app.get("deployments") or {}).values():
            for rep in dep.get("replicas") or []:
                if rep.get("state") == "RUNNING" and rep.get("node_ip") in by_ip:
                    out[by_ip[rep["node_ip"]]] += 1
    return out


def deploy(rehearsal: ServiceRehearsal, timeout: float = 600.0) -> dict:
    """PUT serveConfigV2 on the head's dashboard as KubeRay's controller does, then wait for every app to be
    RUNNING; returns the dashboard's last answer. A failed deploy (DEPLOY_FAILED) ends the wait."""
    return deploy_config(rehearsal.state.dashboard_url, rehearsal.token, rehearsal.serve_config, timeout)


def deploy_config(dashboard_url: str, token: str, serve_config: dict, timeout: float = 600.0) -> dict:
    """PUT a serve config on a dashboard with the cluster's token (what KubeRay's controller does with
    serveConfigV2) and wait for every app to be RUNNING; returns the dashboard's last answer."""
    url = f"{dashboard_url}/api/serve/applications/"
    headers = {"Authorization": f"Bearer {token}"}
    put = httpx.put(url, json=serve_config, headers=headers, timeout=60)
    if put.status_code != 200:
        raise RuntimeError(f"the dashboard refused the serve config: HTTP {put.status_code} {put.text[:500]}")
    deadline = time.monotonic() + timeout
    last = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            last = httpx.get(url, headers=headers, timeout=30).json()
        states = {n: a.get("status") for n, a in (last.get("applications") or {}).items()}
        if states and all(s == "RUNNING" for s in states.values()):
            return last
        if "DEPLOY_FAILED" in states.values():
            break
        time.sleep(2.0)
    apps = {n: {"status": a.get("status"), "message": (a.get("message") or "")[-1500:]}
            for n, a in (last.get("applications") or {}).items()}
    raise RuntimeError(f"the app did not reach RUNNING in {timeout:.0f}s: {json.dumps(apps)}")


def listener(rehearsal: ServiceRehearsal, pod: int, port: int = 8000) -> str:
    """The process that listens on `port` in pod i's network ("haproxy", "ray::ProxyActor", ...)."""
    out = subprocess.run([*rehearsal.net.exec_prefix(pod), "ss", "-Hltnp", f"sport = :{port}"], capture_output=True,
                         text=True).stdout
    names = sorted(set(re.findall(r'\(\("([^"]+)"', out)))
    return ",".join(names) or "nothing"


def expected_listener(pod: Pod) -> str:
    return "haproxy" if pod.env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" else "ray::ProxyActor"


def ask_pod(rehearsal: ServiceRehearsal, pod: int, timeout: float = 120.0) -> dict:
    """One pod's port 8000 from this machine: healthz, a search with the key, one with a wrong key."""
    base = f"http://{rehearsal.net.ip(pod)}:8000"
    deadline = time.monotonic() + timeout
    health = None
    while time.monotonic() < deadline:  # a pod's ingress starts when it holds replicas or is the head
        try:
            health = httpx.get(f"{base}/-/healthz", timeout=10).status_code
            if health == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    body = {"query": QUERY[0], "k": 3}
    started = time.monotonic()
    answer = httpx.post(f"{base}/v1/search", json=body, headers={"Authorization": f"Bearer {rehearsal.key}"},
                        timeout=60)
    took_ms = round((time.monotonic() - started) * 1000, 1)
    bad = httpx.post(f"{base}/v1/search", json=body, headers={"Authorization": "Bearer qrag-wrong-key"}, timeout=60)
    results = answer.json().get("results") or [] if answer.status_code == 200 else []
    return {"pod": rehearsal.pods[pod].name, "ip": rehearsal.net.ip(pod), "listener": listener(rehearsal, pod),
            "expected": expected_listener(rehearsal.pods[pod]),
            "healthz": health, "search": answer.status_code, "search_ms": took_ms,
            "rank1": results[0].get("doc_id") if results else None,
            "path": (answer.json().get("timings") or {}).get("path") if answer.status_code == 200 else None,
            "wrong_key": bad.status_code, "error": None if answer.status_code == 200 else answer.text[:300]}


def write_through(rehearsal: ServiceRehearsal, pod: int = 0, timeout: float = 300.0) -> dict:
    """WRITTEN upserted through one pod's port 8000 with the tenant's write key and waited on until it is
    searchable (the Writer applies it on whichever pod holds it, into the root on the claim), then asked for on
    every pod: each pod's rank 1 (every Router replica sees the write). Through the project's API client."""
    started = time.monotonic()
    try:
        with QragClient(f"http://{rehearsal.net.ip(pod)}:8000", rehearsal.key) as client:
            status = client.wait_until_searchable(client.upsert([WRITTEN]), timeout=timeout, poll=0.5).status
    except QragClientError as error:
        status = f"{type(error).__name__}: {error}"
    seconds = round(time.monotonic() - started, 1)
    rank1 = {}
    for number, shape in enumerate(rehearsal.pods):
        try:
            with QragClient(f"http://{rehearsal.net.ip(number)}:8000", rehearsal.key) as client:
                results = client.search(WRITTEN_QUERY, k=3).results
            rank1[shape.name] = results[0].doc_id if results else "no results"
        except QragClientError as error:
            rank1[shape.name] = f"{type(error).__name__}: {error}"
    return {"status": status, "seconds": seconds, "rank1": rank1}


def verdict(row: dict) -> list[str]:
    """Pure: what is wrong with one pod's answers (nothing: it serves as the manifest means)."""
    out = []
    if row["listener"] != row["expected"]:
        out.append(f"port 8000 is {row['listener']}, the pod's env asks for {row['expected']}")
    if row["healthz"] != 200:
        out.append(f"/-/healthz answered {row['healthz']}")
    if row["search"] != 200 or row["rank1"] != QUERY[1]:
        out.append(f"search: HTTP {row['search']}, rank 1 {row['rank1']!r} (expected {QUERY[1]!r}) "
                   f"{row['error'] or ''}")
    if row["wrong_key"] != 401:
        out.append(f"a wrong key got HTTP {row['wrong_key']}, not 401")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.rehearse_service", description=__doc__.split("\n\n")[0])
    parser.add_argument("--overlay", default="cpu-dev", help="k8s/overlays/<name> or a kustomization folder")
    parser.add_argument("--pods", action="append", default=[], metavar="GROUP=N,...",
                        help="pods per worker group (default: each group's replicas, at least 1)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="an app arg of serveConfigV2 (YAML value), e.g. local_search_max_bytes=0")
    parser.add_argument("--code", default=None,
                        help="the qrag-ray checkout every node imports (default: this environment's)")
    parser.add_argument("--work", default=None, help="folder for the pods' paths (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (the pods' folders, the index)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the app may take to be RUNNING")
    args = parser.parse_args(argv)
    if why := pod_network.unavailable():
        print(f"error: {why}; the serving rehearsal gives every pod its own network", file=sys.stderr)
        return 2
    work = Path(args.work or tempfile.mkdtemp(prefix="qrs-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    pods = {k: int(v) for k, v in parse_pairs(args.pods, "pods").items()}
    rehearsal = prepare(args.overlay, work, pods=pods, app_args=parse_pairs(args.settings, "set"),
                        code=str(Path(args.code).resolve()) if args.code else None)
    for i, shape in enumerate(rehearsal.shapes):
        print(f"  {shape.name}: {rehearsal.net.ip(i)}, {shape.num_cpus} CPUs, {(shape.memory or 0) / 2**30:.0f} GiB",
              file=sys.stderr)
    os.environ["RAY_AUTH_TOKEN"] = rehearsal.token  # this process watches the nodes start: the cluster's token
    rows = []
    problems = []
    seconds = {}
    placed = {}
    written = {}
    try:
        started = time.monotonic()
        build_tenant(rehearsal)
        seconds["index"] = round(time.monotonic() - started, 1)
        start(rehearsal)
        seconds["cluster"] = round(time.monotonic() - started - seconds["index"], 1)
        placed = replicas_per_pod(rehearsal, deploy(rehearsal, args.timeout))
        seconds["deploy"] = round(time.monotonic() - started - seconds["index"] - seconds["cluster"], 1)
        rows = [ask_pod(rehearsal, i) for i in range(len(rehearsal.pods))]
        problems = [f"{row['pod']}: {p}" for row in rows for p in verdict(row)]
        written = write_through(rehearsal)
        if written["status"] != "searchable":
            problems.append(f"a write through the head's port 8000 ended {written['status']!r}")
        problems += [f"{pod}: the written document's question ranks {doc!r} first, not {WRITTEN['id']!r}"
                     for pod, doc in written["rank1"].items() if doc != WRITTEN["id"]]
    except RuntimeError as error:
        problems.append(str(error))
    finally:
        stopped = stop(rehearsal)
    for row in rows:
        print(f"  {row['pod']} {row['ip']}:8000 ({placed.get(row['pod'], 0)} replicas) {row['listener']}: healthz "
              f"{row['healthz']}, search {row['search']} ({row['search_ms']} ms, path {row['path']}, "
              f"rank 1 {row['rank1']}), wrong key {row['wrong_key']}", file=sys.stderr)
    if written:
        print(f"  a write through the head: {written['status']} after {written['seconds']} s; its question's rank 1 "
              f"per pod {written['rank1']}", file=sys.stderr)
    print("\n".join(problems) or "every pod serves the tenant on port 8000 as the manifest means", file=sys.stderr)
    print(json.dumps({"overlay": rehearsal.overlay, "ok": not problems and stopped, "net": rehearsal.net.tag,
                      "pods": rows,
                      "replicas": placed,
                      "write": written,
                      "seconds": seconds,
                      "problems": problems, "work": str(work)}))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not problems and stopped else 1


if __name__ == "__main__":
    sys.exit(main())
