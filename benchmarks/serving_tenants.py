"""Many tenants on shared ShardSearcher replicas: what does a tenant's cold first query cost, what CPU per
request does the steady mix take against the in-process search of the same queries, and what does tenant
affinity (Serve model multiplexing) buy against any replica (against another commit with --baseline-ref)?

    python -m benchmarks.serving_tenants [--tenants 200] [--indexes 4] [--replicas 2] [--budget-x 4]
                                         [--requests 2000] [--concurrency 8] [--layouts affine,spread]
                                         [--serve-env tuned] [--baseline-ref REF] [--rounds 1]
    python -m benchmarks.serving_tenants --tiny      # smoke: 6 tenants on 2 indexes of the demo's topics

--indexes small indexes (slices of the Python language reference, 2 shards each, one vector per chunk) are
registered under --tenants names in a tenants file, tenant i on index i % --indexes (--own-copies: each
on a copy of its own). A loaded shard is cached per tenant, so the tenants' bytes total N times an
index's, and each ShardSearcher replica's budget (`shard_cache_bytes`) is set so that this total is
--budget-x times one replica's: no replica can hold every tenant. Every tenant fans out to the
ShardSearcher deployments (`local_search_max_bytes: 0`), --replicas replicas each; requests pick a tenant
by Zipf(1.1) rank, --concurrency clients in a closed loop, under the app's deadline (--timeout).

Each app (`new`: this tree; `base`: REF's, from a temporary git worktree) runs on fresh replicas with
nothing loaded but the Router's query embedder (one query of a tenant outside the mix first), the apps
alternating --rounds times. Per run:
  - warm-up (the first --warmup requests, cold tenants): p50/p99, deadline misses (504), errors, and
    each tenant's first query (p50/p99/max);
  - steady state (the rest): hit rate (1 - cold loads / shard calls, from the response's
    `timings.cold_loads`), cold loads per minute, p50/p99, qps, errors, and the CPU ms per request of every
    Ray process (the request path: the replicas and Serve's ingress);
  - in process (once): the same steady queries, each searched alone on its tenant's index with
    `SearchEngine` (one thread, like a replica): CPU ms per query.
A synthetic tenant mix on small indexes on one machine: the per-request cost and the cache behaviour, not
the latency of a big index.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.load import closed_loop
from benchmarks.harness.processes import cpu_by_process, ray_cpu_by_process, request_path_cpu
from benchmarks.harness.report import pct, write_json

FULL = {"tenants": 200, "indexes": 4, "replicas": 2, "requests": 2000, "concurrency": [8], "rounds": 1}
TINY = {"tenants": 6, "indexes": 2, "replicas": 1, "requests": 40, "concurrency": [2], "rounds": 1}


def summary(records: list[dict]) -> dict:
    """Requests, errors, deadline misses and latencies of a phase."""
    lat = [r["ms"] for r in records if r["status"] == 200]
    return {"requests": len(records), "errors": sum(r["status"] != 200 for r in records),
            "deadline_misses": sum(r["status"] == 504 for r in records), "p50_ms": round(pct(lat, 50), 1),
            "p99_ms": round(pct(lat, 99), 1), "max_ms": round(max(lat, default=0), 1)}


def run_app(url: str, app: str, keys: list[str], ranks, queries: list[str], concurrency: int, warmup: int,
            shards: int, primer: str) -> dict:
    """The warm-up and steady phases of one app on fresh replicas."""
    import httpx

    # one query of a tenant outside the mix first: the Router's query embedder loads (a server started with
    # warm_tenants > 0 has it loaded before it is ready), every tenant of the mix stays cold
    httpx.post(f"{url}/v1/search", json={"query": queries[0], "k": 5}, headers={"Authorization": f"Bearer {primer}"},
               timeout=300).raise_for_status()
    bodies = [{"query": queries[i % len(queries)], "k": 5} for i in range(len(ranks))]
    headers = [{"Authorization": f"Bearer {keys[rank]}"} for rank in ranks]
    before = ray_cpu_by_process()
    warm = closed_loop(url, bodies[:warmup], concurrency, headers[:warmup])["records"]
    mid = ray_cpu_by_process()
    steady = closed_loop(url, bodies[warmup:], concurrency, headers[warmup:])["records"]
    after = ray_cpu_by_process()
    seen: set[int] = set()
    first_of_tenant = set()
    for i, rank in enumerate(ranks[:warmup]):
        if int(rank) not in seen:
            first_of_tenant.add(i)
            seen.add(int(rank))
    first = [r for r in warm if r["i"] in first_of_tenant]
    ok = [r for r in steady if r["status"] == 200]
    cold = sum(r["timings"].get("cold_loads", 0) for r in ok)
    wall = (max(r["end"] for r in steady) - min(r["end"] - r["ms"] / 1000 for r in steady)) or float("nan")
    by_process = cpu_by_process(mid, after, len(ok))
    warm_cpu = sum(cpu_by_process(before, mid, len(warm)).values())
    return {"warmup": {**summary(warm), "first_queries": summary(first), "cpu_ms_per_request": round(warm_cpu, 2),
                       "cold_loads": sum(r["timings"].get("cold_loads", 0) for r in warm if r["status"] == 200)},
            "steady": {**summary(steady), "hit_rate": round(1 - cold / max(1, len(ok) * shards), 4),
                       "cold_loads": cold, "cold_loads_per_min": round(60 * cold / wall, 1),
                       "qps": round(len(ok) / wall, 1), "cpu_ms_per_request": round(sum(by_process.values()), 2),
                       "embed_batch_mean": round(statistics.mean([r["timings"].get("embed_batch", 0) for r in ok]
                                                                 or [0]), 2),
                       "request_path_cpu_ms": round(request_path_cpu(by_process, app), 2),
                       "cpu_ms_per_request_by_process": dict(list(by_process.items())[:8])}}


def in_process_cpu(indexes: list[Path], tenant_index: list[int], ranks, queries: list[str]) -> dict:
    """Each query searched alone on its tenant's index, in this process: CPU ms and wall ms per query."""
    import torch

    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)
    engines = [SearchEngine(ix, threads=1) for ix in indexes]
    for engine in engines:
        engine.search([queries[0]], k=5)
    cpu, lat = [], []
    for i, rank in enumerate(ranks):
        cpu0 = time.process_time()
        start = time.perf_counter()
        engines[tenant_index[rank]].search([queries[i % len(queries)]], k=5)
        cpu.append((time.process_time() - cpu0) * 1000)
        lat.append((time.perf_counter() - start) * 1000)
    return {"queries": len(ranks), "cpu_ms_per_query": round(statistics.mean(cpu), 2), "p50_ms": round(pct(lat, 50), 2)}


def parse(argv: list[str] | None):
    """The options, with the full or tiny sizes."""
    from benchmarks.harness.served import LAYOUT_HELP, LAYOUTS

    parser = options.parser(__doc__)
    options.add_common(parser, "serving_tenants", rounds=True, concurrency=True, baseline=True, workdir=True)
    parser.add_argument("--tenants", type=int)
    parser.add_argument("--indexes", type=int, help="distinct small indexes the tenants are spread over")
    parser.add_argument("--own-copies", action="store_true", help="each tenant on its own copy of its index")
    parser.add_argument("--replicas", type=int, help="replicas of every ShardSearcher deployment")
    parser.add_argument("--budget-x", type=float, default=4.0, help="tenants' bytes / one replica's budget")
    parser.add_argument("--requests", type=int)
    parser.add_argument("--warmup", type=int, help="requests of the warm-up phase (default: --tenants)")
    parser.add_argument("--timeout", type=float, default=10.0, help="the app's request_timeout_s")
    parser.add_argument("--layouts", default="affine", help="affine (tenant_affinity on) and/or spread (off)")
    parser.add_argument("--shards-per-searcher", type=int, default=1)
    parser.add_argument("--serve-env", choices=LAYOUTS, default="tuned", help=LAYOUT_HELP)
    return options.sized(parser.parse_args(argv), FULL, TINY)


def measure(args) -> dict:
    """Build the tenants (once), then every round, concurrency, layout and app."""
    from ray import serve

    from benchmarks.harness import served, trees
    from benchmarks.harness.indexes import make_queries
    from benchmarks.harness.tenant_mix import index_bytes, tenant_indexes, write_tenants, zipf_ranks

    layout_env = served.ingress_env(args.serve_env)
    apps = trees.trees(args.baseline_ref)
    workdir = Path(args.workdir).resolve()
    trees.leave_the_tree(workdir)
    indexes = tenant_indexes(workdir, trees.index_builder(apps), args.indexes, args.tiny)
    tenant_index = [i % args.indexes for i in range(args.tenants)]
    paths = [indexes[j] for j in tenant_index]
    if args.own_copies:  # as tenants with their own indexes have: nothing read or verified once serves another
        for i, src in enumerate(paths):
            if not ((dst := workdir / "copies" / f"t{i:04d}") / "manifest.json").is_file():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            paths[i] = dst
    per_tenant = [index_bytes(p) for p in paths]
    searchers = served.searcher_names(2, args.shards_per_searcher)  # the tenant indexes have 2 shards
    budget = max(1 << 20, int(sum(per_tenant) / len(searchers) / args.budget_x))
    keys = write_tenants(workdir / "tenants.yaml", {**{f"t{i:04d}": p for i, p in enumerate(paths)},
                                                     "primer": indexes[0]})
    tenant_keys = [keys[f"t{i:04d}"] for i in range(args.tenants)]
    ranks = zipf_ranks(args.tenants, args.requests)
    queries = make_queries(97)
    warmup = args.warmup if args.warmup is not None else args.tenants
    report = {"command": options.command(), "tenants": args.tenants, "indexes": args.indexes,
              "tenant_bytes_max": max(per_tenant), "tenant_bytes_total": sum(per_tenant),
              "replicas_per_shard": args.replicas, "replica_budget_bytes": budget,
              "budget_x": args.budget_x, "serve_env": args.serve_env, "serve_vars": layout_env, "warmup": warmup,
              "distinct_tenants_asked": len(set(ranks.tolist())), "baseline_ref": args.baseline_ref, "runs": []}
    print(f"{args.tenants} tenants on {args.indexes} indexes (up to {max(per_tenant) / 1e6:.2f} MB a tenant), "
          f"replica budget {budget / 1e6:.1f} MB (tenants' total = {args.budget_x:g}x), {args.replicas} replicas per "
          "shard deployment, "
          f"{args.requests} requests, deadline {args.timeout:g} s", flush=True)
    shift = warmup % len(queries)  # the steady phase's request i asks queries[(warmup + i) % len(queries)]
    report["in_process"] = in_process_cpu(indexes, tenant_index, ranks[warmup:], queries[shift:] + queries[:shift])
    served.start_ray()
    client, port = served.start_serve()
    deployments = {"Router": served.fixed(1, 1), **{n: served.fixed(args.replicas, 0.25) for n in searchers}}
    for _ in range(args.rounds):
        for concurrency in args.concurrency:
            for layout in args.layouts.split(","):
                for tree_name, tree in apps.items():
                    name = f"{tree_name}-{layout}"
                    app_args = {"tenants": str(workdir / "tenants.yaml"), "local_search_max_bytes": 0,
                                "warm_tenants": 0, "shard_cache_bytes": budget, "tenant_affinity": layout == "affine",
                                "request_timeout_s": args.timeout, "shards_per_searcher": args.shards_per_searcher}
                    served.deploy(client, [served.app_config(name, tree, app_args, deployments)])
                    url = served.app_urls([name], args.serve_env, port)[name]
                    served.wait_ready(url, keys["primer"])
                    run = {"app": tree_name, "layout": layout, "concurrency": concurrency,
                           **run_app(url, name, tenant_keys, ranks, queries, concurrency, warmup, 2, keys["primer"])}
                    report["runs"].append(run)
                    print_run(run, report["in_process"])
                    serve.delete(name)
    served.shutdown()
    return report


def print_run(run: dict, in_process: dict) -> None:
    """One run as a table row."""
    warm = run["warmup"]
    steady = run["steady"]
    print(f"| {run['app']} | {run['layout']} | c={run['concurrency']} | warm-up p50/p99 {warm['p50_ms']}/"
          f"{warm['p99_ms']} ms, first queries p99 {warm['first_queries']['p99_ms']} max "
          f"{warm['first_queries']['max_ms']}, misses {warm['deadline_misses']}, errors {warm['errors']} | steady "
          f"p50/p99 {steady['p50_ms']}/{steady['p99_ms']}, qps {steady['qps']}, hit rate {steady['hit_rate']:.3f}, "
          f"CPU ms/req {steady['cpu_ms_per_request']} (path {steady['request_path_cpu_ms']}; in-process "
          f"{in_process['cpu_ms_per_query']}), errors {steady['errors']} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Parse, measure and write the report."""
    from benchmarks.harness.trees import BaselineError

    args = parse(argv)
    out = Path(args.out).resolve()
    try:
        report = measure(args)
    except BaselineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
