"""Many tenants on shared ShardSearcher replicas: tenant affinity (Serve model multiplexing) against any
replica (no affinity), the same requests in one run.

    python benchmarks/bench_tenants.py [--tenants 200] [--replicas 4] [--budget-x 4] [--requests 2000]
                                       [--concurrency 8] [--out runs/bench_tenants.json]

One small index (the demo's Python-reference corpus, 2 shards, one vector per chunk) is registered under
--tenants names. A loaded shard is cached per tenant (the cache key names the tenant), so the tenants'
bytes total N times the index's, and each ShardSearcher replica's budget (`shard_cache_bytes`) is set so
that this total is --budget-x times one replica's budget: no replica can hold every tenant. Every tenant
fans out to the ShardSearcher deployments (`local_search_max_bytes: 0`), --replicas replicas each.
Requests pick a tenant by Zipf(1.1) rank, --concurrency at a time. The same request sequence runs against
app `affine` (tenant_affinity on) and app `spread` (off), each on fresh replicas, one after the other.

Per layout: the steady-state hit rate (1 - cold loads / shard calls, from each response's
`timings.cold_loads`, after the first --warmup requests), cold loads per minute, p50/p99, errors.

With --ramp (e.g. `1:30,16:90,1:150`: concurrency:seconds stages), each layout then runs again on fresh
replicas that autoscale (Router 1..2, every ShardSearcher 1..--replicas, on Serve's own autoscaler with
--target-ongoing and the --upscale/--downscale delays), under that load: per stage the requests, errors,
hit rate and p50/p99; the RUNNING replicas of every deployment each second; how long after the load rose
a replica was added and how long after it fell the deployments were back to one replica.
A synthetic tenant mix on one index, on one machine: what it shows is the cache behaviour, not the
latency of a big index (each replica here searches a tiny shard).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_serving import make_queries, pct  # noqa: E402


def build_index(workdir: Path) -> Path:
    from qrag_ray.config.index import build_index_config
    from qrag_ray.io.pydoc_corpus import write_pydoc_corpus
    from qrag_ray.index.build import build_index as build

    out = workdir / "index"
    if not (out / "manifest.json").is_file():
        write_pydoc_corpus(workdir / "corpus.jsonl")
        build(build_index_config(None, input=str(workdir / "corpus.jsonl"), format="jsonl", representation="chunk",
                                 shards=2, build={"output": str(out), "overwrite": True},
                                 generator={"backend": "none"}, chunker={"method": "token", "size": 200, "overlap": 20}))
    return out


def zipf_ranks(n_tenants: int, n: int, s: float = 1.1, seed: int = 0) -> np.ndarray:
    p = 1.0 / np.arange(1, n_tenants + 1) ** s
    return np.random.default_rng(seed).choice(n_tenants, size=n, p=p / p.sum())


def run_layout(url: str, keys: list[str], ranks: np.ndarray, queries: list[str], concurrency: int,
               warmup: int, shards: int) -> dict:
    import httpx

    out: list[dict | None] = [None] * len(ranks)

    def one(i: int, client: httpx.Client) -> None:
        t0 = time.perf_counter()
        try:
            r = client.post("/v1/search", json={"query": queries[i % len(queries)], "k": 5},
                            headers={"Authorization": f"Bearer {keys[ranks[i]]}"})
            body, status = r.json(), r.status_code
        except httpx.HTTPError as e:
            body, status = {"error": type(e).__name__}, 0
        out[i] = {"s": time.perf_counter() - t0, "status": status,
                  "cold": (body.get("timings") or {}).get("cold_loads", 0) if status == 200 else 0, "t": time.time()}

    def worker(w: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in range(w, len(ranks), concurrency):
                one(i, client)

    t0 = time.time()
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(worker, range(concurrency)))
    wall = time.time() - t0
    steady = out[warmup:]
    ok = [r for r in steady if r["status"] == 200]
    cold = sum(r["cold"] for r in ok)
    lat = [r["s"] * 1000 for r in ok]
    minutes = (max(r["t"] for r in steady) - min(r["t"] for r in steady)) / 60 or float("nan")
    return {"requests": len(ranks), "steady_requests": len(steady), "wall_s": round(wall, 1),
            "errors": sum(r["status"] != 200 for r in out), "hit_rate": round(1 - cold / max(1, len(ok) * shards), 4),
            "cold_loads_steady": cold, "cold_loads_per_min": round(cold / minutes, 1),
            "cold_loads_warmup": sum(r["cold"] for r in out[:warmup] if r["status"] == 200),
            "p50_ms": round(statistics.median(lat), 1), "p99_ms": round(pct(lat, 99), 1),
            "qps": round(len(steady) / max(1e-9, minutes * 60), 1)}


def ramp(url: str, app: str, keys: list[str], ranks: np.ndarray, queries: list[str], stages: list[tuple[int, float]],
         shards: int) -> dict:
    """The load in stages of (concurrency, seconds), tenants drawn as in run_layout; every second, the
    RUNNING replicas of each of the app's deployments."""
    import httpx
    from ray import serve

    done, timeline, nxt, lock = threading.Event(), [], [0], threading.Lock()
    t_start = time.time()

    def watch() -> None:
        while not done.is_set():
            deps = serve.status().applications[app].deployments
            timeline.append({"t": round(time.time() - t_start, 1), **{
                d: sum(n for st, n in v.replica_states.items() if st == "RUNNING") for d, v in deps.items()}})
            time.sleep(1.0)

    def worker(stage: int, until: float, out: list) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while time.time() < until:
                with lock:
                    i, nxt[0] = nxt[0], nxt[0] + 1
                t0 = time.perf_counter()
                try:
                    r = client.post("/v1/search", json={"query": queries[i % len(queries)], "k": 5},
                                    headers={"Authorization": f"Bearer {keys[ranks[i % len(ranks)]]}"})
                    status, cold = r.status_code, (r.json().get("timings") or {}).get("cold_loads", 0)
                except (httpx.HTTPError, ValueError):
                    status, cold = 0, 0
                out.append({"stage": stage, "status": status, "ms": (time.perf_counter() - t0) * 1000,
                            "cold": cold if status == 200 else 0})

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results: list[dict] = []
    bounds = []
    for n, (c, secs) in enumerate(stages):
        t0 = time.time() - t_start
        until = time.time() + secs
        with ThreadPoolExecutor(c) as ex:
            list(ex.map(lambda _: worker(n, until, results), range(c)))
        bounds.append((round(t0, 1), round(time.time() - t_start, 1)))
    done.set()
    watcher.join()
    per_stage = []
    for n, (c, secs) in enumerate(stages):
        rs = [r for r in results if r["stage"] == n]
        ok = [r for r in rs if r["status"] == 200]
        lat = [r["ms"] for r in ok]
        per_stage.append({"concurrency": c, "seconds": secs, "from_s": bounds[n][0], "to_s": bounds[n][1],
                          "requests": len(rs), "errors": len(rs) - len(ok),
                          "hit_rate": round(1 - sum(r["cold"] for r in ok) / max(1, len(ok) * shards), 4),
                          "p50_ms": round(pct(lat, 50), 1), "p99_ms": round(pct(lat, 99), 1)})
    peak = max(range(len(stages)), key=lambda n: stages[n][0])
    deps = [d for d in timeline[0] if d != "t"] if timeline else []
    total = lambda row: sum(row[d] for d in deps)  # noqa: E731
    up = next((row["t"] for row in timeline if row["t"] >= bounds[peak][0] and total(row) > total(timeline[0])), None)
    down = next((row["t"] for row in timeline if row["t"] >= bounds[peak][1] and total(row) == len(deps)), None)
    return {"stages": per_stage, "timeline": timeline, "errors": sum(s["errors"] for s in per_stage),
            "max_replicas": {d: max(row[d] for row in timeline) for d in deps},
            "scale_up_after_load_s": None if up is None else round(up - bounds[peak][0], 1),
            "scale_down_after_load_s": None if down is None else round(down - bounds[peak][1], 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "bench_tenants"))
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--replicas", type=int, default=4, help="replicas of every ShardSearcher deployment")
    ap.add_argument("--budget-x", type=float, default=4.0, help="tenants' bytes / one replica's budget")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, help="requests left out of the steady state (default: a quarter)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--ramp", help="concurrency:seconds stages of the autoscaling run, e.g. 1:30,16:90,1:150")
    ap.add_argument("--target-ongoing", type=float, default=2.0, help="autoscaling target per replica (ramp)")
    ap.add_argument("--upscale-delay", type=float, default=30.0, help="Serve's default: 30 s")
    ap.add_argument("--downscale-delay", type=float, default=60.0, help="Serve's default is 600 s")
    ap.add_argument("--skip-fixed", action="store_true", help="only the ramp")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_tenants.json"))
    a = ap.parse_args()

    import ray
    from ray import serve

    from qrag_ray.cli.serve_cmd import wait_healthy
    from qrag_ray.index.format import load_manifest
    from qrag_ray.runtime.ports import free_port
    from qrag_ray.search.shard_search import load_shard
    from qrag_ray.serving.app import build_application
    from qrag_ray.serving.tenants import add_tenant

    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    ray.init(address="local", num_cpus=16, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": env})
    wd = Path(a.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    index = build_index(wd)
    man = load_manifest(index)
    shard_bytes = [load_shard(man, i, verify=False).nbytes for i in range(man.num_shards)]
    budget = max(1 << 20, int(a.tenants * max(shard_bytes) / a.budget_x))
    tf = wd / "tenants.yaml"
    tf.unlink(missing_ok=True)
    keys = [add_tenant(tf, f"t{i:04d}", index) for i in range(a.tenants)]
    ranks = zipf_ranks(a.tenants, a.requests)
    queries = make_queries(97)
    warmup = a.warmup if a.warmup is not None else a.requests // 4
    report = {"command": " ".join([Path(sys.executable).name] + sys.argv), "cpus": os.cpu_count(),
              "tenants": a.tenants, "shards": man.num_shards, "shard_bytes": shard_bytes,
              "replicas_per_shard": a.replicas, "replica_budget_bytes": budget,
              "tenant_bytes_total": a.tenants * sum(shard_bytes), "budget_x": a.budget_x,
              "distinct_tenants_asked": int(len(np.unique(ranks))), "concurrency": a.concurrency,
              "warmup": warmup, "layouts": {}}
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    small = {"ray_actor_options": {"num_cpus": 0.25}}
    opts = {"Router": {"ray_actor_options": {"num_cpus": 1}, "num_replicas": 1},
            **{f"ShardSearcher{i}": {**small, "num_replicas": a.replicas} for i in range(man.num_shards)}}
    print(f"{a.tenants} tenants x {man.num_shards} shards ({sum(shard_bytes) / 1e6:.2f} MB each), replica budget "
          f"{budget / 1e6:.1f} MB (tenants' total = {a.budget_x:g}x), {a.replicas} replicas per shard, "
          f"{a.requests} requests at c={a.concurrency}", flush=True)
    print("| layout | hit rate | cold loads/min | p50 ms | p99 ms | qps | errors |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, affinity in () if a.skip_fixed else (("spread", False), ("affine", True)):
        args = {"tenants": str(tf), "local_search_max_bytes": 0, "warm_tenants": 0, "shard_cache_bytes": budget,
                "tenant_affinity": affinity, "request_timeout_s": 60}
        serve.run(build_application(args, opts), name=name, route_prefix=f"/{name}")
        wait_healthy(f"http://127.0.0.1:{port}/{name}")
        r = run_layout(f"http://127.0.0.1:{port}/{name}", keys, ranks, queries, a.concurrency, warmup, man.num_shards)
        report["layouts"][name] = r
        print(f"| {name} | {r['hit_rate']:.3f} | {r['cold_loads_per_min']} | {r['p50_ms']} | {r['p99_ms']} | "
              f"{r['qps']} | {r['errors']} |", flush=True)
        serve.delete(name)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=2))
    if a.ramp:
        stages = [(int(c), float(secs)) for c, secs in (x.split(":") for x in a.ramp.split(","))]
        scaling = {"min_replicas": 1, "initial_replicas": 1, "target_ongoing_requests": a.target_ongoing,
                   "upscale_delay_s": a.upscale_delay, "downscale_delay_s": a.downscale_delay}
        ropts = {"Router": {"ray_actor_options": {"num_cpus": 1}, "autoscaling_config": {**scaling, "max_replicas": 2}},
                 **{f"ShardSearcher{i}": {**small, "autoscaling_config": {**scaling, "max_replicas": a.replicas}}
                    for i in range(man.num_shards)}}
        report["ramp"] = {"stages": a.ramp, "autoscaling": scaling, "layouts": {}}
        print(f"ramp {a.ramp}: autoscaling {scaling}\n| layout | stage (c) | requests | errors | hit rate | p50 ms | "
              "p99 ms |\n|---|---:|---:|---:|---:|---:|---:|")
        for name, affinity in (("spread-ramp", False), ("affine-ramp", True)):
            args = {"tenants": str(tf), "local_search_max_bytes": 0, "warm_tenants": 0, "shard_cache_bytes": budget,
                    "tenant_affinity": affinity, "request_timeout_s": 60}
            serve.run(build_application(args, ropts), name=name, route_prefix=f"/{name}")
            wait_healthy(f"http://127.0.0.1:{port}/{name}")
            r = ramp(f"http://127.0.0.1:{port}/{name}", name, keys, ranks, queries, stages, man.num_shards)
            report["ramp"]["layouts"][name] = r
            for st in r["stages"]:
                print(f"| {name} | {st['concurrency']} | {st['requests']} | {st['errors']} | {st['hit_rate']:.3f} | "
                      f"{st['p50_ms']} | {st['p99_ms']} |")
            print(f"  {name}: most replicas {r['max_replicas']}; a replica added {r['scale_up_after_load_s']} s after "
                  f"the load rose, back to one each {r['scale_down_after_load_s']} s after it fell", flush=True)
            serve.delete(name)
            Path(a.out).write_text(json.dumps(report, indent=2))
    serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
