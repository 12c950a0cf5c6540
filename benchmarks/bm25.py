"""What does hybrid search's per-shard BM25 channel add to a query, next to the dense search it rides
along with?

Why synthetic text: the cost of BM25 scoring depends on corpus size, document length and the
term-frequency distribution (posting-list lengths), not on meaning. Documents and queries draw words
from a Zipf distribution over a fixed vocabulary (natural text is close to Zipf), ~60 words per
passage as in MS MARCO, 6-word queries. The dense baseline in the same run is a FAISS Flat inner-product
search over the same number of 384-d vectors (the MiniLM size) — the shard's existing cost, so the
reported ratio is "how much slower a hybrid query is than a dense one" per shard.

Measured through the code the index uses: qrag_ray.index.lexical.build_bm25 / ShardLexicon.search
(bm25s, memory-mapped), k = 100 chunks per shard (k x M over-retrieval).

    python -m benchmarks.bm25 --docs 100000 300000 --out runs/bench-bm25.json
    python -m benchmarks.bm25 --tiny             # smoke: 2,000 documents, seconds
"""

from __future__ import annotations

import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import options
from benchmarks.harness.report import print_table, write_json

FULL = {"docs": [100_000], "queries": 200, "vocab": 100_000}
TINY = {"docs": [2_000], "queries": 20, "vocab": 5_000}


def zipf_texts(n: int, length: int, vocab: list[str], rng: np.random.Generator,
               exponent: float = 1.1) -> list[str]:
    """`n` texts of `length` words drawn by Zipf(`exponent`) rank from `vocab`."""
    ids = (rng.zipf(exponent, size=(n, length)) - 1) % len(vocab)
    return [" ".join(vocab[i] for i in row) for row in ids]


def make_vocab(size: int, rng: np.random.Generator) -> list[str]:
    """`size` distinct random lowercase words, sorted."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = {"".join(rng.choice(letters, size=rng.integers(3, 10))) for _ in range(size * 2)}
    return sorted(words)[:size]


def dir_bytes(p: Path) -> int:
    """The bytes of the files under `p`."""
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def bench(n: int, queries: list[str], vocab: list[str], k: int, dim: int, seed: int) -> dict:
    """One shard size: BM25 build and query cost through the index's own code, and a Flat dense search of as
    many vectors."""
    import faiss

    from qrag_ray.index.lexical import ShardLexicon, build_bm25

    rng = np.random.default_rng([seed, n])
    docs = zipf_texts(n, 60, vocab, rng)
    tmp = Path(tempfile.mkdtemp(prefix="bench-bm25-"))
    try:
        t0 = time.perf_counter()
        build_bm25(np.arange(n, dtype=np.int64), docs, tmp / "s.bm25", k1=1.5, b=0.75)
        build_s = time.perf_counter() - t0
        disk = dir_bytes(tmp / "s.bm25")
        lex = ShardLexicon(tmp / "s.bm25")
        lex.search(queries[:5], k)  # warm the memory maps
        t0 = time.perf_counter()
        for q in queries:
            lex.search([q], k)
        bm25_ms = (time.perf_counter() - t0) * 1000 / len(queries)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    del docs
    vecs = rng.standard_normal((n, dim), dtype=np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(dim)
    index.add(vecs)
    qv = rng.standard_normal((len(queries), dim), dtype=np.float32)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    index.search(qv[:5], k)
    t0 = time.perf_counter()
    for i in range(len(qv)):
        index.search(qv[i:i + 1], k)
    dense_ms = (time.perf_counter() - t0) * 1000 / len(qv)
    return {"docs": n, "bm25_build_s": round(build_s, 2), "bm25_docs_per_s": round(n / build_s),
            "bm25_bytes_per_doc": round(disk / n, 1), "bm25_query_ms": round(bm25_ms, 3),
            "dense_flat_query_ms": round(dense_ms, 3), "hybrid_over_dense": round((bm25_ms + dense_ms) / dense_ms, 3)}


def main(argv: list[str] | None = None) -> int:
    """Parse, measure every shard size, print the table and write the report."""
    parser = options.parser(__doc__)
    options.add_common(parser, "bm25", queries=True)
    parser.add_argument("--docs", type=int, nargs="+", help="shard sizes (BM25 documents = chunks; full 100000)")
    parser.add_argument("--vocab", type=int, help="words in the vocabulary (full 100000)")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--threads", type=int, default=1, help="FAISS threads (BM25 scoring is single-threaded)")
    parser.add_argument("--seed", type=int, default=0)
    args = options.sized(parser.parse_args(argv), FULL, TINY)

    import faiss

    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    vocab = make_vocab(args.vocab, rng)
    queries = zipf_texts(args.queries, 6, vocab, rng)
    rows = [bench(n, queries, vocab, args.k, args.dim, args.seed) for n in args.docs]
    print_table([(c, c, "") for c in rows[0]], rows, f"BM25 and dense (Flat, {args.dim}-d) per shard, k={args.k}, "
                f"{args.queries} queries")
    write_json({"command": options.command(), "args": vars(args), "machine": platform.platform(), "rows": rows},
               args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
