"""One shard's search made final for its own top k, and the result dicts: the pieces the in-process
engine and the Serve shard stores share, so both rank and format identically."""

from __future__ import annotations

import math

import numpy as np

from qrag_ray.errors import QragError
from qrag_ray.index.format import Manifest
from qrag_ray.index.searcher import ShardHits, ShardSearcher
from qrag_ray.search.merge import ChunkResult, FusionPolicy, merge_hits

# A hybrid query's first round asks each shard for at least this many vectors and BM25 hits: a chunk
# one list missed is scored at that list's floor, and a short list's floor sinks it (docs/EVALUATION.md).
HYBRID_MIN_DEPTH = 100


class NoBm25Index(QragError):
    """Hybrid search asked of an index built without a BM25 channel."""


def check_hybrid(policy: FusionPolicy, manifest: Manifest, name: str | None = None) -> None:
    """Hybrid search needs the BM25 files: the one check, for the engine, the CLI and the Router."""
    if policy.bm25_alpha is not None and not manifest.has_bm25:
        raise NoBm25Index(f"hybrid search (bm25_alpha) needs a BM25 index, and {name or manifest.path} has none: "
                          "re-index it with bm25.enabled")


def initial_multiplier(manifest: Manifest) -> int:
    """Vectors to ask per wanted chunk: about twice the mean vectors per chunk."""
    counts = manifest.data.get("counts", {})
    vpc = counts.get("vectors", 1) / max(1, counts.get("chunks", 1))
    return max(2, math.ceil(2 * vpc))


def search_shard_exact(searcher: ShardSearcher, qvecs: np.ndarray, k: int, multiplier: int,
                       min_score: float | None, policy: FusionPolicy,
                       queries: list[str] | None = None) -> tuple[list[ShardHits], int]:
    """One shard's hits per query, each deep enough that the shard's own top k distinct chunks are
    final (widening x4 while `needs_more` says so). A chunk's vectors all live in one shard, so the
    global top k are among the shards' local top k: the caller merges once."""
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


def format_results(results: list[ChunkResult], chunk_of, matched_of) -> list[dict]:
    """Result dicts (docs/ARCHITECTURE.md); chunk_of(chunk_idx) -> dict, matched_of(shard, row) -> (kind, text)."""
    out = []
    for r in results:
        meta = chunk_of(r.chunk_idx)
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
