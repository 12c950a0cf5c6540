"""Filtered search: what does a metadata filter cost against the unfiltered search, in process and served,
and what recall@k does it keep, from 50% down to 0.1% of the chunks passing?

    python -m benchmarks.filtered_search [--vectors 2000000] [--shards 4] [--queries 60] [--concurrency 8]
                                         [--serve-env direct] [--out runs/filtered_search.json]
    python -m benchmarks.filtered_search --tiny          # smoke: 20,000 vectors, exact search, 6 queries

The tenant is the synthetic big tenant (harness/synthetic.py) with half of its chunks at graded distances
around the queries' own vectors (as a real query has a few close passages), built once under --workdir;
its metadata field `bucket` (0..999, each value on 1/1000 of the documents, drawn at random, so
"bucket < 10" passes 1% of the chunks wherever their vectors lie). Served by this tree's app with every
query fanned out to the ShardSearchers (`local_search_max_bytes: 0`), on one local Ray. Per selectivity
(unfiltered, 50%, 10%, 1%, 0.1%):
  - c=1: each query at every selectivity in turn, in process (`SearchEngine`) then served, so a drift in the
    machine's speed moves the filtered and unfiltered figures alike; p50, qps, the share of served pages
    ranked as in process, the smallest page;
  - recall@k of the in-process pages against exact search over the chunks that pass (every stored float32
    vector, best vector per chunk);
  - served qps at each --concurrency, closed-loop blocks of the queries, --rounds times.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import options
from benchmarks.harness.load import closed_loop, summarize
from benchmarks.harness.report import pct, print_table, write_json

SELECTIVITIES = (None, 50.0, 10.0, 1.0, 0.1)  # percent of the chunks that pass; None: unfiltered
FULL = {"vectors": 2_000_000, "shards": 4, "factory": "IVF1024,PQ32x4fs,Refine(SQfp16)", "queries": 60, "rounds": 2,
        "concurrency": [8]}
TINY = {"vectors": 20_000, "shards": 2, "factory": "Flat", "queries": 6, "rounds": 1, "concurrency": [2]}


def bucket_filter(share: float | None) -> dict | None:
    """The filter that passes `share` percent of the chunks (None: no filter)."""
    return None if share is None else {"type": "lt", "key": "bucket", "value": share * 10}


def exact_top(index: Path, vectors_dir: Path, qvecs: np.ndarray, k: int) -> dict:
    """{selectivity: per query the k best chunk ids among those that pass}, from the float32 vectors the
    synthetic index was built from (one shard's scores in memory at a time)."""
    from qrag_ray.index.format import load_manifest, read_table_file

    m = load_manifest(index)
    best: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per shard: chunk ids, buckets, (q, chunks) best
    for s in range(m.num_shards):
        rows = read_table_file(m.file(m.shard(s).meta), ["chunk_idx"]).column("chunk_idx").to_numpy()
        chunks = read_table_file(m.file(m.shard(s).chunk_table))
        keys = chunks.column("chunk_idx").to_numpy()
        ids = np.asarray(chunks.column("chunk_id").to_pylist(), dtype=object)
        bucket = chunks.column("metadata").combine_chunks().field("bucket").to_numpy()
        vecs = np.load(vectors_dir / f"{s}.npy", mmap_mode="r")
        scores = qvecs @ np.asarray(vecs).T  # rows are grouped by chunk in key order
        starts = np.searchsorted(rows, keys, "left")
        best.append((ids, bucket, np.maximum.reduceat(scores, starts, axis=1)))
    out = {}
    ids = np.concatenate([b[0] for b in best])
    scores = np.concatenate([b[2] for b in best], axis=1)
    bucket = np.concatenate([b[1] for b in best])
    for share in SELECTIVITIES:
        passing = bucket < (1000 if share is None else share * 10)
        top = np.argsort(-np.where(passing[None, :], scores, -np.inf), axis=1)[:, :k]
        out[share] = [set(ids[t].tolist()) for t in top]
    return out


def run_filtered(engine, url: str, queries: list[str], k: int, truth: dict, concurrency: list[int],
                 rounds: int) -> dict:
    """Per selectivity: in-process and served p50 / qps at c=1, served qps at each concurrency, the share
    of served pages ranked as in process, recall@k against `truth` (exact_top)."""
    import httpx

    client = httpx.Client(base_url=url, timeout=600)
    bodies = {sel: {} if bucket_filter(sel) is None else {"filter": bucket_filter(sel)} for sel in SELECTIVITIES}
    for sel in SELECTIVITIES:  # warm both paths at every selectivity
        for query in queries[:3]:
            engine.search([query], k=k, filter=bucket_filter(sel))
            client.post("/v1/search", json={"query": query, "k": k, **bodies[sel]})
    local, served, same, recall, sizes = ({sel: [] for sel in SELECTIVITIES} for _ in range(5))
    for number, query in enumerate(queries):
        for sel in SELECTIVITIES:
            start = time.perf_counter()
            want = [x["chunk_id"] for x in engine.search([query], k=k, filter=bucket_filter(sel))[0]]
            local[sel].append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            response = client.post("/v1/search", json={"query": query, "k": k, **bodies[sel]})
            served[sel].append((time.perf_counter() - start) * 1000)
            got = ([x["chunk_id"] for x in (response.json().get("results") or [])] if response.status_code == 200
                   else None)
            same[sel].append(got == want)
            sizes[sel].append(len(want))
            recall[sel].append(len(set(want) & truth[sel][number]) / k)
    client.close()
    out = {}
    for sel in SELECTIVITIES:
        loaded = {}
        for clients in concurrency:
            records, wall = [], 0.0
            for _ in range(rounds):
                block = closed_loop(url, [{"query": q, "k": k, **bodies[sel]} for q in queries], clients)
                records += block["records"]
                wall += block["wall_s"]
            loaded[str(clients)] = summarize(records, wall)
        loc, srv = local[sel], served[sel]
        out["unfiltered" if sel is None else f"{sel:g}%"] = {
            "in_process": {"p50_ms": pct(loc, 50), "p99_ms": pct(loc, 99), "qps": 1000 / statistics.mean(loc)},
            "served": {"p50_ms": pct(srv, 50), "p99_ms": pct(srv, 99), "qps": 1000 / statistics.mean(srv)},
            "served_blocks": loaded, "same_ranking": statistics.mean(same[sel]),
            "recall_at_k": statistics.mean(recall[sel]), "min_page": min(sizes[sel])}
    base = out["unfiltered"]
    for row in out.values():
        row["p50_over_unfiltered"] = {p: row[p]["p50_ms"] / base[p]["p50_ms"] for p in ("in_process", "served")}
    return out


def measure(args) -> dict:
    """Build (once) and serve the tenant, then every selectivity."""
    from benchmarks.harness import served, trees
    from benchmarks.harness.indexes import make_queries
    from benchmarks.harness.synthetic import big_tenant

    layout_env = served.ingress_env(args.serve_env)
    workdir = Path(args.workdir).resolve()
    trees.leave_the_tree(workdir)
    index = big_tenant(workdir, args.vectors, args.shards, 8, args.factory, args.nprobe, topics=True)
    served.start_ray()
    client, port = served.start_serve()
    served.deploy(client, [served.app_config("new", options.ROOT, {"index": str(index), "local_search_max_bytes": 0,
                                                                 "request_timeout_s": 60})])
    url = served.app_urls(["new"], args.serve_env, port)["new"]
    served.wait_ready(url)
    import torch

    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)  # one CPU, like a replica
    engine = SearchEngine(index, threads=1)
    queries = make_queries(args.queries)
    truth = exact_top(index, index.with_name(index.name + ".vectors"), engine.embed(queries), args.k)
    report = {"command": options.command(), "index": str(index), "vectors": args.vectors, "shards": args.shards,
              "factory": args.factory, "nprobe": args.nprobe, "serve_env": args.serve_env, "serve_vars": layout_env,
              "queries": len(queries), "k": args.k,
              "selectivities": run_filtered(engine, url, queries, args.k, truth, args.concurrency, args.rounds)}
    served.shutdown()
    return report


def main(argv: list[str] | None = None) -> int:
    """Parse, measure, print the table and write the report."""
    from benchmarks.harness.served import LAYOUT_HELP, LAYOUTS

    parser = options.parser(__doc__)
    options.add_common(parser, "filtered_search", queries=True, rounds=True, concurrency=True, workdir=True)
    parser.add_argument("--vectors", type=int)
    parser.add_argument("--shards", type=int)
    parser.add_argument("--factory", help="FAISS factory (full: IVF1024,PQ32x4fs,Refine(SQfp16); tiny: Flat)")
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--serve-env", choices=LAYOUTS, default="direct", help=LAYOUT_HELP)
    args = options.sized(parser.parse_args(argv), FULL, TINY)
    out = Path(args.out).resolve()
    report = measure(args)
    rows = []
    for name, r in report["selectivities"].items():
        blocks = {f"qps_c{c}": b["qps"] for c, b in r["served_blocks"].items()}
        rows.append({"passes": name, "in_p50": r["in_process"]["p50_ms"],
                     "in_x": r["p50_over_unfiltered"]["in_process"], "sv_p50": r["served"]["p50_ms"],
                     "sv_x": r["p50_over_unfiltered"]["served"], **blocks,
                     "recall": r["recall_at_k"], "same": r["same_ranking"], "min_page": r["min_page"]})
    columns = [("passes", "passes", ""), ("in-proc p50", "in_p50", ".1f"), ("x unfiltered", "in_x", ".2f"),
               ("served p50", "sv_p50", ".1f"), ("x unfiltered", "sv_x", ".2f")]
    columns += [(f"qps c={c}", f"qps_c{c}", ".1f") for c in args.concurrency]
    columns += [(f"recall@{args.k}", "recall", ".3f"), ("same ranking", "same", ".0%"), ("min page", "min_page", "d")]
    print_table(columns, rows, f"filtered search (bucket < x) on {report['vectors']:,} vectors in {args.shards} shards "
                f"({args.factory}), {report['queries']} queries, k={args.k}, {args.serve_env}")
    write_json(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
