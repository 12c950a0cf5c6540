"""The RayService layout's ingress: what CPU per request and throughput does HAProxy (what the manifests
ship) give against Serve's Python proxy, on the cpu-dev RayService rehearsed on this machine, in one run?

    python -m benchmarks.serving_rayservice [--requests 800] [--concurrency 8] [--rounds 2]
                                            [--out runs/serving_rayservice.json]
    python -m benchmarks.serving_rayservice --tiny     # smoke: 40 requests, one round (minutes: 2 clusters start)

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

import contextlib
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.indexes import make_queries
from benchmarks.harness.processes import cpu_by_process, cpu_by_title, request_path_cpu
from benchmarks.harness.report import pct, print_table, write_json
from benchmarks.harness.served import searcher_names
from cluster import pod_network
from cluster import rehearse_service as rs
from cluster.pod_layout import map_text

FULL = {"requests": 800, "warmup": 100, "concurrency": [8], "rounds": 2}
TINY = {"requests": 40, "warmup": 8, "concurrency": [2], "rounds": 1}


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
        """Client `w`: every concurrency-th query, on its pod's port 8000."""
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
    """One layout on a fresh rehearsed RayService: its replicas, the load, CPU by process."""
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
        from qrag_ray.serving.config import CLUSTER_INGRESS_ENV

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
    except BaseException:
        rs.stop(r)
        shutil.rmtree(r.work, ignore_errors=True)  # a failed layout leaves no folder behind
        raise
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


def main(argv: list[str] | None = None) -> int:
    """Parse, run the layouts round by round, the in-process baseline, print and write the report."""
    parser = options.parser(__doc__)
    options.add_common(parser, "serving_rayservice", rounds=True, concurrency=True)
    parser.add_argument("--requests", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each app may take to be RUNNING")
    parser.add_argument("--shards-per-searcher", type=int, default=1,
                    help="shards one ShardSearcher deployment searches (app arg shards_per_searcher), both layouts")
    parser.add_argument("--router-cpus", type=float, default=None,
                    help="the Router's num_cpus (its torch threads) instead of serveConfigV2's, in both layouts")
    args = options.sized(parser.parse_args(argv), FULL, TINY)
    if why := pod_network.unavailable():
        print(f"error: {why}", file=sys.stderr)
        return 2
    queries = make_queries(args.requests)
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # every layout's cluster's, read once by this process
    runs = []
    for rnd in range(args.rounds):
        for layout in ("haproxy", "proxy") if rnd % 2 == 0 else ("proxy", "haproxy"):
            runs.append({"round": rnd, **run_layout(layout, queries, args.warmup, args.concurrency[0], args.timeout,
                                                    args.router_cpus, args.shards_per_searcher)})
            print(f"round {rnd} {layout}: done", file=sys.stderr)
    # the in-process baseline on the last layout's index (every layout builds the same one), then its folder goes
    base, tops = in_process(Path(runs[-1]["index"]), queries[args.warmup:])
    for run in runs:
        run["same_rankings"] = round(sum(t == b for t, b in zip(run.pop("tops"), tops, strict=True)) / len(tops), 4)
        shutil.rmtree(run.pop("work"), ignore_errors=True)
        run.pop("index")
        run["request_path_over_in_process"] = round(run["request_path_cpu_ms"] / base["cpu_ms_per_query"], 2)
    print_table([("round", "round", "d"), ("layout", "layout", ""), ("qps", "qps", ".1f"), ("p50 ms", "p50_ms", ".1f"),
                 ("p99 ms", "p99_ms", ".1f"), ("errors", "errors", "d"), ("CPU ms/req", "cpu_ms_per_request", ".2f"),
                 ("request path", "request_path_cpu_ms", ".2f"),
                 ("/ in-process", "request_path_over_in_process", ".2f"),
                 ("same ranking", "same_rankings", ".0%")], runs)
    print(f"in-process search: {base['cpu_ms_per_query']} ms CPU per query")
    write_json({"command": options.command(), "args": vars(args), "in_process": base, "runs": runs}, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
