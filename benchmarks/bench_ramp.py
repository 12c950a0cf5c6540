"""A load ramp on many tenants with autoscaling: how long after the load rose a replica was added, how long
after it fell the deployments were back to one replica, and no request failing in between; tenant affinity
(Serve model multiplexing) against any replica, one after the other in one run.

    python benchmarks/bench_ramp.py [--ramp 1:30,16:90,1:120] [--upscale-delay 10] [--downscale-delay 30]

The tenants and indexes are bench_tenants.py's (tenant i on index i % --indexes, every tenant fanned out
to the ShardSearcher deployments, each replica's budget --budget-x below the tenants' bytes). The load
comes in stages of (concurrency, seconds); each layout runs on fresh replicas that autoscale (Router 1..2,
every ShardSearcher 1..--replicas, on Serve's own autoscaler with --target-ongoing and the delays). Per
stage the requests, errors, hit rate and p50/p99; the RUNNING replicas of every deployment each second.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serving import free_port, make_queries, pct  # noqa: E402
from bench_tenants import build_indexes, zipf_ranks  # noqa: E402


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
    ap.add_argument("--indexes", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=4, help="most replicas of every ShardSearcher deployment")
    ap.add_argument("--budget-x", type=float, default=4.0, help="tenants' bytes / one replica's budget")
    ap.add_argument("--ramp", default="1:30,16:90,1:120", help="concurrency:seconds stages")
    ap.add_argument("--target-ongoing", type=float, default=2.0, help="autoscaling target per replica")
    ap.add_argument("--upscale-delay", type=float, default=30.0, help="Serve's default: 30 s")
    ap.add_argument("--downscale-delay", type=float, default=60.0, help="Serve's default is 600 s")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_ramp.json"))
    a = ap.parse_args()
    import ray
    from ray import serve

    from qrag_ray.cli.serve_cmd import wait_healthy
    from qrag_ray.index.format import load_manifest
    from qrag_ray.search.shard_search import load_shard
    from qrag_ray.serving.application import build_application, searcher_names
    from qrag_ray.serving.tenants import add_tenant

    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    ray.init(address="local", num_cpus=16, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": env})
    wd = Path(a.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    indexes = build_indexes(wd, a.indexes)
    mans = [load_manifest(ix) for ix in indexes]
    per_tenant = [sum(load_shard(m, s, verify=False).nbytes for s in range(m.num_shards)) for m in mans]
    budget = max(1 << 20, int(sum(per_tenant[i % a.indexes] for i in range(a.tenants)) / 2 / a.budget_x))
    tf = wd / "tenants-ramp.yaml"
    tf.unlink(missing_ok=True)
    keys = [add_tenant(tf, f"t{i:04d}", indexes[i % a.indexes]) for i in range(a.tenants)]
    ranks = zipf_ranks(a.tenants, 100_000)
    queries = make_queries(97)
    stages = [(int(c), float(secs)) for c, secs in (x.split(":") for x in a.ramp.split(","))]
    scaling = {"min_replicas": 1, "initial_replicas": 1, "target_ongoing_requests": a.target_ongoing,
               "upscale_delay_s": a.upscale_delay, "downscale_delay_s": a.downscale_delay}
    small = {"ray_actor_options": {"num_cpus": 0.25}}
    shards = mans[0].num_shards
    ropts = {"Router": {"ray_actor_options": {"num_cpus": 1}, "autoscaling_config": {**scaling, "max_replicas": 2}},
             **{name: {**small, "autoscaling_config": {**scaling, "max_replicas": a.replicas}}
                for name in searcher_names(shards, 1)}}
    report = {"command": " ".join([Path(sys.executable).name] + sys.argv), "stages": a.ramp, "autoscaling": scaling,
              "layouts": {}}
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    print(f"ramp {a.ramp}: autoscaling {scaling}\n| layout | stage (c) | requests | errors | hit rate | p50 ms | "
          "p99 ms |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, affinity in (("spread-ramp", False), ("affine-ramp", True)):
        args = {"tenants": str(tf), "local_search_max_bytes": 0, "warm_tenants": 0, "shard_cache_bytes": budget,
                "tenant_affinity": affinity, "request_timeout_s": 60}
        serve.run(build_application(args, ropts), name=name, route_prefix=f"/{name}")
        wait_healthy(f"http://127.0.0.1:{port}/{name}")
        r = ramp(f"http://127.0.0.1:{port}/{name}", name, keys, ranks, queries, stages, shards)
        report["layouts"][name] = r
        for st in r["stages"]:
            print(f"| {name} | {st['concurrency']} | {st['requests']} | {st['errors']} | {st['hit_rate']:.3f} | "
                  f"{st['p50_ms']} | {st['p99_ms']} |")
        print(f"  {name}: most replicas {r['max_replicas']}; a replica added {r['scale_up_after_load_s']} s after "
              f"the load rose, back to one each {r['scale_down_after_load_s']} s after it fell", flush=True)
        serve.delete(name)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=2))
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
