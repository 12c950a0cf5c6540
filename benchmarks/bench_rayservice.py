"""The RayService layout's ingress: HAProxy (what the manifests ship) against Serve's Python proxy, in one run.

    python benchmarks/bench_rayservice.py [--requests 800] [--concurrency 8] [--rounds 2] [--out runs/bench_rayservice.json]

Each layout is the cpu-dev RayService as cluster/rehearse_service.py rehearses it: a head without CPUs and two
serving pods, each Ray node in a network of its own (its own address, Serve's port 8000 on every pod),
serveConfigV2 deployed through the head's dashboard, one tenant on a small chunk index fanned out to the
ShardSearchers (`local_search_max_bytes: 0`, the path of a big tenant). `haproxy` runs the pods with their
shipped environment; `proxy` the same pods without qrag_ray.serving.config.CLUSTER_INGRESS_ENV (Serve's proxy on
port 8000). The layouts alternate --rounds times, each on a fresh cluster. The load: --requests questions, the
first --warmup of them not counted, --concurrency clients each on one pod's address in turn (as a Service spreads
connections over its pods), every request with the tenant's key. Measured per layout: qps, p50/p99, errors, and
the CPU ms per request of every process in the pods' networks by title (replicas, ingress, raylets, GCS, the
controller); the request path (replicas and ingress) against the in-process search of the same queries
(SearchEngine in this process, one thread). Every core of this machine is shared by all pods, so qps is the
share the layout wins; CPU per request is the figure to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cluster import pod_network, rehearse_service as rs  # noqa: E402
from cluster.pod_layout import map_text  # noqa: E402
from qrag_ray.serving.application import searcher_names  # noqa: E402
from qrag_ray.serving.config import CLUSTER_INGRESS_ENV  # noqa: E402

from bench_serving import make_queries, pct  # noqa: E402
from process_cpu import cpu_by_process, cpu_by_title, request_path_cpu  # noqa: E402


def pods_cpu(r: rs.ServiceRehearsal) -> dict[str, float]:
    """CPU seconds so far per process title of every process in the pods' networks."""
    import psutil

    procs = []
    for pid in (p for i in range(len(r.pods)) for p in pod_network.netns_pids(r.net.netns(i))):
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    return cpu_by_title(procs, every=True)


def send(r: rs.ServiceRehearsal, queries: list[str], concurrency: int) -> list[dict]:
    """Every query once, `concurrency` clients, client w on pod (w mod pods)'s port 8000."""
    import httpx

    out: list[dict | None] = [None] * len(queries)

    def worker(w: int) -> None:
        with httpx.Client(base_url=f"http://{r.net.ip(w % len(r.pods))}:8000", timeout=120) as client:
            for i in range(w, len(queries), concurrency):
                t0 = time.perf_counter()
                try:
                    resp = client.post("/v1/search", json={"query": queries[i], "k": 5},
                                       headers={"Authorization": f"Bearer {r.key}"})
                    status, top = resp.status_code, [x["chunk_id"] for x in resp.json().get("results") or []]
                except (httpx.HTTPError, ValueError):
                    status, top = 0, []
                out[i] = {"s": time.perf_counter() - t0, "status": status, "t": time.time(), "top": top}

    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(worker, range(concurrency)))
    return out  # type: ignore[return-value]


def run_layout(layout: str, queries: list[str], warmup: int, concurrency: int, timeout: float,
               router_cpus: float | None, group: int) -> dict:
    r = rs.prepare("cpu-dev", Path(tempfile.mkdtemp(prefix="qrs-")), token=os.environ["RAY_AUTH_TOKEN"],
                   app_args={"local_search_max_bytes": "0", "shards_per_searcher": str(group)})
    exist = set(searcher_names(int(rs.app_config(r)["args"]["shards"]), group))  # the ShardSearchers the app has
    rs.app_config(r)["deployments"] = [d for d in rs.deployments(r) if not d["name"].startswith("ShardSearcher")
                                       or d["name"] in exist]
    if router_cpus:
        for dep in rs.deployments(r):
            if dep["name"] == "Router":
                dep.setdefault("ray_actor_options", {})["num_cpus"] = router_cpus
    if layout == "proxy":
        for s in r.shapes:
            for k in CLUSTER_INGRESS_ENV:
                s.env.pop(k, None)
    try:
        rs.build_tenant(r)
        rs.start(r)
        placed = rs.replicas_per_pod(r, rs.deploy(r, timeout))
        listeners = {p.name: rs.listener(r, i) for i, p in enumerate(r.pods)}
        send(r, queries[:warmup], concurrency)
        before = pods_cpu(r)
        rows = send(r, queries[warmup:], concurrency)
        after = pods_cpu(r)
    finally:
        rs.stop(r)
        index = Path(map_text(rs.INDEX, r.paths))
    ok = [x for x in rows if x["status"] == 200]
    lat = [x["s"] * 1000 for x in ok]
    wall = max(x["t"] for x in rows) - min(x["t"] - x["s"] for x in rows)
    by_proc = cpu_by_process(before, after, len(ok))
    return {"layout": layout, "listeners": listeners, "replicas": placed, "requests": len(rows),
            "errors": len(rows) - len(ok), "qps": round(len(ok) / wall, 1), "p50_ms": round(pct(lat, 50), 1),
            "p99_ms": round(pct(lat, 99), 1), "cpu_ms_per_request": round(sum(by_proc.values()), 2),
            "request_path_cpu_ms": round(request_path_cpu(by_proc), 2), "by_process": dict(list(by_proc.items())[:10]),
            "tops": [x["top"] for x in rows], "index": str(index), "work": str(r.work)}


def in_process(index: Path, queries: list[str]) -> tuple[dict, list[list[str]]]:
    """Each query searched alone in this process (torch and FAISS on one thread, like a replica)."""
    import torch

    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)
    engine = SearchEngine(index, threads=1)
    engine.search([queries[0]], k=5)
    cpu, tops = [], []
    for q in queries:
        c0 = time.process_time()
        res = engine.search([q], k=5)[0]
        cpu.append((time.process_time() - c0) * 1000)
        tops.append([x["chunk_id"] for x in res])
    return {"queries": len(queries), "cpu_ms_per_query": round(statistics.mean(cpu), 3)}, tops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds each app may take to be RUNNING")
    ap.add_argument("--shards-per-searcher", type=int, default=1,
                    help="shards one ShardSearcher deployment searches (app arg shards_per_searcher), both layouts")
    ap.add_argument("--router-cpus", type=float, default=None,
                    help="the Router's num_cpus (its torch threads) instead of serveConfigV2's, in both layouts")
    ap.add_argument("--out", default="runs/bench_rayservice.json")
    a = ap.parse_args()
    if why := pod_network.unavailable():
        print(f"error: {why}", file=sys.stderr)
        return 2
    queries = make_queries(a.requests)
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # every layout's cluster's, read once by this process
    runs = []
    for rnd in range(a.rounds):
        for layout in ("haproxy", "proxy") if rnd % 2 == 0 else ("proxy", "haproxy"):
            runs.append({"round": rnd, **run_layout(layout, queries, a.warmup, a.concurrency, a.timeout, a.router_cpus, a.shards_per_searcher)})
            print(f"round {rnd} {layout}: done", file=sys.stderr)
    import shutil

    # the in-process baseline on the last layout's index (every layout builds the same one), then its folder goes
    base, tops = in_process(Path(runs[-1]["index"]), queries[a.warmup:])
    for run in runs:
        run["same_rankings"] = round(sum(t == b for t, b in zip(run.pop("tops"), tops)) / len(tops), 4)
        shutil.rmtree(run.pop("work"), ignore_errors=True)
        run.pop("index")
        run["request_path_over_in_process"] = round(run["request_path_cpu_ms"] / base["cpu_ms_per_query"], 2)
    print(f"{'round':>5} {'layout':<8} {'qps':>6} {'p50 ms':>7} {'p99 ms':>7} {'err':>4} {'CPU ms/req':>10} "
          f"{'request path':>12} {'/in-process':>11} {'same':>5}")
    for x in runs:
        print(f"{x['round']:>5} {x['layout']:<8} {x['qps']:>6} {x['p50_ms']:>7} {x['p99_ms']:>7} {x['errors']:>4} "
              f"{x['cpu_ms_per_request']:>10} {x['request_path_cpu_ms']:>12} {x['request_path_over_in_process']:>10}x "
              f"{x['same_rankings']:>5}")
    print(f"in-process search: {base['cpu_ms_per_query']} ms CPU per query")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"args": vars(a), "in_process": base, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
