"""A ShardSearcher's own work without Serve, in one process: CPU per query of a shard group's search and of
its reply (what a replica runs per call), and FAISS's OpenMP threads on a quiet and on a busy box.

    python benchmarks/bench_shard_threads.py                          # the tree's qrag_ray
    PYTHONPATH=runs/bench-baseline-HEAD python benchmarks/bench_shard_threads.py --out runs/bst_base.json
    # runs/bench-baseline-HEAD: the worktree bench_big_tenant.py --baseline-ref HEAD made (git worktree add)

The index is bench_big_tenant.py's synthetic tenant (2M vectors, 4 shards, IVF-PQ with fp16 refinement;
built there once and reused from its --workdir), the queries its queries embedded by its tiny model.
  - group: for batches of B query vectors, in this thread, `search_hits` over the 4 shards (a replica's
    searches, FAISS with one thread) and `group_pages` (its reply: the page's hits and metadata), CPU ms
    per query; the in-process `SearchEngine.search_vectors` of the same batches beside them;
  - threads: one shard's FAISS search (k = 10 x the shard's multiplier, what a k=10 query asks) with 1 and
    2 OpenMP threads, batches of 1 and 10, wall and CPU ms per query, on a quiet box and while another
    process keeps one core busy (a replica's neighbour).
With PYTHONPATH set to a worktree of another commit, that commit's qrag_ray is measured (it prints which).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serving import make_queries  # noqa: E402


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def cpu_ms_per_query(run, n: int) -> float:
    c = time.process_time()
    run()
    return 1000 * (time.process_time() - c) / n


def group_table(engine, vecs, batches: list[int]) -> list[dict]:
    from qrag_ray.search.query import Query
    from qrag_ray.search.shard_search import group_pages, search_hits

    q = Query(10, None, engine.policy, None, None)
    rows = []
    for b in batches:
        blocks = [vecs[i:i + b] for i in range(0, len(vecs), b)]
        shards = list(enumerate(engine.shards))
        found = [[search_hits(ls, s, v, q, True) for s, ls in shards] for v in blocks]
        rows.append({
            "batch": b,
            "search_ms": cpu_ms_per_query(lambda: [[search_hits(ls, s, v, q, True) for s, ls in shards]
                                                   for v in blocks], len(vecs)),
            "reply_ms": cpu_ms_per_query(lambda: [group_pages(engine.shards, f, q) for f in found], len(vecs)),
            "in_process_ms": cpu_ms_per_query(lambda: [engine.search_vectors(v, 10) for v in blocks], len(vecs))})
    return rows


def thread_table(engine, vecs) -> list[dict]:
    ls = engine.shards[0]
    k = 10 * ls.multiplier
    rows = []
    for busy in (False, True):
        stop = multiprocessing.Event()
        spinner = multiprocessing.Process(target=_spin, args=(stop,)) if busy else None
        if spinner:
            spinner.start()
        try:
            for b in (1, 10):
                for threads in (1, 2):
                    ls.index.threads = threads
                    t0, c0 = time.perf_counter(), time.process_time()
                    for i in range(0, len(vecs), b):
                        ls.index.search(vecs[i:i + b], k)
                    rows.append({"busy_core": busy, "batch": b, "omp_threads": threads,
                                 "wall_ms": 1000 * (time.perf_counter() - t0) / len(vecs),
                                 "cpu_ms": 1000 * (time.process_time() - c0) / len(vecs)})
        finally:
            if spinner:
                stop.set()
                spinner.join()
    ls.index.threads = 1
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=640)
    ap.add_argument("--batches", default="1,10,32")
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "bench_big_tenant"))
    ap.add_argument("--index", default="index-2000000-4-IVF1024_PQ32x4fs_Refine(SQfp16)-meta",
                    help="a bench_big_tenant.py index under --workdir (run that script once to build it)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_shard_threads.json"))
    a = ap.parse_args()
    import torch

    import qrag_ray
    from qrag_ray.search.engine import SearchEngine

    torch.set_num_threads(1)
    index = Path(a.workdir) / a.index
    if not (index / "manifest.json").is_file():
        sys.exit(f"no index at {index}: run benchmarks/bench_big_tenant.py once to build it")
    engine = SearchEngine(index, threads=1)
    vecs = engine.embed(make_queries(a.queries))
    engine.search_vectors(vecs[:10], 10)  # first-touch of the shards' pages is not a cost of any batch
    report = {"qrag_ray": str(Path(qrag_ray.__file__).parent), "index": str(index), "queries": a.queries,
              "group": group_table(engine, vecs, [int(b) for b in a.batches.split(",")]),
              "threads": thread_table(engine, vecs)}
    print(f"qrag_ray from {report['qrag_ray']}; {engine.manifest.counts.vectors:,} vectors in "
          f"{len(engine.shards)} shards, {a.queries} queries; CPU ms per query, one thread")
    print(f"{'batch':>5s} {'4 shards search_hits':>20s} {'group_pages':>11s} {'in-process search':>17s}")
    for r in report["group"]:
        print(f"{r['batch']:5d} {r['search_ms']:20.3f} {r['reply_ms']:11.3f} {r['in_process_ms']:17.3f}")
    print("one shard's FAISS search, ms per query")
    print(f"{'other core':>10s} {'batch':>5s} {'threads':>7s} {'wall':>7s} {'CPU':>7s}")
    for r in report["threads"]:
        print(f"{'busy' if r['busy_core'] else 'idle':>10s} {r['batch']:5d} {r['omp_threads']:7d} "
              f"{r['wall_ms']:7.3f} {r['cpu_ms']:7.3f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
