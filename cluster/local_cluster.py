"""A real multi-node Ray cluster on one machine: one head and N worker nodes started with `ray start`.

    python -m cluster.local_cluster up      [--name qrc] [--workers 2] [--worker-cpus 2] [--base-port auto]
    python -m cluster.local_cluster status  [--name qrc]
    python -m cluster.local_cluster down    [--name qrc] [--keep-logs]
    (cluster/local_cluster.sh is the same CLI for shells)

Each node is a separate raylet with its own ports and its own resources (custom resource `node_a`,
`node_b`, ... per worker, `head` on the head). The cluster is addressed on loopback (GCS address,
dashboard and agents on 127.0.0.1, or a node's own address in a network of pods: cluster/pod_network.py);
note that Ray 2.60 replaces a loopback `--node-ip-address` by the host's own IP and its gRPC servers listen
on all interfaces, so keep the port range firewalled on a machine that has a public interface. The whole
cluster lives in its own directory (`/tmp/qrag-lc-<name>`: Ray temp dir, state file, logs), so it never
touches the default `/tmp/ray` session other people on the box may be running.

Teardown never uses `ray stop` (that kills every Ray process of the user, including other people's
clusters). Every process `ray start` spawns inherits the environment variable QRAG_LOCAL_CLUSTER=<dir>
and/or carries the cluster's temp dir on its command line; `down` signals exactly those processes
(SIGTERM, then SIGKILL after a grace period) and checks that none is left.

The head has 0 CPUs by default (as in production: the head runs GCS, dashboard and the Serve
controller, not work), so every task and replica lands on a worker node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cluster.gcs_nodes import live_nodes, wait_for_nodes
from cluster.node_processes import ENV_MARKER, cluster_pids, kill_cluster_processes, read_cmdline
from cluster.readonly import readonly_wrapper

HOST = "127.0.0.1"
# Port layout relative to the base port B (per node i: 0 = head, 1..N = workers):
#   B          GCS (the cluster address)          B+1  Ray client server   B+2  dashboard (HTTP)
#   B+10i+3    node manager    B+10i+4 object manager    B+10i+5 metrics export (Prometheus /metrics)
#   B+10i+6    dashboard agent HTTP   B+10i+7 dashboard agent gRPC   B+10i+8 runtime-env agent
#   B+100(i+1) .. B+100(i+1)+99   worker ports of node i
NODE_STRIDE = 10
WORKER_PORT_BLOCK = 100


def default_dir(name: str) -> Path:
    # short: Ray's unix socket paths must stay below ~107 characters
    return Path(os.environ.get("QRAG_LOCAL_CLUSTER_ROOT", "/tmp")) / f"qrag-lc-{name}"


@dataclass
class NodeSpec:
    index: int  # 0 = head
    name: str  # "head", "node_a", "node_b", ...
    num_cpus: int
    resources: dict[str, float]
    node_manager_port: int
    object_manager_port: int
    metrics_export_port: int
    dashboard_agent_listen_port: int
    dashboard_agent_grpc_port: int
    runtime_env_agent_port: int
    min_worker_port: int
    max_worker_port: int
    num_gpus: int = 0  # logical GPUs: the node says it has them, nothing checks a device
    memory: int | None = None  # bytes of Ray's logical `memory` resource (None: Ray sizes it)
    env: dict[str, str] = field(default_factory=dict)  # the node's own environment on top of the cluster's
    readonly: list[str] = field(default_factory=list)  # folders the node's processes cannot write
    ip: str = HOST  # the node's address: its pod's own in a network of pods (cluster/pod_network.py)
    netns: list[str] = field(default_factory=list)  # argv prefix that runs in the node's network, if its own
    start_args: list[str] = field(default_factory=list)  # more `ray start` flags (e.g. --autoscaling-config)


@dataclass
class NodeShape:
    """What one node declares (a pod's resources, for cluster/rehearse.py): its name (also a custom resource
    of its own), logical CPUs and GPUs, memory, extra custom resources, environment, read-only folders."""

    name: str
    num_cpus: int
    num_gpus: int = 0
    memory: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    readonly: list[str] = field(default_factory=list)
    ip: str = HOST
    netns: list[str] = field(default_factory=list)
    start_args: list[str] = field(default_factory=list)


@dataclass
class ClusterState:
    name: str
    dir: str
    base_port: int
    address: str  # GCS address, what `--address` takes
    dashboard_url: str
    client_port: int
    nodes: list[NodeSpec] = field(default_factory=list)
    started_at: float = 0.0

    @property
    def temp_dir(self) -> str:
        return str(Path(self.dir) / "ray")

    @property
    def metrics_urls(self) -> list[str]:
        return [f"http://{n.ip}:{n.metrics_export_port}/metrics" for n in self.nodes]

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"temp_dir": self.temp_dir, "metrics_urls": self.metrics_urls}, indent=2)

    @classmethod
    def load(cls, path: Path) -> "ClusterState":
        fields = json.loads(path.read_text())
        fields.pop("temp_dir", None)
        fields.pop("metrics_urls", None)
        fields["nodes"] = [NodeSpec(**n) for n in fields["nodes"]]
        return cls(**fields)


def worker_names(count: int) -> list[str]:
    return [f"node_{chr(ord('a') + i)}" for i in range(count)]


def default_shapes(workers: int, worker_cpus: int, head_cpus: int) -> list[NodeShape]:
    """The plain layout: a head and `workers` equal worker nodes named node_a, node_b, ..."""
    return [NodeShape("head", head_cpus)] + [NodeShape(n, worker_cpus) for n in worker_names(workers)]


def plan_nodes(base: int, workers: int, worker_cpus: int, head_cpus: int,
               shapes: list[NodeShape] | None = None) -> list[NodeSpec]:
    """Pure: ports and resources of every node, derived from the base port; `shapes` (head first) replaces
    the plain layout of `workers` x `worker_cpus`."""
    specs = []
    for i, shape in enumerate(shapes or default_shapes(workers, worker_cpus, head_cpus)):
        offset = base + NODE_STRIDE * i
        worker_port = base + WORKER_PORT_BLOCK * (i + 1)
        specs.append(NodeSpec(
            index=i, name=shape.name, num_cpus=shape.num_cpus, resources={shape.name: 1.0, **shape.resources},
            node_manager_port=offset + 3, object_manager_port=offset + 4, metrics_export_port=offset + 5,
            dashboard_agent_listen_port=offset + 6, dashboard_agent_grpc_port=offset + 7,
            runtime_env_agent_port=offset + 8, min_worker_port=worker_port,
            max_worker_port=worker_port + WORKER_PORT_BLOCK - 1, num_gpus=shape.num_gpus, memory=shape.memory,
            env=dict(shape.env), readonly=list(shape.readonly), ip=shape.ip, netns=list(shape.netns),
            start_args=list(shape.start_args)))
    return specs


def ports_of(base: int, workers: int) -> list[int]:
    ports = [base, base + 1, base + 2]
    for node in plan_nodes(base, workers, 1, 0):
        ports += [node.node_manager_port, node.object_manager_port, node.metrics_export_port,
                  node.dashboard_agent_listen_port, node.dashboard_agent_grpc_port, node.runtime_env_agent_port]
        ports += list(range(node.min_worker_port, node.max_worker_port + 1))
    return ports


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # also the wildcard address
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def pick_base_port(workers: int, start: int = 27000, stop: int = 60000, step: int = 1000) -> int:
    """First base port whose whole range is free (other people's Ray uses 6379, 8265, 10001...)."""
    for base in range(start, stop, step):
        if all(_port_free(p) for p in ports_of(base, workers)):
            return base
    raise RuntimeError("no free port range for a local Ray cluster")


# ---------------------------------------------------------------- processes


def _env(cdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_MARKER] = str(cdir)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.pop("RAY_ADDRESS", None)  # a driver's RAY_ADDRESS must not redirect `ray start`
    # Token authentication on every node: without it anyone who reaches the dashboard or the GCS can run code as this
    # user. Ray 2.60 turns it on by itself for a head only when ~/.ray/auth_token exists and never for a joining worker,
    # so the mode is explicit. The token is Ray's own lookup: RAY_AUTH_TOKEN, else RAY_AUTH_TOKEN_PATH, else
    # ~/.ray/auth_token (made by `up` when missing), which is where a driver on this machine finds it too.
    env.setdefault("RAY_AUTH_MODE", "token")
    return env


def ensure_token(env: dict[str, str]) -> None:
    """Make Ray's default token file (`ray get-auth-token --generate`) unless a token is already set;
    `ray start` in token mode refuses to run without one. The token is never printed."""
    if env.get("RAY_AUTH_MODE") != "token" or env.get("RAY_AUTH_TOKEN"):
        return
    result = subprocess.run([_ray_bin(), "get-auth-token", "--generate"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"no Ray auth token: {result.stderr.strip().splitlines()[-1:] or result.returncode}")


def _ray_bin() -> str:
    cand = Path(sys.executable).with_name("ray")
    return str(cand) if cand.exists() else (shutil.which("ray") or "ray")


def ray_start_command(state: ClusterState, node: NodeSpec, object_store_mb: int) -> list[str]:
    """Pure: the `ray start` argv of one node."""
    cmd = [_ray_bin(), "start", "--node-ip-address", node.ip, "--temp-dir", state.temp_dir,
           "--num-cpus", str(node.num_cpus), "--num-gpus", str(node.num_gpus),
           "--resources", json.dumps(node.resources), "--object-store-memory", str(object_store_mb * 1024 * 1024),
           *(["--memory", str(node.memory)] if node.memory else []),
           "--node-manager-port", str(node.node_manager_port),
           "--object-manager-port", str(node.object_manager_port),
           "--metrics-export-port", str(node.metrics_export_port),
           "--dashboard-agent-listen-port", str(node.dashboard_agent_listen_port),
           "--dashboard-agent-grpc-port", str(node.dashboard_agent_grpc_port),
           "--runtime-env-agent-port", str(node.runtime_env_agent_port),
           "--min-worker-port", str(node.min_worker_port), "--max-worker-port", str(node.max_worker_port),
           "--disable-usage-stats"]
    if node.index == 0:
        cmd += ["--head", "--port", str(state.base_port), "--ray-client-server-port", str(state.client_port),
                "--include-dashboard", "true", "--dashboard-host", node.ip,
                "--dashboard-port", str(state.base_port + 2)]
    else:
        cmd += ["--address", state.address]
    return node.netns + readonly_wrapper(node.readonly) + cmd + node.start_args


# ---------------------------------------------------------------- cluster state


def up(name: str = "qrc", workers: int = 2, worker_cpus: int = 2, head_cpus: int = 0,
       base_port: int | None = None, object_store_mb: int = 400, cdir: Path | None = None,
       timeout: float = 120.0, quiet: bool = False, attempts: int = 3,
       shapes: list[NodeShape] | None = None, env: dict[str, str] | None = None) -> ClusterState:
    """Start head + workers (or the nodes `shapes` describes, head first); on any failure everything
    started so far is torn down. `env` is added to every node's environment (e.g. RAY_AUTH_TOKEN).

    `ray start` gives a raylet a fixed 30 s to register with the GCS; on a box where other jobs hold
    every core that can run out (or the start hangs past `timeout`), so a failed start is torn down and
    tried again (`attempts`).
    """
    cdir = Path(cdir) if cdir else default_dir(name)
    if (cdir / "cluster.json").exists() and cluster_pids(cdir):
        raise RuntimeError(f"a cluster is already running in {cdir}: run `down` first")
    for attempt in range(1, attempts + 1):
        try:
            return _up_once(name, shapes or default_shapes(workers, worker_cpus, head_cpus), base_port,
                            object_store_mb, cdir, timeout, quiet, env or {})
        except RuntimeError as error:
            if attempt == attempts:
                raise
            print(f"local cluster start failed (attempt {attempt}/{attempts}): {error}; retrying", file=sys.stderr)
            shutil.rmtree(cdir / "ray", ignore_errors=True)
    raise AssertionError("unreachable")


def _up_once(name: str, shapes: list[NodeShape], base_port: int | None, object_store_mb: int, cdir: Path,
             timeout: float, quiet: bool, extra_env: dict[str, str]) -> ClusterState:
    cdir.mkdir(parents=True, exist_ok=True)
    base = base_port or pick_base_port(len(shapes) - 1)
    head = shapes[0].ip
    state = ClusterState(name=name, dir=str(cdir), base_port=base, address=f"{head}:{base}",
                         dashboard_url=f"http://{head}:{base + 2}", client_port=base + 1,
                         nodes=plan_nodes(base, 0, 0, 0, shapes), started_at=time.time())
    (cdir / "cluster.json").write_text(state.to_json())
    env = _env(cdir) | extra_env
    ensure_token(env)
    try:
        with open(cdir / "ray-start.log", "ab") as log:
            for node in state.nodes:
                cmd = ray_start_command(state, node, object_store_mb)
                log.write(("$ " + " ".join(cmd) + "\n").encode())
                log.flush()
                since = log.tell()
                try:
                    result = subprocess.run(cmd, env=env | node.env, stdout=log, stderr=subprocess.STDOUT,
                                            timeout=timeout, start_new_session=True)
                except subprocess.TimeoutExpired:  # a start that hangs on a loaded box is retried like a failed one
                    raise RuntimeError(f"`ray start` for {node.name} did not return in {timeout:.0f}s; see "
                                       f"{cdir / 'ray-start.log'}") from None
                if result.returncode != 0 and not _registered_late(cdir / "ray-start.log", since, state, node, timeout):
                    raise RuntimeError(f"`ray start` for {node.name} failed (rc {result.returncode}); "
                                       f"see {cdir / 'ray-start.log'}")
                if node.index == 0:
                    wait_for_nodes(state.address, 1, timeout)
            wait_for_nodes(state.address, len(state.nodes), timeout)
    except BaseException:
        kill_cluster_processes(cdir)
        raise
    if not quiet:
        print(f"local Ray cluster '{name}' up: {len(state.nodes)} nodes, address {state.address}, "
              f"dashboard {state.dashboard_url}, dir {cdir}", file=sys.stderr)
    return state


def _registered_late(log: Path, since: int, state: ClusterState, node: NodeSpec, timeout: float) -> bool:
    """`ray start` gives up when its node has not registered with the GCS within a fixed 30 s, but leaves the
    node's processes running; on a loaded machine the node often registers a little later. So a start that
    failed that way counts when the node (its node-manager port) is alive within `timeout`."""
    with open(log, "rb") as file:
        file.seek(since)
        if b"timed out during startup" not in file.read():
            return False
    deadline = time.time() + timeout
    raylet = f"--node_manager_port={node.node_manager_port}\0".encode()
    while time.time() < deadline:
        if not any(raylet in read_cmdline(p) for p in cluster_pids(Path(state.dir))):
            return False  # the node's raylet is gone (it gives up on agents slower than its own timeout)
        try:
            if any(n["port"] == node.node_manager_port for n in live_nodes(state.address)):
                print(f"`ray start` for {node.name} timed out, but the node registered later", file=sys.stderr)
                return True
        except Exception:  # the GCS may still be starting
            pass
        time.sleep(2.0)
    return False


def down(name: str = "qrc", cdir: Path | None = None, keep_logs: bool = False, quiet: bool = False) -> bool:
    """Stop every process of the cluster; True when none is left. Removes the dir unless keep_logs."""
    cdir = Path(cdir) if cdir else default_dir(name)
    survivors = kill_cluster_processes(cdir)
    if survivors:
        print(f"processes still alive after SIGKILL: {survivors}", file=sys.stderr)
        return False
    if not keep_logs and cdir.exists():
        shutil.rmtree(cdir, ignore_errors=True)
    if not quiet:
        print(f"local Ray cluster '{name}' down ({cdir})", file=sys.stderr)
    return True


def status(name: str = "qrc", cdir: Path | None = None) -> dict:
    cdir = Path(cdir) if cdir else default_dir(name)
    state_file = cdir / "cluster.json"
    pids = cluster_pids(cdir)
    if not state_file.exists():
        return {"name": name, "dir": str(cdir), "running": bool(pids), "pids": pids, "nodes": []}
    state = ClusterState.load(state_file)
    try:
        nodes = live_nodes(state.address) if pids else []
    except Exception as error:
        nodes = [{"error": str(error)}]
    return {"name": name, "dir": str(cdir), "address": state.address, "dashboard_url": state.dashboard_url,
            "metrics_urls": state.metrics_urls, "running": bool(pids), "pids": pids, "nodes": nodes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local_cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for command in ("up", "down", "status"):
        command_parser = sub.add_parser(command)
        command_parser.add_argument("--name", default=os.environ.get("QRAG_LOCAL_CLUSTER_NAME", "qrc"))
        command_parser.add_argument("--dir", default=None, help="cluster dir (default /tmp/qrag-lc-<name>)")
        if command == "up":
            command_parser.add_argument("--workers", type=int, default=2)
            command_parser.add_argument("--worker-cpus", type=int, default=2, help="logical CPUs per worker node")
            command_parser.add_argument("--head-cpus", type=int, default=0)
            command_parser.add_argument("--base-port", default="auto",
                                        help="first port of the cluster's range, or auto")
            command_parser.add_argument("--object-store-mb", type=int, default=400)
            command_parser.add_argument("--timeout", type=float, default=120.0,
                                        help="seconds each `ray start` may take")
        if command == "down":
            command_parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    cdir = Path(args.dir) if args.dir else None
    if args.cmd == "up":
        state = up(args.name, args.workers, args.worker_cpus, args.head_cpus,
                   None if args.base_port == "auto" else int(args.base_port), args.object_store_mb, cdir, args.timeout)
        print(state.to_json())
        return 0
    if args.cmd == "down":
        return 0 if down(args.name, cdir, args.keep_logs) else 1
    report = status(args.name, cdir)
    print(json.dumps(report, indent=2))
    return 0 if report["running"] else 3


if __name__ == "__main__":
    sys.exit(main())
