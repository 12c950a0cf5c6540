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

The head (one node, started with `ray start --autoscaling-config`) declares just the CPUs of one Router replica,
one ShardSearcher replica and the app's Writer, so the app's second ShardSearcher replica does not fit on it. The
real app (serveConfigV2 with a tenants file of one small tenant index, served by one ShardSearcher group, the
Router at one replica, Serve's proxy on the head only: every node of this machine would bind the same port) is
deployed through the head's dashboard with the cluster's token, as KubeRay's controller deploys it. Once it is
ready and settled (one ShardSearcher replica, the head alone), closed-loop HTTP clients search the tenant without
pause: the ShardSearcher's autoscaling (a low target, so that a millisecond search still asks for a replica) wants
a second replica, which waits for CPUs; the autoscaler starts a node of the worker group's type; the replica lands
on it. The load then drops to a trickle (one search a second, still checked): Serve stops the replica on the added
node (Serve stops replicas off the head first), the node is idle, and the autoscaler removes it after the idle
timeout. Exit 0 only when Serve's controller logged the upscale and the autoscaler then logged the launch and the
removal of a node of the group's type, the replica ran on the added node, the node went no sooner than the idle
timeout after its replica stopped, and not one search failed (HTTP status and rank 1). Every process the rehearsal
starts is found by the cluster's marker (cluster/node_processes.py) and stopped at the end.

What differs from Kubernetes because every node shares this machine's cores: the added nodes run at a lower CPU
priority (ADDED_NODE_NICE; a pod has CPUs of its own, here its start-up would stall the head's Router), and a
search's deadline is `--request-timeout-s` (30 s) instead of the manifest's 10 s.

This module runs the rehearsal (the index, the head with the autoscaler, the app, the load, the teardown); what it
starts is planned in cluster/autoscaler_plan.py, and what it sees is read and judged in cluster/autoscaler_watch.py.
docs/CLUSTER.md, "Nodes follow replicas: the autoscaler rehearsal".
"""

from __future__ import annotations

import argparse
import json
import os
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

from cluster import local_cluster
from cluster.autoscaler_plan import SEARCHER, AutoscalerPlan, head_env, plan
from cluster.autoscaler_watch import (
    Answer,
    ClosedLoop,
    Timeline,
    load_summary,
    read_autoscaler_events,
    read_serve_decisions,
    replicas,
    seconds_of,
    serve_status,
    verdict,
    watch,
)
from cluster.gcs_nodes import live_nodes
from cluster.node_processes import cluster_pids, read_cmdline
from cluster.rehearse import REPO, write_corpus
from cluster.rehearse_service import deploy_config
from qrag_ray.runtime.ports import free_port
from qrag_ray.serving.config import ROUTER, WRITER

# The nodes the autoscaler adds run at this CPU priority: on Kubernetes an added pod has CPUs of its own, here its
# start-up (a raylet, its agents, a replica importing torch and FAISS) would take the cores of the head's Router
ADDED_NODE_NICE = 10


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
    state: local_cluster.ClusterState | None = None
    timeline: Timeline = field(default_factory=Timeline)
    events: list[dict] = field(default_factory=list)  # the autoscaler's, from the start of the load
    events_before_load: int = 0
    answers: list[Answer] = field(default_factory=list)
    initial: list[dict] = field(default_factory=list)
    seconds: dict[str, float | None] = field(default_factory=dict)


def start_head(run: Run, base_port: int, timeout: float) -> None:
    """The head, with the autoscaler (`ray start --head --autoscaling-config`)."""
    cdir = local_cluster.default_dir(run.name)
    cdir.mkdir(parents=True, exist_ok=True)
    config_path = cdir / "autoscaling.yaml"
    config_path.write_text(yaml.safe_dump(run.rehearsal.autoscaling, sort_keys=False))
    shape = local_cluster.NodeShape("head", run.rehearsal.head_cpus, env=head_env(run.rehearsal.version),
                                    start_args=["--autoscaling-config", str(config_path)])
    run.state = local_cluster.up(name=run.name, shapes=[shape], base_port=base_port, object_store_mb=200,
                                 timeout=timeout, quiet=True,
                                 env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": run.token})
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
    url = f"http://{local_cluster.HOST}:{run.rehearsal.serve_config['http_options']['port']}"
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
    base_port = local_cluster.pick_base_port(0)
    problems: list[str] = []
    run = None
    stopped = True
    try:
        rehearsal = plan(render_kustomization(overlay), overlay.name, tenants=str(work / "tenants.yaml"),
                         shards=1 if build else index_shards(index), http_port=free_port(local_cluster.HOST),
                         gcs_address=f"{local_cluster.HOST}:{base_port}", idle_timeout_s=args.idle_timeout_s,
                         group=args.group, version=args.autoscaler, request_timeout_s=args.request_timeout_s)
        run = Run(rehearsal, work, token)
        most = rehearsal.autoscaling["available_node_types"][rehearsal.group]["max_workers"]
        print(f"  head: {rehearsal.head_cpus} CPUs ({ROUTER} + {SEARCHER} + {WRITER}); {rehearsal.group}: "
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
            stopped = local_cluster.down(name=run.name, keep_logs=args.keep, quiet=True)
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
                      "cluster_dir": str(local_cluster.default_dir(run.name)) if run else None, "work": str(work)}))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
