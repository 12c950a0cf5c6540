"""How large an index does one small box build, hold and search, at what recall and speed? A sharded IVF-PQ
index of >= 10M vectors, against exact search in the same run.

Why synthetic vectors: the systems question (memory per shard, build time, QPS, recall of compressed
search + refinement vs exact) does not depend on what the vectors mean, and 10M real MiniLM vectors
would take days to embed on 2 CPU cores. The vectors are clustered (Gaussian blobs around random
centres, L2-normalised, inner product = cosine) so that IVF has structure to exploit, as real
embeddings do, and so that within-cluster ranking is hard for PQ alone (refinement has work to do).

Memory discipline: vectors are generated chunk by chunk from a seeded RNG (chunk i is reproducible on
its own) and never held all at once; each chunk is added to its shard's index and scanned exactly
for the ground truth in the same pass. The coarse quantizer and PQ codebooks are trained once on a
sample and cloned into every shard (the production pattern: shards share codebooks so per-shard
scores are comparable when merged).

Baseline in the same run: exact search (FAISS flat inner product, brute force over every chunk) —
its QPS and its memory (fp32 flat) are the denominators of the reported ratios.

    python -m benchmarks.search_scale --n 10000000 --dim 64 --shards 4 --out runs/bench-scale.json
    python -m benchmarks.search_scale --n 200000 --shards 2 --nlist 256 --queries 200
    python -m benchmarks.search_scale --tiny          # smoke: 20,000 vectors, seconds
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import options
from benchmarks.harness.report import write_json

FULL = {"n": 10_000_000, "nlist": 2048, "train": 100_000, "chunk": 500_000, "queries": 200, "single_queries": 100,
        "k_factor": "1,16,64"}
TINY = {"n": 20_000, "nlist": 64, "train": 2_000, "chunk": 10_000, "queries": 50, "single_queries": 20,
        "k_factor": "1,16"}


def rss_mb() -> float:
    """Current resident set size (not the peak): what the process holds right now."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """The process's peak resident set size so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Synth:
    """Clustered unit vectors; chunk `i` depends only on (seed, i), so any chunk can be regenerated."""

    def __init__(self, dim: int, centres: int, spread: float, seed: int):
        self.dim, self.spread, self.seed = dim, spread, seed
        self.centres = np.random.default_rng([seed, 0]).standard_normal((centres, dim)).astype(np.float32)

    def chunk(self, i: int, n: int, stream: int = 1) -> np.ndarray:
        """Chunk `i` of stream `stream`: `n` unit vectors around the centres."""
        rng = np.random.default_rng([self.seed, stream, i])
        c = rng.integers(0, len(self.centres), size=n)
        x = self.centres[c] + self.spread * rng.standard_normal((n, self.dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x


def merge_topk(scores: list[np.ndarray], ids: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k over per-shard result lists (higher score = better; id -1 = empty slot)."""
    s = np.concatenate(scores, axis=1)
    i = np.concatenate(ids, axis=1)
    s = np.where(i >= 0, s, -np.inf)
    part = np.argpartition(-s, min(k, s.shape[1] - 1), axis=1)[:, :k]
    ps = np.take_along_axis(s, part, 1)
    order = np.argsort(-ps, axis=1, kind="stable")
    part = np.take_along_axis(part, order, 1)
    return np.take_along_axis(s, part, 1), np.take_along_axis(i, part, 1)


def recall_at(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean |found[:k] ∩ truth[:k]| / k (the usual ANN recall@k against exact top-k)."""
    hits = [len(set(f[:k].tolist()) & set(t[:k].tolist())) for f, t in zip(found, truth, strict=True)]
    return float(np.mean(hits)) / k


def set_search_params(index, nprobe: int, k_factor: float) -> None:
    """nprobe of the IVF inside `index` and the refinement's k_factor where it has one."""
    import faiss

    faiss.extract_index_ivf(index).nprobe = nprobe
    if hasattr(index, "k_factor"):
        index.k_factor = k_factor


def run(args: argparse.Namespace) -> dict:
    """Train once, add every shard with the exact top k beside it, then search at every nprobe and k_factor."""
    import faiss

    faiss.omp_set_num_threads(args.threads)
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    (work / "shards").mkdir(parents=True)
    syn = Synth(args.dim, args.centres, args.spread, args.seed)
    per_shard = args.n // args.shards
    n = per_shard * args.shards
    chunks_per_shard = max(1, -(-per_shard // args.chunk))
    k = args.k
    queries = syn.chunk(0, args.queries, stream=2)  # a stream disjoint from the database
    t_all = time.perf_counter()
    rss0 = rss_mb()

    # ---- train once (coarse quantizer + PQ + refine codec), shared by all shards
    t0 = time.perf_counter()
    train = syn.chunk(0, min(args.train, n), stream=3)
    template = faiss.index_factory(args.dim, args.factory, faiss.METRIC_INNER_PRODUCT)
    template.train(train)
    train_s = time.perf_counter() - t0
    del train
    print(f"trained {args.factory} on {min(args.train, n):,} vectors in {train_s:.1f}s", file=sys.stderr)

    # ---- one pass over the data: add to the shard, exact-scan for ground truth
    gt_s = np.full((args.queries, k), -np.inf, np.float32)
    gt_i = np.full((args.queries, k), -1, np.int64)
    exact_s = 0.0
    gen_s = 0.0
    shards = []
    for s in range(args.shards):
        t_shard = time.perf_counter()
        add_s = 0.0
        index = faiss.clone_index(template)
        rss_before = rss_mb()
        base = s * per_shard
        for c in range(chunks_per_shard):
            lo = c * args.chunk
            m = min(args.chunk, per_shard - lo)
            if m <= 0:
                break
            t = time.perf_counter()
            x = syn.chunk(s * chunks_per_shard + c, m)
            gen_s += time.perf_counter() - t
            t = time.perf_counter()
            index.add(x)
            add_s += time.perf_counter() - t
            t = time.perf_counter()
            flat = faiss.IndexFlatIP(args.dim)
            flat.add(x)
            ds, di = flat.search(queries, k)
            gt_s, gt_i = merge_topk([gt_s, ds], [gt_i, np.where(di >= 0, di + base + lo, -1)], k)
            exact_s += time.perf_counter() - t
            del x, flat
        path = work / "shards" / f"{s:05d}.faiss"
        faiss.write_index(index, str(path))
        shards.append({"shard": s, "vectors": int(index.ntotal), "add_seconds": round(add_s, 2),
                       "seconds": round(time.perf_counter() - t_shard, 2),
                       "file_bytes": path.stat().st_size,
                       "rss_growth_mb": round(rss_mb() - rss_before, 1)})
        print(f"shard {s}: {index.ntotal:,} vectors, add {add_s:.1f}s, {path.stat().st_size / 2**20:.0f} MiB",
              file=sys.stderr)
        del index
    build_s = train_s + sum(x["add_seconds"] for x in shards)

    # ---- search: load every shard (as a serving node would), sweep nprobe x refine factor
    t = time.perf_counter()
    loaded = [faiss.read_index(str(work / "shards" / f"{s:05d}.faiss")) for s in range(args.shards)]
    load_s = time.perf_counter() - t
    rss_loaded = rss_mb()
    offsets = [s * per_shard for s in range(args.shards)]

    def search_all(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every loaded shard searched, the per-shard top k merged."""
        ss, ii = [], []
        for off, ix in zip(offsets, loaded, strict=True):
            d, i = ix.search(q, k)
            ss.append(d)
            ii.append(np.where(i >= 0, i + off, -1))
        return merge_topk(ss, ii, k)

    rows = []  # k_factor 1 = PQ ranking alone (no refinement): the ablation
    for nprobe in args.nprobe:
        for kf in args.k_factor:
            for ix in loaded:
                set_search_params(ix, nprobe, kf)
            t = time.perf_counter()
            _, found = search_all(queries)
            batch_s = time.perf_counter() - t
            # one query at a time: what a serving replica sees without batching
            nq1 = min(args.single_queries, args.queries)
            t = time.perf_counter()
            for j in range(nq1):
                search_all(queries[j:j + 1])
            single_s = time.perf_counter() - t
            rows.append({"nprobe": nprobe, "k_factor": kf, "recall@10": round(recall_at(found, gt_i, k), 4),
                         "recall@1": round(recall_at(found, gt_i, 1), 4),
                         "qps_batch": round(args.queries / batch_s, 1), "qps_single": round(nq1 / single_s, 1),
                         "latency_ms_single": round(1000 * single_s / nq1, 2)})
            print(f"nprobe={nprobe} k_factor={kf}: recall@10={rows[-1]['recall@10']:.3f} "
                  f"qps(batch)={rows[-1]['qps_batch']:.0f} qps(single)={rows[-1]['qps_single']:.0f}", file=sys.stderr)

    exact_qps = args.queries / exact_s  # brute force over all n vectors (time excludes data generation)
    total_bytes = sum(x["file_bytes"] for x in shards)
    flat_bytes = n * args.dim * 4
    result = {
        "benchmark": "scale", "n": n, "dim": args.dim, "shards": args.shards, "factory": args.factory, "k": k,
        "queries": args.queries, "train_vectors": min(args.train, n), "centres": args.centres, "spread": args.spread,
        "threads": args.threads, "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "train_seconds": round(train_s, 1), "add_seconds": round(sum(x["add_seconds"] for x in shards), 1),
        "build_seconds": round(build_s, 1), "generate_seconds": round(gen_s, 1), "load_seconds": round(load_s, 1),
        "shard_detail": shards,
        "memory": {"index_bytes_total": total_bytes, "bytes_per_vector": round(total_bytes / n, 1),
                   "index_mib_per_shard": round(total_bytes / args.shards / 2**20, 1),
                   "flat_fp32_bytes": flat_bytes, "compression_vs_flat": round(flat_bytes / total_bytes, 2),
                   "rss_mib_all_shards_loaded": round(rss_loaded - rss0, 1), "peak_rss_mib": round(peak_rss_mb(), 1)},
        "exact_baseline": {"seconds": round(exact_s, 1), "qps": round(exact_qps, 2)},
        "search": [r | {"speedup_vs_exact": round(r["qps_batch"] / exact_qps, 1)} for r in rows],
        "total_seconds": round(time.perf_counter() - t_all, 1),
        "command": options.command(),
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def print_table(r: dict) -> None:
    """The result as printed."""
    m = r["memory"]
    print(f"\n{r['n']:,} vectors x {r['dim']}d, {r['shards']} shards, {r['factory']}  (k={r['k']}, "
          f"{r['queries']} queries, {r['threads']} threads)")
    print(f"build: train {r['train_seconds']}s + add {r['add_seconds']}s = {r['build_seconds']}s   "
          f"(data generation {r['generate_seconds']}s not counted)")
    print(f"memory: {m['index_mib_per_shard']} MiB per shard, {m['bytes_per_vector']} B/vector, "
          f"{m['compression_vs_flat']}x smaller than flat fp32; RSS with all shards loaded "
          f"{m['rss_mib_all_shards_loaded']} MiB")
    print(f"exact baseline: {r['exact_baseline']['qps']} QPS (brute force over all vectors, batched)")
    hdr = ("nprobe", "k_factor", "recall@10", "recall@1", "qps_batch", "qps_single", "latency_ms_single",
           "speedup_vs_exact")
    print(" | ".join(f"{h:>17}" for h in hdr))
    for row in r["search"]:
        print(" | ".join(f"{row[h]!s:>17}" for h in hdr))


def main(argv: list[str] | None = None) -> int:
    """Parse, run, print and write the report."""
    parser = options.parser(__doc__)
    options.add_common(parser, "search_scale", queries=True)
    parser.add_argument("--n", type=int, help="vectors (full: 10,000,000)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--nlist", type=int, help="IVF lists (used when --factory is not given; full 2048)")
    parser.add_argument("--factory", default=None,
                        help="FAISS factory (default IVF{nlist},PQ{dim/2}x4fs,Refine(SQfp16))")
    parser.add_argument("--train", type=int, help="training sample (full 100,000)")
    parser.add_argument("--chunk", type=int, help="vectors generated and added at a time (full 500,000)")
    parser.add_argument("--single-queries", type=int, help="queries searched one at a time (full 100)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--nprobe", default="16")
    parser.add_argument("--k-factor", help="refinement factors, comma list (full 1,16,64; 1 = PQ ranking alone)")
    parser.add_argument("--centres", type=int, default=2000)
    parser.add_argument("--spread", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--work-dir", default="/tmp/qrag-bench-scale")
    parser.add_argument("--keep", action="store_true", help="keep the shard files in --work-dir")
    args = options.sized(parser.parse_args(argv), FULL, TINY)
    args.nprobe = [int(x) for x in str(args.nprobe).split(",")]
    args.k_factor = [float(x) for x in str(args.k_factor).split(",")]
    args.factory = args.factory or f"IVF{args.nlist},PQ{args.dim // 2}x4fs,Refine(SQfp16)"
    result = run(args)
    print_table(result)
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
