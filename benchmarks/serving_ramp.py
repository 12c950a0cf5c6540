"""A load ramp with autoscaling, for one big tenant and for many tenants: the replicas of every deployment over
time, requests, errors and p50/p99 per stage, how long after the load rose the ShardSearchers had two
replicas each and how long after it fell they were back at one, whether a replica joining under load made
anyone wait (p99 of the window it joined in against the window before, and in that window the requests a new
replica answered against the others: the responses name their replicas), and what the first requests after
`/readyz` answered paid; the same ramp on the fixed-count layout (every ShardSearcher at --replicas) in the
same run for the comparison.

    python -m benchmarks.serving_ramp [--workloads big,many] [--ramp 1:60,16:90,1:120] [--upscale-delay 10]
    python -m benchmarks.serving_ramp --tiny         # smoke: a small big tenant and 4 tenants, a 30-second ramp

Workload `big`: the synthetic tenant of serving_big.py (--vectors in --shards shards, harness/synthetic.py,
built once under runs/serving_big), served as the open tenant, shard groups of 2 (`shards_per_searcher: 2`).
Workload `many`: serving_tenants.py's --tenants tenants on --indexes indexes (built once in --workdir), drawn
by Zipf rank, every tenant fanned out to the ShardSearchers (one deployment per shard), each replica's
budget --budget-x below the tenants' bytes. Each layout runs on a fresh app: the Router autoscales 1..2 on
Serve's default policy (target --router-target); layout `autoscaled` has every ShardSearcher 1..--replicas
on qrag's policy (serving/autoscaling.py: --target-ongoing queries per replica), `fixed` has them at
--replicas. Both layouts get the delays, --look-back and --metrics-interval (Serve's metrics push), as a
serve config's `deployments:` sets them.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.report import pct, print_table, write_json

FULL = {"workloads": "big,many", "layouts": "autoscaled,fixed", "ramp": "1:60,16:90,1:120", "tenants": 200,
        "indexes": 4, "vectors": 2_000_000, "shards": 4, "factory": "IVF1024,PQ32x4fs,Refine(SQfp16)", "replicas": 3,
        "upscale_delay": 10.0, "downscale_delay": 30.0}
TINY = {"workloads": "big,many", "layouts": "autoscaled", "ramp": "1:5,4:15,1:10", "tenants": 4, "indexes": 2,
        "vectors": 20_000, "shards": 4, "factory": "Flat", "replicas": 2, "upscale_delay": 2.0,
        "downscale_delay": 5.0}
FIRST_REQUESTS = 8  # requests sent at once right after /readyz answers 200


def wait_readyz(url: str, timeout: float = 900) -> float:
    """Poll `/readyz` until it answers 200; the seconds it took."""
    import httpx

    started = time.time()
    while time.time() - started < timeout:
        try:
            if httpx.get(f"{url}/readyz", timeout=30).status_code == 200:
                return time.time() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url}/readyz did not answer 200 in {timeout:.0f} s")


def first_requests(url: str, asks: list[tuple[dict, dict]], cold: list[tuple[dict, dict]]) -> dict:
    """Right after /readyz: `asks` at once (each request's ms and status), then `cold` one by one (p50), then
    `asks` at once again (what they cost warm, on the same box at the same time)."""
    import httpx

    def one(ask: tuple[dict, dict]) -> tuple[int, float]:
        body, headers = ask
        began = time.perf_counter()
        try:
            status = httpx.post(f"{url}/v1/search", json=body, headers=headers, timeout=120).status_code
        except httpx.HTTPError:
            status = 0
        return status, (time.perf_counter() - began) * 1000

    with ThreadPoolExecutor(len(asks)) as pool:
        first = list(pool.map(one, asks))
        rest = [one(ask) for ask in cold]
        again = list(pool.map(one, asks))
    return {"first_ms": [round(ms, 1) for _, ms in first], "first_errors": sum(s != 200 for s, _ in first),
            "cold_requests": len(rest), "cold_errors": sum(s != 200 for s, _ in rest),
            "cold_p50_ms": round(pct([ms for s, ms in rest if s == 200], 50), 1) if rest else None,
            "again_ms": [round(ms, 1) for _, ms in again]}


def big_workload(args) -> dict:
    """The synthetic big tenant: its app args, its ShardSearchers, its requests."""
    from benchmarks.harness import served
    from benchmarks.harness.indexes import make_queries
    from benchmarks.harness.synthetic import big_tenant

    index = big_tenant(options.RUNS / "serving_big", args.vectors, args.shards, 8, args.factory, 16)
    queries = make_queries(97)

    def request(number: int) -> tuple[dict, dict]:
        return {"query": queries[number % len(queries)], "k": 10}, {}

    return {"app_args": {"index": str(index), "local_search_max_bytes": 0, "shards_per_searcher": 2,
                         "request_timeout_s": 60},
            "searchers": served.searcher_names(args.shards, 2), "shards": args.shards, "request": request,
            "first": [request(n) for n in range(FIRST_REQUESTS)], "cold": []}


def many_workload(args, workdir: Path) -> dict:
    """serving_tenants.py's tenants: their app args, ShardSearchers and requests (Zipf-drawn tenants); the first
    requests go to the first tenants (the warmed ones), the cold ones to every other tenant once."""
    from benchmarks.harness import served
    from benchmarks.harness.indexes import make_queries
    from benchmarks.harness.tenant_mix import index_bytes, tenant_indexes, write_tenants, zipf_ranks

    indexes = tenant_indexes(workdir, options.ROOT, args.indexes, args.tiny)
    total = sum(index_bytes(indexes[i % args.indexes]) for i in range(args.tenants))
    budget = max(1 << 20, int(total / 2 / args.budget_x))  # two shard deployments share the tenants' bytes
    names = {f"t{i:04d}": indexes[i % args.indexes] for i in range(args.tenants)}
    keys = write_tenants(workdir / "tenants-ramp.yaml", names)
    tenant_keys = [keys[f"t{i:04d}"] for i in range(args.tenants)]
    ranks = zipf_ranks(args.tenants, 100_000)
    queries = make_queries(97)

    def ask(tenant: int, number: int) -> tuple[dict, dict]:
        return ({"query": queries[number % len(queries)], "k": 5},
                {"Authorization": f"Bearer {tenant_keys[tenant]}"})

    def request(number: int) -> tuple[dict, dict]:
        return ask(int(ranks[number % len(ranks)]), number)

    first = min(FIRST_REQUESTS, args.tenants)
    return {"app_args": {"tenants": str(workdir / "tenants-ramp.yaml"), "local_search_max_bytes": 0,
                         "shard_cache_bytes": budget, "request_timeout_s": 60},
            "searchers": served.searcher_names(2), "shards": 2, "request": request,
            "first": [ask(n, n) for n in range(first)], "cold": [ask(n, n) for n in range(first, args.tenants)]}


def layout_options(args, layout: str, searchers: list[str]) -> dict[str, dict]:
    """The deployments' options of a layout, as a serve config's `deployments:` gives them."""
    from qrag_ray.serving.application import SHARD_SEARCHER_POLICY

    delays = {"upscale_delay_s": args.upscale_delay, "downscale_delay_s": args.downscale_delay,
              "look_back_period_s": args.look_back, "metrics_interval_s": args.metrics_interval}
    router = {"ray_actor_options": {"num_cpus": 1},
              "autoscaling_config": {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 2,
                                     "target_ongoing_requests": args.router_target, **delays}}
    if layout == "fixed":
        searcher = {"ray_actor_options": {"num_cpus": args.searcher_cpus}, "num_replicas": args.replicas,
                    "autoscaling_config": None}
    else:
        searcher = {"ray_actor_options": {"num_cpus": args.searcher_cpus},
                    "autoscaling_config": {"min_replicas": 1, "initial_replicas": 1, "max_replicas": args.replicas,
                                           "target_ongoing_requests": args.target_ongoing, **delays,
                                           "policy": SHARD_SEARCHER_POLICY}}
    return {"Router": router, **{name: searcher for name in searchers}}


def judge(run: dict, stages: list[tuple[int, float]], searchers: list[str], downscale_delay: float) -> dict:
    """What the ramp says of the ShardSearchers: seconds from the load's rise to two replicas each, from its
    fall (after the downscale delay) to one each, their replica changes in the first stage, the joins."""
    from benchmarks.harness.ramp_load import first_at_most, first_reaching, join_windows, scale_events

    peak = max(range(len(stages)), key=lambda n: stages[n][0])
    rise = run["bounds"][peak][0]
    fall = run["bounds"][peak][1]
    up = first_reaching(run["timeline"], searchers, 2, rise)
    down = first_at_most(run["timeline"], searchers, 1, fall)
    first_begin, first_end = run["bounds"][0]
    first_changes = [e for e in scale_events(run["timeline"])
                     if e["deployment"] in searchers and first_begin <= e["t"] < first_end]
    joins = join_windows(run)
    return {"two_each_after_rise_s": None if up is None else round(up - rise, 1),
            "min_after_fall_s": None if down is None else round(down - fall, 1),
            "min_after_fall_past_delay_s": None if down is None else round(down - fall - downscale_delay, 1),
            "changes_in_first_stage": len(first_changes), "joins": joins,
            "worst_join_ratio": max((j["ratio"] for j in joins if j["ratio"] is not None), default=None),
            "worst_new_replica_ratio": max((j["new_ratio"] for j in joins if j["new_ratio"] is not None),
                                           default=None)}


def run_layout(client, port: int, name: str, workload: dict, deployments: dict, stages, args) -> dict:
    """One fresh app: deploy, /readyz, the first requests, the ramp; then the app is deleted."""
    from ray import serve

    from benchmarks.harness import served
    from benchmarks.harness.ramp_load import run_ramp, scale_events, stage_rows, windows

    served.deploy(client, [served.app_config(name, options.ROOT, workload["app_args"], deployments)])
    url = served.app_urls([name], "default", port)[name]
    ready_s = wait_readyz(url)
    first = first_requests(url, workload["first"], workload["cold"])
    run = run_ramp(url, name, stages, workload["request"])
    serve.delete(name)
    return {"ready_s": round(ready_s, 1), "first_requests": first,
            "stages": stage_rows(run, stages, workload["shards"]), "windows": windows(run),
            "scale_events": scale_events(run["timeline"]), "timeline": run["timeline"],
            "judged": judge(run, stages, workload["searchers"], args.downscale_delay)}


def print_layout(name: str, result: dict) -> None:
    """A layout's stages, its replica changes and its verdict lines."""
    print_table([("stage", "stage", "d"), ("c", "concurrency", "d"), ("requests", "requests", "d"),
                 ("errors", "errors", "d"), ("hit rate", "hit_rate", ".3f"), ("p50 ms", "p50_ms", ".1f"),
                 ("p99 ms", "p99_ms", ".1f"), ("replicas (min-max)", "replicas", "")], result["stages"], title=name)
    changes = ", ".join(f"{e['t']:.0f}s {e['deployment']} {e['from']}->{e['to']}" for e in result["scale_events"])
    print(f"  replica changes: {changes or 'none'}")
    first = result["first_requests"]
    print(f"  /readyz after {result['ready_s']} s; the first {len(first['first_ms'])} requests then: "
          f"{first['first_ms']} ms ({first['first_errors']} errors); {first['cold_requests']} cold tenants after: "
          f"p50 {first['cold_p50_ms']} ms; the first {len(first['again_ms'])} again: {first['again_ms']} ms")
    judged = {k: v for k, v in result["judged"].items() if k != "joins"}
    print(f"  ShardSearchers: {judged}")
    for join in result["judged"]["joins"]:
        print(f"  join {join['t']:.0f}s {join['deployment']} {join['from']}->{join['to']}: p99 {join['p99_before_ms']} "
              f"ms before, {join['p99_after_ms']} ms after (x{join['ratio']}); after, the {join['new_requests']} "
              f"answered by a new replica {join['p99_new_ms']} ms against the others' {join['p99_old_ms']} ms "
              f"(x{join['new_ratio']})")


def main(argv: list[str] | None = None) -> int:
    """Build what the workloads need (once), then each workload's layouts on fresh apps."""
    parser = options.parser(__doc__)
    options.add_common(parser, "serving_ramp", workdir=True)
    parser.set_defaults(workdir=str(options.RUNS / "serving_tenants"))  # serving_tenants.py's indexes, reused
    parser.add_argument("--workloads", help="big (one synthetic tenant) and/or many (tenants), in this order")
    parser.add_argument("--layouts", help="autoscaled (qrag's policy) and/or fixed (--replicas each), in this order")
    parser.add_argument("--ramp", help="concurrency:seconds stages, e.g. 1:60,16:90,1:120")
    parser.add_argument("--tenants", type=int)
    parser.add_argument("--indexes", type=int)
    parser.add_argument("--budget-x", type=float, default=4.0, help="tenants' bytes / one replica's budget (many)")
    parser.add_argument("--vectors", type=int, help="the big tenant's vectors")
    parser.add_argument("--shards", type=int, help="the big tenant's shards (shard groups of 2)")
    parser.add_argument("--factory", help="the big tenant's FAISS factory")
    parser.add_argument("--replicas", type=int, help="most replicas of every ShardSearcher (fixed: exactly)")
    parser.add_argument("--searcher-cpus", type=float, default=0.5, help="num_cpus of a ShardSearcher replica")
    parser.add_argument("--target-ongoing", type=float, default=2.0,
                        help="the ShardSearchers' target: queries per replica")
    parser.add_argument("--router-target", type=float, default=2.0, help="the Router's target_ongoing_requests")
    parser.add_argument("--upscale-delay", type=float, help="seconds (full run: 10)")
    parser.add_argument("--downscale-delay", type=float, help="seconds (full run: 30; Serve's default is 600)")
    parser.add_argument("--look-back", type=float, default=10.0, help="look_back_period_s (Serve's default: 30)")
    parser.add_argument("--metrics-interval", type=float, default=2.0,
                        help="metrics_interval_s: how often replicas push their metrics (Serve's default: 10)")
    args = options.sized(parser.parse_args(argv), FULL, TINY)

    from benchmarks.harness import served, trees
    from benchmarks.harness.ramp_load import stages_of

    out = Path(args.out).resolve()
    workdir = Path(args.workdir).resolve()
    trees.leave_the_tree(workdir)
    stages = stages_of(args.ramp)
    workloads = {}
    for workload in args.workloads.split(","):
        workloads[workload] = big_workload(args) if workload == "big" else many_workload(args, workdir)
    report = {"command": options.command(), "stages": args.ramp, "workloads": {}}
    served.start_ray()
    client, port = served.start_serve()
    for workload, spec in workloads.items():
        report["workloads"][workload] = {"searchers": spec["searchers"], "layouts": {}}
        for layout in args.layouts.split(","):
            name = f"{workload}-{layout}"
            deployments = layout_options(args, layout, spec["searchers"])
            print(f"{name}: ramp {args.ramp}", flush=True)
            result = run_layout(client, port, name, spec, {**deployments}, stages, args)
            result["deployments"] = deployments
            report["workloads"][workload]["layouts"][layout] = result
            print_layout(name, result)
    served.shutdown()
    write_json(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
