"""Merge per-shard vector hits into k distinct chunks (pure numpy).

A chunk owns many vectors, so the search over-retrieves k x M vectors per shard and dedups here.
Post-filtering alone cannot promise the true top k chunks: `needs_more` says when a shard was cut off
above the k-th chunk's score, and the caller then asks again with a larger M.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from qrag_ray.errors import QragError
from qrag_ray.config.search_policy import SearchConfig


@dataclass
class Candidates:
    """All vector hits of one query, flattened across shards."""

    scores: np.ndarray  # float32
    chunk_idx: np.ndarray  # int64
    shard: np.ndarray  # int32
    row: np.ndarray  # int64
    cutoffs: dict[int, float] = field(default_factory=dict)  # shard -> lowest score returned, if not exhausted
    kinds: np.ndarray | None = None  # object array of vector kinds, when the shards report them
    # BM25 hits of all shards: chunk ids, scores over the query's best (0..1], an unseen chunk's score
    lex_chunks: np.ndarray | None = None
    lex_scores: np.ndarray | None = None
    lex_floor: float = 0.0


@dataclass
class ChunkResult:
    chunk_idx: int
    score: float
    matches: list[tuple[int, int, float]]  # (shard, row, score), best first
    lexical: float | None = None  # hybrid search: the chunk's BM25 over the query's best (floor if unseen)
    cosine: float | None = None  # the best raw (uncalibrated) similarity of the chunk's retrieved vectors


def gather(per_shard: list, qi: int) -> Candidates:
    """Flatten ShardHits (one per shard) for query qi, dropping empty slots (row -1)."""
    sc, ci, sh, rw, kd, cut = [], [], [], [], [], {}
    with_kinds = all(getattr(h, "kinds", None) is not None for h in per_shard) and bool(per_shard)
    for h in per_shard:
        rows = h.rows[qi]
        ok = rows >= 0
        sc.append(h.scores[qi][ok])
        ci.append(h.chunk_idx[qi][ok])
        rw.append(rows[ok])
        sh.append(np.full(int(ok.sum()), h.shard, dtype=np.int32))
        if with_kinds:
            kd.append(np.asarray(h.kinds[qi], dtype=object)[ok])
        if not h.exhausted and ok.all() and len(rows):
            cut[h.shard] = float(h.scores[qi][-1])
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    kinds = cat(kd, object) if with_kinds else None
    c = Candidates(cat(sc, np.float32), cat(ci, np.int64), cat(sh, np.int32), cat(rw, np.int64), cut, kinds)
    lex = [h for h in per_shard if getattr(h, "lex_scores", None) is not None]
    if lex:
        c.lex_chunks, c.lex_scores, c.lex_floor = _gather_lexical(lex, qi)
    return c


def _gather_lexical(per_shard: list, qi: int) -> tuple[np.ndarray, np.ndarray, float]:
    """All shards' BM25 hits of query qi over the best one (raw BM25 grows with the query's length)."""
    ids = [h.lex_chunk_idx[qi] for h in per_shard]
    scs = [h.lex_scores[qi] for h in per_shard]
    ok = [i >= 0 for i in ids]
    chunks = np.concatenate([i[m] for i, m in zip(ids, ok)]).astype(np.int64)
    scores = np.concatenate([s[m] for s, m in zip(scs, ok)]).astype(np.float64)
    top = float(scores.max()) if len(scores) else 0.0
    if top <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64), 0.0
    scores = scores / top
    # a shard whose list is full may hold unseen chunks up to its last score: they count the lowest
    cut = [float(s[-1]) / top for s, m in zip(scs, ok) if len(m) and m.all()]
    return chunks, scores, (min(cut) if cut else 0.0)


def hybrid_scores(dense: dict[int, float], c: Candidates, policy: SearchConfig) -> dict[int, float]:
    """chunk -> alpha * dense + (1 - alpha) * lexical over the union of both lists; a chunk one list
    missed counts that list's floor. Under rrf BM25 adds (1 - alpha) / (rrf_k + rank) instead."""
    a = float(policy.bm25_alpha)
    lex_ids, lex_sc = c.lex_chunks.tolist(), c.lex_scores.tolist()
    if policy.fusion == "rrf":
        order = sorted(range(len(lex_ids)), key=lambda i: (-lex_sc[i], lex_ids[i]))
        lex = {lex_ids[i]: 1.0 / (policy.rrf_k + r) for r, i in enumerate(order, start=1)}
        lfloor = 1.0 / (policy.rrf_k + len(lex) + 1)
    else:
        lex, lfloor = dict(zip(lex_ids, lex_sc)), c.lex_floor
    dfloor = min(dense.values()) if dense else 0.0
    if policy.fusion != "rrf" and policy.bm25_norm != "max":
        dense, dfloor = normalise(dense, dfloor, policy.bm25_norm)
        lex, lfloor = normalise(lex, lfloor, policy.bm25_norm)
    return {ch: a * dense.get(ch, dfloor) + (1 - a) * lex.get(ch, lfloor) for ch in dense.keys() | lex.keys()}


def normalise(scores: dict[int, float], floor: float, how: str) -> tuple[dict[int, float], float]:
    """One list's scores (and its floor) on a per-query scale, so a fixed alpha means the same on every
    query: "minmax" maps onto [0, 1], "zscore" centres and divides by the spread, "max" keeps them."""
    if how == "max" or not scores:
        return scores, floor
    vals = np.fromiter(scores.values(), np.float64, len(scores))
    if how == "minmax":
        lo = min(float(vals.min()), floor)
        span = float(vals.max()) - lo
        if span <= 0:
            return {ch: 1.0 for ch in scores}, 0.0
        return {ch: (v - lo) / span for ch, v in scores.items()}, (floor - lo) / span
    if how == "zscore":
        mu, sd = float(vals.mean()), float(vals.std())
        if sd <= 0:
            return {ch: 0.0 for ch in scores}, min(0.0, floor - mu)
        return {ch: (v - mu) / sd for ch, v in scores.items()}, (floor - mu) / sd
    raise QragError(f"unknown score normalisation {how!r} (known: max, minmax, zscore)")


def _best_per_chunk(chunks: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique chunk ids, their best score), chunks ordered by best score desc."""
    order = np.lexsort((chunks, -scores))
    uniq, first = np.unique(chunks[order], return_index=True)
    best = scores[order][first]
    o = np.lexsort((uniq, -best))
    return uniq[o], best[o]


def fuse_scores(c: Candidates, policy: SearchConfig, scores: np.ndarray) -> dict[int, float]:
    """chunk_idx -> fused score for rrf / sum from the calibrated vector `scores` of `c`."""
    kinds = c.kinds if c.kinds is not None else np.full(len(c.scores), "?", dtype=object)
    labels = np.array([policy.group_of(k) for k in kinds.tolist()], dtype=object)
    fused: dict[int, float] = {}
    all_chunks = np.unique(c.chunk_idx)
    for g in sorted(set(labels.tolist())):
        m = labels == g
        uniq, best = _best_per_chunk(c.chunk_idx[m], scores[m])
        if policy.fusion == "rrf":
            # rank order inside one kind is unchanged by its calibration; a group's weight is 1
            w = 1.0 if g in policy.groups else float(policy.kind_weights.get(g, 1.0))
            ranks = {int(ch): r for r, ch in enumerate(uniq, start=1)}
            miss = len(uniq) + 1  # unseen in this list: just below its last retrieved chunk
            for ch in all_chunks.tolist():
                fused[ch] = fused.get(ch, 0.0) + w / (policy.rrf_k + ranks.get(ch, miss))
        else:  # sum of calibrated bests; a group that did not retrieve the chunk counts its floor
            floor = float(best[-1]) if len(best) else 0.0
            bs = dict(zip(uniq.tolist(), best.tolist()))
            for ch in all_chunks.tolist():
                fused[ch] = fused.get(ch, 0.0) + bs.get(ch, floor)
    return fused


def dedup(c: Candidates, k: int, min_score: float | None = None, max_matches: int = 3,
          policy: SearchConfig | None = None) -> list[ChunkResult]:
    """Top k distinct chunks under the fusion policy (default: max over the chunk's vectors).
    `min_score` applies to the chunk's best (calibrated) vector score whatever the fusion."""
    policy = policy or SearchConfig()
    scores = policy.calibrate(c.scores, c.kinds)
    order = np.lexsort((c.row, c.shard, -scores))  # score desc, deterministic ties
    cidx = c.chunk_idx[order]
    _, first = np.unique(cidx, return_index=True)
    first = np.sort(first)  # positions (in score order) of each chunk's best vector
    by_best = list(zip(cidx[first].tolist(), scores[order[first]].tolist()))  # chunk, best score: score desc
    best = dict(by_best)
    hybrid = policy.bm25_alpha is not None and c.lex_chunks is not None
    lexical: dict[int, float] = {}
    if policy.fusion == "max" and not hybrid:
        ranked = by_best
    else:
        fused = best if policy.fusion == "max" else fuse_scores(c, policy, scores)
        if hybrid:
            fused = hybrid_scores(fused, c, policy)
            lex = dict(zip(c.lex_chunks.tolist(), c.lex_scores.tolist()))
            lexical = {ch: lex.get(ch, c.lex_floor) for ch in fused}  # what each chunk was scored with
        ranked = sorted(fused.items(), key=lambda t: (-t[1], -best.get(t[0], -np.inf), t[0]))
    results: list[ChunkResult] = []
    for chunk, s in ranked:
        if len(results) == k:
            break
        if min_score is not None and best.get(chunk, -np.inf) < min_score:
            if policy.fusion == "max" and not hybrid:
                break
            continue
        mine = order[cidx == chunk]
        top = mine[:max_matches]
        matches = list(zip(c.shard[top].tolist(), c.row[top].tolist(), scores[top].tolist()))
        results.append(ChunkResult(chunk, float(s), matches, lexical.get(chunk) if hybrid else None,
                                   float(c.scores[mine].max()) if len(mine) else None))
    return results


def needs_more(c: Candidates, results: list[ChunkResult], k: int, min_score: float | None = None,
               policy: SearchConfig | None = None) -> bool:
    """True when a larger over-retrieval could change the top k: too few distinct chunks while some
    shard still has vectors, or (max fusion only) a shard cut off above the k-th chunk's score. rrf and
    sum rank by the lists retrieved, which deeper lists refine but rarely reorder at the top."""
    if not c.cutoffs:
        return False
    policy = policy or SearchConfig()
    highest_cut = max(policy.bound(cut) for cut in c.cutoffs.values())
    if min_score is not None and highest_cut < min_score:
        return False
    if len(results) < k:
        return True
    if policy.fusion != "max" or policy.bm25_alpha is not None:
        return False
    return results[-1].score < highest_cut


def essential_hits(h, k: int, policy: SearchConfig, max_matches: int = 3):
    """The vector hits of one shard for one query (a 1-query ShardHits) that `dedup` across shards can read,
    in the shard's order: each chunk's best `max_matches` vectors (its score and matches), the one with its
    best raw score (its cosine) and, under rrf/sum, its best of each fusion group (ranks and floors).
    Merging every shard's essential hits gives the page merging all hits gives: a shard replica sends
    these instead of its k x M vectors where every chunk's lists count (rrf, sum, hybrid; under max
    fusion it sends only the hits of its top k chunks: shard_search.group_winners)."""
    ok = np.flatnonzero(h.rows[0] >= 0)
    if len(ok) <= 2 * k:  # at most two vectors a wanted chunk: nothing worth the sorting to drop
        return h
    scores, cidx, rows = h.scores[0][ok], h.chunk_idx[0][ok], h.rows[0][ok]
    kinds = None if h.kinds is None else np.asarray(h.kinds[0], dtype=object)[ok]
    order = np.lexsort((rows, -policy.calibrate(scores, kinds)))  # dedup's order (one shard: score, row)
    ch = cidx[order]
    by_chunk = np.argsort(ch, kind="stable")  # positions in `order`, grouped by chunk, best first
    starts = np.flatnonzero(np.r_[True, ch[by_chunk][1:] != ch[by_chunk][:-1]])
    rank = np.arange(len(ch)) - np.repeat(starts, np.diff(np.r_[starts, len(ch)]))
    keep = np.zeros(len(ch), bool)
    keep[by_chunk[rank < max_matches]] = True
    raw = scores[order]
    best_raw = np.lexsort((-raw[by_chunk], ch[by_chunk]))  # by chunk, raw score desc
    keep[by_chunk[best_raw[starts]]] = True
    if policy.fusion != "max" and kinds is not None:
        _, group = np.unique(np.array([policy.group_of(x) for x in kinds[order].tolist()], dtype=object),
                             return_inverse=True)
        _, first = np.unique(np.stack([ch, group]), axis=1, return_index=True)
        keep[first] = True  # the first, so best, vector of each (chunk, group)
    pos = np.sort(ok[order[keep]])  # in the shard's own order
    return replace(h, scores=h.scores[:, pos], rows=h.rows[:, pos], chunk_idx=h.chunk_idx[:, pos],
                   kinds=None if h.kinds is None else h.kinds[:, pos])


def merge_hits(per_shard: list, qi: int, k: int, min_score: float | None = None,
               policy: SearchConfig | None = None) -> tuple[list[ChunkResult], bool]:
    """One query's per-shard hits -> (top k distinct chunks, whether a wider search could change them)."""
    policy = policy or SearchConfig()
    c = gather(per_shard, qi)
    res = dedup(c, k, min_score=min_score, policy=policy)
    return res, needs_more(c, res, k, min_score, policy)
