"""What the autoscaler rehearsal sees (cluster/rehearse_autoscaler.py runs it): the closed-loop HTTP load and
every answer, the scaling decisions Serve's controller logged and the node launches and removals the autoscaler
logged, the dashboard and the GCS polled into a Timeline, the timings, and the verdict on a run. The log
reading, the timings and the verdict are pure.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import httpx

from cluster import local_cluster
from cluster.autoscaler_plan import HEAD_NODE_ID, SEARCHER, AutoscalerPlan
from cluster.gcs_nodes import live_nodes
from cluster.rehearse_service import QUERY
from qrag_ray.serving.config import ROUTER, WRITER

# how much sooner than the idle timeout after the replica stopped the node may seem to go: the dashboard shows a
# replica gone some seconds after it stopped on a busy machine
IDLE_SLACK_S = 5.0
SCALING_LINE = re.compile(r"^\w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) controller \d+ -- (Upscaling|Downscaling) "
                          r"Deployment\(name='([^']+)'.*? from (\d+) to (\d+) replicas")
EVENT_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*?\b((Adding|Removing) (\d+) node(?:\(s\)|s) "
                        r"of type (\S+?)(?: \(([^)]*)\))?\.)\s*$")


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


def read_serve_decisions(state: local_cluster.ClusterState, deployment: str) -> list[dict]:
    """What Serve's controller of the cluster decided so far for a deployment (its logs in the session's logs)."""
    logs = sorted((Path(state.temp_dir) / "session_latest" / "logs" / "serve").glob("controller_[0-9]*.log"))
    decisions = [decision for log in logs for decision in serve_decisions(log.read_text(errors="replace"), deployment)]
    return sorted(decisions, key=lambda decision: decision["time"])


def read_autoscaler_events(state: local_cluster.ClusterState) -> list[dict]:
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


def serve_status(state: local_cluster.ClusterState, token: str) -> dict:
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


def watch(state: local_cluster.ClusterState, token: str, timeline: Timeline, until: str, timeout: float) -> None:
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
    if on_head != sorted([ROUTER, SEARCHER, WRITER]):
        problems.append(f"before the load the head held {on_head}, not one {ROUTER}, one {SEARCHER} and the "
                        f"{WRITER} replica")
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

