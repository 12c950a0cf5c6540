"""Merge per-shard vector hits into k distinct chunks (pure numpy).

A chunk owns many vectors, so the search over-retrieves k x M vectors per shard and dedups here. The
chunk score is its best vector's score ("max"), optionally weighted by vector kind. Plain
post-filtering cannot promise k chunks, nor that the k are the true top k: `needs_more` says when a
shard was cut off above the k-th chunk's score, and the caller then asks again with a larger M.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Candidates:
    """All vector hits of one query, flattened across shards."""

    scores: np.ndarray  # float32
    chunk_idx: np.ndarray  # int64
    shard: np.ndarray  # int32
    row: np.ndarray  # int64
    cutoffs: dict[int, float] = field(default_factory=dict)  # shard -> lowest score returned, if not exhausted


@dataclass
class ChunkResult:
    chunk_idx: int
    score: float
    matches: list[tuple[int, int, float]]  # (shard, row, score), best first


def gather(per_shard: list, qi: int) -> Candidates:
    """Flatten ShardHits (one per shard) for query qi, dropping empty slots (row -1)."""
    sc, ci, sh, rw, cut = [], [], [], [], {}
    for h in per_shard:
        rows = h.rows[qi]
        ok = rows >= 0
        sc.append(h.scores[qi][ok])
        ci.append(h.chunk_idx[qi][ok])
        rw.append(rows[ok])
        sh.append(np.full(int(ok.sum()), h.shard, dtype=np.int32))
        if not h.exhausted and ok.all() and len(rows):
            cut[h.shard] = float(h.scores[qi][-1])
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    return Candidates(cat(sc, np.float32), cat(ci, np.int64), cat(sh, np.int32), cat(rw, np.int64), cut)


def dedup(c: Candidates, k: int, kinds: np.ndarray | None = None, kind_weights: dict[str, float] | None = None,
          min_score: float | None = None, max_matches: int = 3) -> list[ChunkResult]:
    """Top k distinct chunks, score = max over the chunk's (optionally kind-weighted) vector scores."""
    scores = c.scores.astype(np.float64)
    if kind_weights and kinds is not None:
        w = np.array([kind_weights.get(k_, 1.0) for k_ in kinds], dtype=np.float64)
        scores = scores * w
    order = np.lexsort((c.row, c.shard, -scores))  # score desc, deterministic ties
    cidx = c.chunk_idx[order]
    _, first = np.unique(cidx, return_index=True)
    first = np.sort(first)  # positions (in score order) of each chunk's best vector
    results: list[ChunkResult] = []
    for pos in first[:k]:
        s = float(scores[order[pos]])
        if min_score is not None and s < min_score:
            break
        chunk = int(cidx[pos])
        same = order[cidx == chunk][:max_matches]
        results.append(ChunkResult(chunk, s, [(int(c.shard[i]), int(c.row[i]), float(scores[i])) for i in same]))
    return results


def needs_more(c: Candidates, results: list[ChunkResult], k: int, min_score: float | None = None) -> bool:
    """True when a larger over-retrieval could change the top k: too few distinct chunks while some
    shard still has vectors, or a shard cut off above the k-th chunk's score (an unseen chunk there
    could outrank it)."""
    if not c.cutoffs:
        return False
    highest_cut = max(c.cutoffs.values())
    if min_score is not None and highest_cut < min_score:
        return False
    if len(results) < k:
        return True
    return results[-1].score < highest_cut
