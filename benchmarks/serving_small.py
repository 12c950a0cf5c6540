"""A small tenant served: how much does Serve add to a query against the same search in process, and
what throughput and CPU per request does the served app reach at each concurrency (against another
commit's serving code with --baseline-ref)?

    python -m benchmarks.serving_small [--queries 60] [--concurrency 1,8,32] [--rounds 2] [--serve-env direct]
                                       [--baseline-ref REF] [--index DIR] [--out runs/serving_small.json]
    python -m benchmarks.serving_small --tiny                      # smoke: the demo's 16 topics, 8 queries
    python -m benchmarks.serving_small --url http://127.0.0.1:8000 --concurrency 1,8,32   # a running server

The index is the `qrag demo` corpus (the Python language reference, 3 shards, atom-sentence) built once
under --workdir (by the baseline's tree with --baseline-ref: both apps serve the same files), or --index.
App `new` serves it with this tree's code, app `base` with REF's (a temporary git worktree, its replicas
importing qrag_ray from it), both from the tree's own Serve builder with its default deployment options,
on one local Ray (--serve-env: the ingress layout). Measured in one run, because the machine is shared:
  - concurrency 1: the in-process `SearchEngine.search` (torch and FAISS on one thread, like a replica)
    and every app query by query, each app over httpx and over http.client (a lean client); p50/p99;
    the share of served pages ranked exactly as in process; the handler's own timings (p50);
  - each other concurrency: closed-loop blocks of --queries requests, the apps alternating --rounds times,
    and the same queries in process (one `search` call per c queries); qps, p50/p99, the Ray processes'
    CPU ms per request (all, by process, the request path's) and the qps that CPU allows on every core;
  - with --llm: mode=hyde against the question index (mode=default) per query, app `new` at c=1.
With --url, only the closed-loop blocks against that running server (restart it between variants).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.harness import options
from benchmarks.harness.load import COLUMNS, alternating_blocks, closed_loop, interleaved_c1, print_served, summarize
from benchmarks.harness.report import print_table, write_json

FULL = {"queries": 60, "rounds": 2, "concurrency": [1, 8, 32]}
TINY = {"queries": 8, "rounds": 1, "concurrency": [1, 4]}


def parse(argv: list[str] | None):
    """The options, with the full or tiny sizes."""
    from benchmarks.harness.served import LAYOUT_HELP, LAYOUTS

    parser = options.parser(__doc__)
    options.add_common(parser, "serving_small", queries=True, rounds=True, concurrency=True, baseline=True,
                       workdir=True)
    parser.add_argument("--index", help="serve this index instead of building the demo corpus's")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--serve-env", choices=LAYOUTS, default="default", help=LAYOUT_HELP)
    parser.add_argument("--url", help="load this running server instead (closed-loop blocks only)")
    parser.add_argument("--llm", help="`vllm` (the bundled Qwen in the app) or an OpenAI-compatible URL: mode=hyde too")
    parser.add_argument("--hyde-queries", type=int, default=5)
    return options.sized(parser.parse_args(argv), FULL, TINY)


def load_running(args) -> dict:
    """Closed-loop blocks against a running server, per concurrency."""
    from benchmarks.harness.indexes import make_queries

    bodies = [{"query": q, "k": args.k} for q in make_queries(args.queries)]
    rows = []
    for concurrency in args.concurrency:
        records, wall = [], 0.0
        for _ in range(args.rounds):
            block = closed_loop(args.url.rstrip("/"), bodies, concurrency)
            records += block["records"]
            wall += block["wall_s"]
        rows.append({"path": "served", "concurrency": concurrency, **summarize(records, wall)})
    print_table(COLUMNS[:6] + [("embed batch", "embed_batch_mean", ".2f")], rows, f"{args.url}, {args.queries} queries")
    return {"command": options.command(), "url": args.url, "rows": rows}


def generator(llm: str | None) -> dict:
    """The app's generator args for --llm."""
    if not llm:
        return {}
    model = "qwen2.5-coder-0.5b-instruct"
    if llm == "vllm":
        return {"generator": {"backend": "vllm", "model": model, "concurrency": 1}}
    return {"generator": {"backend": "openai", "base_url": llm, "model": model}}


def hyde(url: str, queries: list[str], k: int) -> dict:
    """mode=hyde against mode=default, query by query at c=1 (the first hyde call, the LLM's warm-up, apart)."""
    bodies = {mode: [{"query": q, "k": k, "mode": mode} for q in queries] for mode in ("default", "hyde")}
    closed_loop(url, bodies["hyde"][:1], 1)
    return {mode: summarize(**closed_loop(url, b, 1)) for mode, b in bodies.items()}


def serve_and_measure(args) -> dict:
    """Build (once) and serve the index, then c=1, every other concurrency and HyDE."""
    from benchmarks.harness import served, trees
    from benchmarks.harness.indexes import demo_index, make_queries, manifest

    layout_env = served.ingress_env(args.serve_env)
    apps = trees.trees(args.baseline_ref)
    workdir = Path(args.workdir).resolve()
    index = Path(args.index).resolve() if args.index else None
    trees.leave_the_tree(workdir)
    if index is None:
        tree = trees.index_builder(apps)
        index = demo_index(workdir, tree, args.tiny, args.baseline_ref if tree != options.ROOT else "")
    served.start_ray()
    client, port = served.start_serve()
    app_args = {"index": str(index), "request_timeout_s": 60, **generator(args.llm)}
    served.deploy(client, [served.app_config(n, tree, app_args) for n, tree in apps.items()])
    urls = served.app_urls(list(apps), args.serve_env, port)
    for url in urls.values():
        served.wait_ready(url)
    trees.check_trees(apps)
    import torch

    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)  # what a replica of one CPU runs
    engine = SearchEngine(index, threads=1)
    queries = make_queries(args.queries)
    info = manifest(index)
    report = {"command": options.command(), "baseline_ref": args.baseline_ref, "serve_env": args.serve_env,
              "serve_vars": layout_env, "index": str(index), "num_shards": info.get("num_shards"),
              "counts": info.get("counts"), "queries": len(queries), "k": args.k, "blocks": {}}
    if 1 in args.concurrency:
        report["c1"] = interleaved_c1(engine, urls, queries, args.k)
    bodies = [{"query": q, "k": args.k} for q in queries]
    for concurrency in (c for c in args.concurrency if c != 1):
        report["blocks"][str(concurrency)] = alternating_blocks(urls, bodies, concurrency, args.rounds, engine, args.k)
    if args.llm:
        report["hyde"] = hyde(urls["new"], queries[:args.hyde_queries], args.k)
    served.shutdown()
    return report


def main(argv: list[str] | None = None) -> int:
    """Parse, measure (or load a running server), print the table and write the report."""
    from benchmarks.harness.trees import BaselineError

    args = parse(argv)
    out = Path(args.out).resolve()
    if args.url:
        write_json(load_running(args), out)
        return 0
    try:
        report = serve_and_measure(args)
    except BaselineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_served(report, f"index {report['index']} ({report['num_shards']} shards, {report['counts']}), "
                 f"{report['queries']} queries, k={report['k']}, {report['serve_env']}")
    if "hyde" in report:
        modes = report["hyde"]
        print(f"HyDE p50 {modes['hyde']['p50_ms']:.0f} ms / question index p50 {modes['default']['p50_ms']:.0f} ms")
    write_json(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
