"""A load ramp on many tenants with autoscaling: how long after the load rose is a replica added, how long
after it fell are the deployments back to one replica, and does any request fail in between; tenant
affinity (Serve model multiplexing) against any replica, one after the other in one run.

    python -m benchmarks.serving_ramp [--ramp 1:30,16:90,1:120] [--upscale-delay 10] [--downscale-delay 30]
    python -m benchmarks.serving_ramp --tiny         # smoke: 4 tenants, a 20-second ramp, affinity only

The tenants and indexes are serving_tenants.py's (tenant i on index i % --indexes, built once in the same
--workdir; every tenant fanned out to the ShardSearcher deployments, each replica's budget --budget-x
below the tenants' bytes). The load comes in stages of (concurrency, seconds); each layout runs on fresh
replicas that autoscale (Router 1..2, every ShardSearcher 1..--replicas, on Serve's own autoscaler with
--target-ongoing and the delays, as a serve config's `deployments:` sets them). Per stage the requests,
errors, hit rate and p50/p99; every second the RUNNING replicas of every deployment.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.report import pct, print_table, write_json

FULL = {"tenants": 200, "indexes": 4, "replicas": 4, "ramp": "1:30,16:90,1:120", "layouts": "spread,affine",
        "upscale_delay": 30.0, "downscale_delay": 60.0}
TINY = {"tenants": 4, "indexes": 2, "replicas": 2, "ramp": "1:5,4:10,1:5", "layouts": "affine", "upscale_delay": 2.0,
        "downscale_delay": 5.0}


def stages_of(text: str) -> list[tuple[int, float]]:
    """`1:30,16:90` -> [(1, 30.0), (16, 90.0)]: (concurrency, seconds) per stage."""
    return [(int(c), float(secs)) for c, secs in (part.split(":") for part in text.split(","))]


def replicas_total(row: dict, deployments: list[str]) -> int:
    """The RUNNING replicas of `deployments` in one timeline row."""
    return sum(row[d] for d in deployments)


def ramp(url: str, app: str, keys: list[str], ranks, queries: list[str], stages: list[tuple[int, float]],
         shards: int) -> dict:
    """The load in stages of (concurrency, seconds), tenants drawn by `ranks` in turn; every second, the
    RUNNING replicas of each of the app's deployments (Serve's status)."""
    import httpx
    from ray import serve

    done = threading.Event()
    timeline: list[dict] = []
    counter = {"next": 0}
    lock = threading.Lock()
    t_start = time.time()

    def watch() -> None:
        """Every second, each deployment's RUNNING replicas."""
        while not done.is_set():
            deployments = serve.status().applications[app].deployments
            timeline.append({"t": round(time.time() - t_start, 1), **{
                d: sum(n for state, n in v.replica_states.items() if state == "RUNNING")
                for d, v in deployments.items()}})
            time.sleep(1.0)

    def worker(stage: int, until: float, out: list) -> None:
        """Send until `until`, each request's outcome to `out`."""
        with httpx.Client(base_url=url, timeout=120) as client:
            while time.time() < until:
                with lock:
                    number = counter["next"]
                    counter["next"] += 1
                start = time.perf_counter()
                try:
                    response = client.post("/v1/search", json={"query": queries[number % len(queries)], "k": 5},
                                           headers={"Authorization": f"Bearer {keys[ranks[number % len(ranks)]]}"})
                    status = response.status_code
                    cold = (response.json().get("timings") or {}).get("cold_loads", 0) if status == 200 else 0
                except (httpx.HTTPError, ValueError):
                    status = 0
                    cold = 0
                out.append({"stage": stage, "status": status, "ms": (time.perf_counter() - start) * 1000,
                            "cold": cold})

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results: list[dict] = []
    bounds = []
    for n, (concurrency, seconds) in enumerate(stages):
        began = time.time() - t_start
        until = time.time() + seconds
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _, stage=n, end=until: worker(stage, end, results), range(concurrency)))
        bounds.append((round(began, 1), round(time.time() - t_start, 1)))
    done.set()
    watcher.join()
    per_stage = []
    for n, (concurrency, seconds) in enumerate(stages):
        mine = [r for r in results if r["stage"] == n]
        ok = [r for r in mine if r["status"] == 200]
        lat = [r["ms"] for r in ok]
        per_stage.append({"concurrency": concurrency, "seconds": seconds, "from_s": bounds[n][0], "to_s": bounds[n][1],
                          "requests": len(mine), "errors": len(mine) - len(ok),
                          "hit_rate": round(1 - sum(r["cold"] for r in ok) / max(1, len(ok) * shards), 4),
                          "p50_ms": round(pct(lat, 50), 1), "p99_ms": round(pct(lat, 99), 1)})
    peak = max(range(len(stages)), key=lambda n: stages[n][0])
    deployments = [d for d in timeline[0] if d != "t"] if timeline else []
    start_total = replicas_total(timeline[0], deployments) if timeline else 0
    up = next((row["t"] for row in timeline
               if row["t"] >= bounds[peak][0] and replicas_total(row, deployments) > start_total), None)
    down = next((row["t"] for row in timeline
                 if row["t"] >= bounds[peak][1] and replicas_total(row, deployments) == len(deployments)), None)
    return {"stages": per_stage, "timeline": timeline, "errors": sum(s["errors"] for s in per_stage),
            "max_replicas": {d: max(row[d] for row in timeline) for d in deployments},
            "scale_up_after_load_s": None if up is None else round(up - bounds[peak][0], 1),
            "scale_down_after_load_s": None if down is None else round(down - bounds[peak][1], 1)}


def main(argv: list[str] | None = None) -> int:
    """Build the tenants (once), then the ramp on each layout's fresh app."""
    parser = options.parser(__doc__)
    options.add_common(parser, "serving_ramp", workdir=True)
    parser.set_defaults(workdir=str(options.RUNS / "serving_tenants"))  # serving_tenants.py's indexes, reused
    parser.add_argument("--tenants", type=int)
    parser.add_argument("--indexes", type=int)
    parser.add_argument("--replicas", type=int, help="most replicas of every ShardSearcher deployment")
    parser.add_argument("--budget-x", type=float, default=4.0, help="tenants' bytes / one replica's budget")
    parser.add_argument("--ramp", help="concurrency:seconds stages, e.g. 1:30,16:90,1:120")
    parser.add_argument("--layouts", help="spread (tenant_affinity off) and/or affine (on), in this order")
    parser.add_argument("--target-ongoing", type=float, default=2.0, help="autoscaling target per replica")
    parser.add_argument("--upscale-delay", type=float, help="seconds (full run: 30, Serve's default)")
    parser.add_argument("--downscale-delay", type=float, help="seconds (full run: 60; Serve's default is 600)")
    args = options.sized(parser.parse_args(argv), FULL, TINY)
    from ray import serve

    from benchmarks.harness import served, trees
    from benchmarks.harness.indexes import make_queries
    from benchmarks.harness.tenant_mix import index_bytes, tenant_indexes, write_tenants, zipf_ranks

    out = Path(args.out).resolve()
    workdir = Path(args.workdir).resolve()
    trees.leave_the_tree(workdir)
    indexes = tenant_indexes(workdir, options.ROOT, args.indexes, args.tiny)
    total = sum(index_bytes(indexes[i % args.indexes]) for i in range(args.tenants))
    budget = max(1 << 20, int(total / 2 / args.budget_x))  # two shard deployments share the tenants' bytes
    names = {f"t{i:04d}": indexes[i % args.indexes] for i in range(args.tenants)}
    keys = write_tenants(workdir / "tenants-ramp.yaml", names)
    tenant_keys = [keys[f"t{i:04d}"] for i in range(args.tenants)]
    ranks = zipf_ranks(args.tenants, 100_000)
    queries = make_queries(97)
    stages = stages_of(args.ramp)
    scaling = {"min_replicas": 1, "initial_replicas": 1, "target_ongoing_requests": args.target_ongoing,
               "upscale_delay_s": args.upscale_delay, "downscale_delay_s": args.downscale_delay}
    router = {"ray_actor_options": {"num_cpus": 1}, "autoscaling_config": {**scaling, "max_replicas": 2}}
    deployments = {"Router": router,
                   **{n: {"ray_actor_options": {"num_cpus": 0.25},
                          "autoscaling_config": {**scaling, "max_replicas": args.replicas}}
                      for n in served.searcher_names(2)}}  # the tenant indexes have 2 shards
    report = {"command": options.command(), "stages": args.ramp, "autoscaling": scaling, "layouts": {}}
    served.start_ray()
    client, port = served.start_serve()
    print(f"ramp {args.ramp}: autoscaling {scaling}", flush=True)
    rows = []
    for layout in args.layouts.split(","):
        name = f"{layout}-ramp"
        app_args = {"tenants": str(workdir / "tenants-ramp.yaml"), "local_search_max_bytes": 0, "warm_tenants": 0,
                    "shard_cache_bytes": budget, "tenant_affinity": layout == "affine", "request_timeout_s": 60}
        served.deploy(client, [served.app_config(name, options.ROOT, app_args, deployments)])
        url = served.app_urls([name], "default", port)[name]
        served.wait_ready(url, tenant_keys[0])
        result = ramp(url, name, tenant_keys, ranks, queries, stages, 2)
        report["layouts"][name] = result
        rows += [{"layout": name, **stage} for stage in result["stages"]]
        print(f"  {name}: most replicas {result['max_replicas']}; a replica added {result['scale_up_after_load_s']} s "
              f"after the load rose, back to one each {result['scale_down_after_load_s']} s after it fell", flush=True)
        serve.delete(name)
    served.shutdown()
    print_table([("layout", "layout", ""), ("stage c", "concurrency", "d"), ("requests", "requests", "d"),
                 ("errors", "errors", "d"), ("hit rate", "hit_rate", ".3f"), ("p50 ms", "p50_ms", ".1f"),
                 ("p99 ms", "p99_ms", ".1f")], rows)
    write_json(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
