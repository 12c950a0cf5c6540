"""In-process search over all shards: embed, search each shard until its own top k is final, merge once.

`qrag search` and `qrag eval` use this directly; the Serve app runs the same pieces
(`search_shard_exact` in each shard replica, `merge_hits` in the router), so results are identical.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from qrag_ray.errors import QragError
from qrag_ray.index.format import CHUNKS, Manifest, load_manifest, verify_files
from qrag_ray.index.searcher import ShardHits, ShardSearcher
from qrag_ray.search.merge import ChunkResult, FusionPolicy, merge_hits

MAX_K = 1000
# A hybrid query's first round asks each shard for at least this many vectors and BM25 hits. A chunk
# one list missed is scored at that list's floor, so with k x M (20-40) hits per list a chunk that is
# 2nd in BM25 but 60th by cosine gets the dense floor of a short list and sinks; 100 deep, the real
# path matches the deep re-ranking grid of docs/EVALUATION.md (suite quick slice, default: DL19 71.7 -> 74.2
# nDCG@10, mean 75.2 -> 76.3).
HYBRID_MIN_DEPTH = 100


def initial_multiplier(manifest: Manifest) -> int:
    """Vectors to ask per wanted chunk: about twice the mean vectors per chunk."""
    counts = manifest.data.get("counts", {})
    vpc = counts.get("vectors", 1) / max(1, counts.get("chunks", 1))
    return max(2, math.ceil(2 * vpc))


class ChunkTable:
    """chunk_idx -> (chunk_id, doc_id, title, text), loaded once from chunks.parquet."""

    def __init__(self, manifest: Manifest, verify: bool = True):
        if verify:
            verify_files(manifest, [CHUNKS])
        t = pq.read_table(manifest.file(CHUNKS), columns=["chunk_idx", "chunk_id", "doc_id", "title", "text"])
        self.idx = t.column("chunk_idx").to_numpy()
        order = np.argsort(self.idx)
        self.idx = self.idx[order]
        self.cols = {c: [t.column(c)[int(i)].as_py() for i in order] for c in ("chunk_id", "doc_id", "title", "text")}

    def __len__(self) -> int:
        return len(self.idx)

    def get(self, chunk_idx: int) -> dict:
        pos = int(np.searchsorted(self.idx, chunk_idx))
        if pos >= len(self.idx) or self.idx[pos] != chunk_idx:
            raise KeyError(chunk_idx)
        return {c: self.cols[c][pos] for c in self.cols}


def validate_k(k: int) -> int:
    if not isinstance(k, int) or k < 1 or k > MAX_K:
        raise QragError(f"k must be between 1 and {MAX_K}, got {k}")
    return k


def format_results(results: list[ChunkResult], chunks: ChunkTable, matched_of) -> list[dict]:
    """Result dicts (docs/ARCHITECTURE.md); matched_of(shard, row) -> (kind, text)."""
    out = []
    for r in results:
        meta = chunks.get(r.chunk_idx)
        matched = []
        for shard, row, score in r.matches:
            kind, text = matched_of(shard, row)
            matched.append({"kind": kind, "text": text, "score": round(float(score), 6)})
        res = {"chunk_id": meta["chunk_id"], "doc_id": meta["doc_id"], "title": meta["title"],
               "score": round(float(r.score), 6), "text": meta["text"], "matched": matched}
        if r.lexical is not None:
            res["bm25"] = round(float(r.lexical), 6)
        if r.cosine is not None:
            res["cosine"] = round(float(r.cosine), 6)
        out.append(res)
    return out


@dataclass
class SearchTimings:
    embed_ms: float = 0.0
    search_ms: float = 0.0
    merge_ms: float = 0.0
    rounds: int = 0


def check_hybrid(policy: FusionPolicy, manifest: Manifest) -> None:
    """Hybrid search needs the BM25 files; shared by the engine and the Serve router."""
    if policy.bm25_alpha is not None and not manifest.has_bm25:
        raise QragError(f"hybrid search (search.bm25_alpha) needs a BM25 index, and {manifest.path} has none: "
                        "re-index with bm25.enabled")


def search_shard_exact(searcher: ShardSearcher, qvecs: np.ndarray, k: int, multiplier: int,
                       min_score: float | None, policy: FusionPolicy,
                       queries: list[str] | None = None) -> tuple[list[ShardHits], int]:
    """One shard's hits per query, each deep enough that the shard's own top k distinct chunks are
    final (widening x4 while `needs_more` says a deeper list could change them).

    Every vector of a chunk lives in one shard, so the global top k chunks are among the shards'
    local top k: the caller merges once, with no further rounds across shards or processes. The
    in-process engine and the Serve shard replicas both call this, so they rank identically."""
    total = searcher.ntotal
    use_text = policy.bm25_alpha is not None and queries is not None
    out: list[ShardHits | None] = [None] * len(qvecs)
    todo = np.arange(len(qvecs))
    m, rounds = multiplier, 0
    if use_text:
        m = max(m, -(-HYBRID_MIN_DEPTH // k))
    while len(todo):
        rounds += 1
        hits = searcher.search(qvecs[todo], k * m, [queries[i] for i in todo] if use_text else None)
        again = []
        for j, qi in enumerate(todo):
            one = hits.row(j)
            if k * m < total and merge_hits([one], 0, k, min_score, policy)[1]:
                again.append(qi)
            else:
                out[qi] = one
        todo = np.asarray(again, dtype=np.int64)
        m *= 4
    return out, rounds  # type: ignore[return-value]


class SearchEngine:
    def __init__(self, index_dir: str | Path, verify: bool = True, embedder=None, threads: int | None = None,
                 policy: FusionPolicy | None = None):
        self.manifest = load_manifest(index_dir)
        self.shards = [ShardSearcher(index_dir, i, self.manifest, verify=verify, threads=threads)
                       for i in range(self.manifest.num_shards)]
        self.chunks = ChunkTable(self.manifest, verify=verify)
        self._embedder = embedder
        self.multiplier = initial_multiplier(self.manifest)
        self.policy = policy or FusionPolicy.from_manifest(self.manifest)
        check_hybrid(self.policy, self.manifest)
        self.last_timings = SearchTimings()

    @property
    def embedder(self):
        if self._embedder is None:
            from qrag_ray.embedding import load_sentence_transformer

            self._embedder = load_sentence_transformer(self.manifest.embedder_model)
        return self._embedder

    def embed(self, queries: list[str]) -> np.ndarray:
        from qrag_ray.embedding import encode

        return encode(self.embedder, queries)

    def search_vectors(self, qvecs: np.ndarray, k: int, min_score: float | None = None,
                       queries: list[str] | None = None) -> list[list[ChunkResult]]:
        """Top k chunks per query vector; hybrid search (policy.bm25_alpha) also needs the query texts."""
        validate_k(k)
        if self.policy.bm25_alpha is not None and queries is None:
            raise QragError("hybrid search (bm25_alpha) needs the query texts, not only their vectors")
        t = self.last_timings
        t0 = time.perf_counter()
        per_shard = []
        for s in self.shards:
            hits, rounds = search_shard_exact(s, qvecs, k, self.multiplier, min_score, self.policy, queries)
            per_shard.append(hits)
            t.rounds = max(t.rounds, rounds)
        t1 = time.perf_counter()
        out = [merge_hits([hs[qi] for hs in per_shard], 0, k, min_score, self.policy)[0] for qi in range(len(qvecs))]
        t.search_ms += (t1 - t0) * 1000
        t.merge_ms += (time.perf_counter() - t1) * 1000
        return out

    def search(self, queries: list[str], k: int = 10, min_score: float | None = None) -> list[list[dict]]:
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise QragError("query must be a non-empty string")
        self.last_timings = SearchTimings()
        t0 = time.perf_counter()
        qvecs = self.embed(queries)
        self.last_timings.embed_ms = (time.perf_counter() - t0) * 1000
        results = self.search_vectors(qvecs, k, min_score, queries)
        matched_of = lambda shard, row: self.shards[shard].matched(row)  # noqa: E731
        return [format_results(r, self.chunks, matched_of) for r in results]
