"""A big tenant served: what does the fan-out from the Router to the ShardSearcher replicas cost in latency
and CPU per request against the in-process search of the same index and queries (what `qrag search`
runs), and against another commit's serving code with --baseline-ref?

    python -m benchmarks.serving_big --vectors 2000000 --shards 4 --serve-env direct   # or tuned, haproxy
    python -m benchmarks.serving_big --vectors 2000000 --shards 4 --shards-per-searcher 4 --searcher-cpus 2 \
        --concurrency 1,8,32 --queries 600 --rounds 2 --baseline-ref REF
    python -m benchmarks.serving_big --tiny        # smoke: 20,000 vectors in 2 shards, exact search, 6 queries

The index is synthetic (harness/synthetic.py: `--vectors` vectors in `--shards` shards written in `qrag
index`'s format, a tiny random-weights query embedder on both sides), built once under --workdir. Every
query is fanned out to the ShardSearcher deployments (`local_search_max_bytes: 0`), `--shards-per-searcher`
shards per deployment, each replica `--searcher-cpus` CPUs (a serve config's `deployments:` override).
App `new` serves it with this tree's code, `base` with REF's (a temporary git worktree) on the same Ray:
  - concurrency 1: in process and every app query by query (httpx, then http.client); p50/p99; every
    served ranking compared with the in-process one; the Router's own timings (p50);
  - each other concurrency: closed-loop blocks of --queries requests, the apps alternating --rounds
    times; in process the same blocks as one `search` call per c queries (one encode, the shards
    searched for all);
  - CPU ms per request: served, every Ray process over the blocks, by process and the request path's
    (the app's replicas and Serve's proxy or HAProxy ingress); in process, this process's CPU time.
--data topics puts half of the chunks around the queries' own vectors (the data of filtered_search.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.load import alternating_blocks, interleaved_c1, print_served
from benchmarks.harness.report import write_json

FULL = {"vectors": 2_000_000, "shards": 4, "factory": "IVF1024,PQ32x4fs,Refine(SQfp16)", "queries": 60, "rounds": 2,
        "concurrency": [1, 8, 32]}
TINY = {"vectors": 20_000, "shards": 2, "factory": "Flat", "queries": 6, "rounds": 1, "concurrency": [1, 4]}


def parse(argv: list[str] | None):
    """The options, with the full or tiny sizes."""
    from benchmarks.harness.served import LAYOUT_HELP, LAYOUTS

    parser = options.parser(__doc__)
    options.add_common(parser, "serving_big", queries=True, rounds=True, concurrency=True, baseline=True, workdir=True)
    parser.add_argument("--vectors", type=int)
    parser.add_argument("--shards", type=int)
    parser.add_argument("--vectors-per-chunk", type=int, default=8)
    parser.add_argument("--factory", help="FAISS factory (full: IVF1024,PQ32x4fs,Refine(SQfp16); tiny: Flat)")
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--shards-per-searcher", type=int, default=1,
                    help="the app's shards_per_searcher: consecutive shards one ShardSearcher deployment searches")
    parser.add_argument("--searcher-cpus", type=float,
                        help="num_cpus of each ShardSearcher replica (default: the app's)")
    parser.add_argument("--serve-env", choices=LAYOUTS, default="direct", help=LAYOUT_HELP)
    parser.add_argument("--data", choices=("random", "topics"), default="random",
                    help="random: every chunk around a random centre (a query has no near neighbours); topics: half "
                         "of the chunks at graded distances around the queries' vectors")
    return options.sized(parser.parse_args(argv), FULL, TINY)


def measure(args) -> dict:
    """Build (once) and serve the tenant, then c=1 and every other concurrency."""
    from benchmarks.harness import served, trees
    from benchmarks.harness.indexes import make_queries, manifest
    from benchmarks.harness.synthetic import big_tenant

    layout_env = served.ingress_env(args.serve_env)
    apps = trees.trees(args.baseline_ref)
    workdir = Path(args.workdir).resolve()
    trees.leave_the_tree(workdir)
    index = big_tenant(workdir, args.vectors, args.shards, args.vectors_per_chunk, args.factory, args.nprobe,
                       args.data == "topics")
    served.start_ray()
    client, port = served.start_serve()
    app_args = {"index": str(index), "local_search_max_bytes": 0, "shards_per_searcher": args.shards_per_searcher,
            "request_timeout_s": 60}
    names = served.searcher_names(args.shards, args.shards_per_searcher)
    overrides = {name: served.fixed(num_cpus=args.searcher_cpus) for name in names} if args.searcher_cpus else {}
    served.deploy(client, [served.app_config(n, tree, app_args, overrides) for n, tree in apps.items()])
    urls = served.app_urls(list(apps), args.serve_env, port)
    for url in urls.values():
        served.wait_ready(url)
    trees.check_trees(apps)
    import torch

    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)  # one CPU, like a replica
    engine = SearchEngine(index, threads=1)
    queries = make_queries(args.queries)
    engine.search(queries[:1], k=args.k)  # its embedder loads on the first search: not a cost of any block
    report = {"command": options.command(), "baseline_ref": args.baseline_ref, "serve_env": args.serve_env,
              "serve_vars": layout_env, "data": args.data, "index": str(index),
              "vectors": (manifest(index).get("counts") or {}).get("vectors"), "shards": args.shards,
              "shards_per_searcher": args.shards_per_searcher, "searcher_cpus": args.searcher_cpus,
              "factory": args.factory,
              "nprobe": args.nprobe, "queries": len(queries), "k": args.k, "blocks": {}}
    if 1 in args.concurrency:
        report["c1"] = interleaved_c1(engine, urls, queries, args.k)
    bodies = [{"query": q, "k": args.k} for q in queries]
    for concurrency in (c for c in args.concurrency if c != 1):
        report["blocks"][str(concurrency)] = alternating_blocks(urls, bodies, concurrency, args.rounds, engine, args.k)
    served.shutdown()
    return report


def main(argv: list[str] | None = None) -> int:
    """Parse, measure, print the table and write the report."""
    from benchmarks.harness.trees import BaselineError

    args = parse(argv)
    out = Path(args.out).resolve()
    try:
        report = measure(args)
    except BaselineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_served(report, f"{report['vectors']:,} vectors in {args.shards} shards ({args.factory}, "
                 f"nprobe {args.nprobe}; "
                 f"{args.shards_per_searcher} per ShardSearcher, num_cpus {args.searcher_cpus or 1:g}), "
                 f"{report['queries']} queries, k={args.k}, {args.serve_env}")
    write_json(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
