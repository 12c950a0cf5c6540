"""In-process search over all shards (`qrag search`, `qrag eval`) through the `search_shard_exact` and
`merge_hits` the Serve app runs, so served and in-process results are identical."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from qrag_ray.embedding import encode, load_sentence_transformer
from qrag_ray.errors import QragError
from qrag_ray.index.format import CHUNKS, Manifest, load_manifest, verify_files
from qrag_ray.index.searcher import ShardSearcher
from qrag_ray.search.merge import ChunkResult, FusionPolicy, merge_hits
from qrag_ray.search.shard_search import check_hybrid, format_results, initial_multiplier, search_shard_exact

MAX_K = 1000


def validate_k(k: int) -> int:
    if not isinstance(k, int) or k < 1 or k > MAX_K:
        raise QragError(f"k must be between 1 and {MAX_K}, got {k}")
    return k


class ChunkTable:
    """chunk_idx -> (chunk_id, doc_id, title, text), loaded once from chunks.parquet."""

    def __init__(self, manifest: Manifest, verify: bool = True):
        if verify:
            verify_files(manifest, [CHUNKS])
        cols = ["chunk_idx", "chunk_id", "doc_id", "title", "text"]
        t = pq.read_table(manifest.file(CHUNKS), columns=cols).sort_by("chunk_idx")
        self.idx = t.column("chunk_idx").to_numpy()
        self.cols = {c: t.column(c).to_pylist() for c in cols[1:]}

    def get(self, chunk_idx: int) -> dict:
        pos = int(np.searchsorted(self.idx, chunk_idx))
        if pos >= len(self.idx) or self.idx[pos] != chunk_idx:
            raise KeyError(chunk_idx)
        return {c: self.cols[c][pos] for c in self.cols}


@dataclass
class SearchTimings:
    embed_ms: float = 0.0
    search_ms: float = 0.0
    merge_ms: float = 0.0
    rounds: int = 0


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
            self._embedder = load_sentence_transformer(self.manifest.embedder_model)
        return self._embedder

    def embed(self, queries: list[str]) -> np.ndarray:
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
        if not all(isinstance(q, str) and q.strip() for q in queries):
            raise QragError("query must be a non-empty string")
        self.last_timings = SearchTimings()
        t0 = time.perf_counter()
        qvecs = self.embed(queries)
        self.last_timings.embed_ms = (time.perf_counter() - t0) * 1000
        results = self.search_vectors(qvecs, k, min_score, queries)
        matched_of = lambda shard, row: self.shards[shard].matched(row)  # noqa: E731
        return [format_results(r, self.chunks.get, matched_of) for r in results]
