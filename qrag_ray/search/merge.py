"""Merge per-shard vector hits into k distinct chunks (pure numpy).

A chunk owns many vectors, so the search over-retrieves k x M vectors per shard and dedups here.
Post-filtering alone cannot promise the true top k chunks: `needs_more` says when a shard was cut off
above the k-th chunk's score, and the caller then asks again with a larger M. `reachable_chunks` says
which chunks of a group of shards can still reach a page, so a shard's reply carries the page's
metadata for them and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.errors import QragError


@dataclass
class Hits:
    """One query's hits in one shard, best first: each vector hit's score, FAISS row, chunk_idx and kind
    (row -1: an empty slot), and with BM25 its best chunks' raw scores (chunk_idx -1: an empty slot)."""

    shard: int
    scores: np.ndarray  # float32
    rows: np.ndarray  # int64
    chunk_idx: np.ndarray  # int64
    exhausted: bool  # the shard holds no more vectors than were asked for
    kinds: np.ndarray | None = None  # object array of vector kinds, for kind-aware fusion
    lex_scores: np.ndarray | None = None
    lex_chunk_idx: np.ndarray | None = None


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
    """One chunk of a merged page: its fused score and the vectors (shard, row, score) that matched best."""

    chunk_idx: int
    score: float
    matches: list[tuple[int, int, float]]  # (shard, row, score), best first
    lexical: float | None = None  # hybrid search: the chunk's BM25 over the query's best (floor if unseen)
    cosine: float | None = None  # the best raw (uncalibrated) similarity of the chunk's retrieved vectors


def _concat(arrays: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)


def gather(per_shard: list[Hits]) -> Candidates:
    """One query's hits of every shard, flattened, without empty slots (row -1)."""
    scores = []
    chunk_idx = []
    shards = []
    rows = []
    kinds = []
    cutoffs = {}
    with_kinds = bool(per_shard) and all(hits.kinds is not None for hits in per_shard)
    for hits in per_shard:
        filled = hits.rows >= 0
        scores.append(hits.scores[filled])
        chunk_idx.append(hits.chunk_idx[filled])
        rows.append(hits.rows[filled])
        shards.append(np.full(int(filled.sum()), hits.shard, dtype=np.int32))
        if with_kinds:
            kinds.append(np.asarray(hits.kinds, dtype=object)[filled])
        if not hits.exhausted and filled.all() and len(hits.rows):
            cutoffs[hits.shard] = float(hits.scores[-1])
    candidates = Candidates(_concat(scores, np.float32), _concat(chunk_idx, np.int64), _concat(shards, np.int32),
                            _concat(rows, np.int64), cutoffs, _concat(kinds, object) if with_kinds else None)
    lexical = [hits for hits in per_shard if hits.lex_scores is not None]
    if lexical:
        candidates.lex_chunks, candidates.lex_scores, candidates.lex_floor = _gather_lexical(lexical)
    return candidates


def _gather_lexical(per_shard: list[Hits]) -> tuple[np.ndarray, np.ndarray, float]:
    """All shards' BM25 hits of one query over the best one (raw BM25 grows with the query's length)."""
    filled = [hits.lex_chunk_idx >= 0 for hits in per_shard]
    pairs = list(zip(per_shard, filled, strict=True))
    chunks = np.concatenate([hits.lex_chunk_idx[ok] for hits, ok in pairs]).astype(np.int64)
    scores = np.concatenate([hits.lex_scores[ok] for hits, ok in pairs]).astype(np.float64)
    top = float(scores.max()) if len(scores) else 0.0
    if top <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64), 0.0
    scores = scores / top
    # a shard whose list is full may hold unseen chunks up to its last score: they count the lowest
    cuts = [float(hits.lex_scores[-1]) / top for hits, ok in pairs if _full(ok)]
    return chunks, scores, (min(cuts) if cuts else 0.0)


def _full(filled: np.ndarray) -> bool:
    """A list with no empty slot: the shard may hold unseen entries below its last one."""
    return bool(len(filled)) and bool(filled.all())


def hybrid_scores(dense: dict[int, float], candidates: Candidates, policy: SearchConfig) -> dict[int, float]:
    """chunk -> alpha * dense + (1 - alpha) * lexical over the union of both lists; a chunk one list
    missed counts that list's floor. Under rrf BM25 adds (1 - alpha) / (rrf_k + rank) instead."""
    alpha = float(policy.bm25_alpha)
    lex_chunks = candidates.lex_chunks.tolist()
    lex_scores = candidates.lex_scores.tolist()
    if policy.fusion == "rrf":
        order = sorted(range(len(lex_chunks)), key=lambda i: (-lex_scores[i], lex_chunks[i]))
        lexical = {lex_chunks[i]: 1.0 / (policy.rrf_k + rank) for rank, i in enumerate(order, start=1)}
        lex_floor = 1.0 / (policy.rrf_k + len(lexical) + 1)
    else:
        lexical = dict(zip(lex_chunks, lex_scores, strict=True))
        lex_floor = candidates.lex_floor
    dense_floor = min(dense.values()) if dense else 0.0
    if policy.fusion != "rrf" and policy.bm25_norm != "max":
        dense, dense_floor = normalise(dense, dense_floor, policy.bm25_norm)
        lexical, lex_floor = normalise(lexical, lex_floor, policy.bm25_norm)
    return {chunk: alpha * dense.get(chunk, dense_floor) + (1 - alpha) * lexical.get(chunk, lex_floor)
            for chunk in dense.keys() | lexical.keys()}


def normalise(scores: dict[int, float], floor: float, how: str) -> tuple[dict[int, float], float]:
    """One list's scores (and its floor) on a per-query scale, so a fixed alpha means the same on every
    query: "minmax" maps onto [0, 1], "zscore" centres and divides by the spread, "max" keeps them."""
    if how == "max" or not scores:
        return scores, floor
    values = np.fromiter(scores.values(), np.float64, len(scores))
    if how == "minmax":
        low = min(float(values.min()), floor)
        span = float(values.max()) - low
        if span <= 0:
            return dict.fromkeys(scores, 1.0), 0.0
        return {chunk: (value - low) / span for chunk, value in scores.items()}, (floor - low) / span
    if how == "zscore":
        mean = float(values.mean())
        spread = float(values.std())
        if spread <= 0:
            return dict.fromkeys(scores, 0.0), min(0.0, floor - mean)
        return {chunk: (value - mean) / spread for chunk, value in scores.items()}, (floor - mean) / spread
    raise QragError(f"unknown score normalisation {how!r} (known: max, minmax, zscore)")


def _best_per_chunk(chunks: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique chunk ids, their best score), chunks ordered by best score desc."""
    order = np.lexsort((chunks, -scores))
    unique, first = np.unique(chunks[order], return_index=True)
    best = scores[order][first]
    by_best = np.lexsort((unique, -best))
    return unique[by_best], best[by_best]


def fuse_scores(candidates: Candidates, policy: SearchConfig, scores: np.ndarray) -> dict[int, float]:
    """chunk_idx -> fused score for rrf / sum from the calibrated vector `scores` of `candidates`."""
    kinds = candidates.kinds if candidates.kinds is not None else np.full(len(candidates.scores), "?", dtype=object)
    labels = policy.groups_of(kinds)
    fused: dict[int, float] = {}
    all_chunks = np.unique(candidates.chunk_idx).tolist()
    for group in sorted(set(labels.tolist())):
        in_group = labels == group
        chunks, best = _best_per_chunk(candidates.chunk_idx[in_group], scores[in_group])
        if policy.fusion == "rrf":
            # rank order inside one kind is unchanged by its calibration; a group's weight is 1
            weight = 1.0 if group in policy.groups else float(policy.kind_weights.get(group, 1.0))
            ranks = {int(chunk): rank for rank, chunk in enumerate(chunks, start=1)}
            miss = len(chunks) + 1  # unseen in this list: just below its last retrieved chunk
            for chunk in all_chunks:
                fused[chunk] = fused.get(chunk, 0.0) + weight / (policy.rrf_k + ranks.get(chunk, miss))
        else:  # sum of calibrated bests; a group that did not retrieve the chunk counts its floor
            floor = float(best[-1]) if len(best) else 0.0
            bests = dict(zip(chunks.tolist(), best.tolist(), strict=True))
            for chunk in all_chunks:
                fused[chunk] = fused.get(chunk, 0.0) + bests.get(chunk, floor)
    return fused


def dedup(candidates: Candidates, k: int, min_score: float | None = None, max_matches: int = 3,
          policy: SearchConfig | None = None) -> list[ChunkResult]:
    """Top k distinct chunks under the fusion policy (default: max over the chunk's vectors).
    `min_score` applies to the chunk's best (calibrated) vector score whatever the fusion."""
    policy = policy or SearchConfig()
    scores = policy.calibrate(candidates.scores, candidates.kinds)
    order = np.lexsort((candidates.row, candidates.shard, -scores))  # score desc, deterministic ties
    chunk_order = candidates.chunk_idx[order]
    _, first = np.unique(chunk_order, return_index=True)
    first = np.sort(first)  # positions (in score order) of each chunk's best vector
    # (chunk, its best score), score desc
    by_best = list(zip(chunk_order[first].tolist(), scores[order[first]].tolist(), strict=True))
    best = dict(by_best)
    hybrid = policy.bm25_alpha is not None and candidates.lex_chunks is not None
    lexical: dict[int, float] = {}
    if policy.fusion == "max" and not hybrid:
        ranked = by_best
    else:
        fused = best if policy.fusion == "max" else fuse_scores(candidates, policy, scores)
        if hybrid:
            fused = hybrid_scores(fused, candidates, policy)
            lex = dict(zip(candidates.lex_chunks.tolist(), candidates.lex_scores.tolist(), strict=True))
            lexical = {chunk: lex.get(chunk, candidates.lex_floor) for chunk in fused}  # what each was scored with
        ranked = sorted(fused.items(), key=lambda item: (-item[1], -best.get(item[0], -np.inf), item[0]))
    results: list[ChunkResult] = []
    for chunk, score in ranked:
        if len(results) == k:
            break
        if min_score is not None and best.get(chunk, -np.inf) < min_score:
            if policy.fusion == "max" and not hybrid:
                break
            continue
        mine = order[chunk_order == chunk]
        top = mine[:max_matches]
        matches = list(zip(candidates.shard[top].tolist(), candidates.row[top].tolist(), scores[top].tolist(),
                           strict=True))
        results.append(ChunkResult(chunk, float(score), matches, lexical.get(chunk) if hybrid else None,
                                   float(candidates.scores[mine].max()) if len(mine) else None))
    return results


def needs_more(candidates: Candidates, results: list[ChunkResult], k: int, min_score: float | None = None,
               policy: SearchConfig | None = None) -> bool:
    """True when a larger over-retrieval could change the top k: too few distinct chunks while some
    shard still has vectors, or (max fusion only) a shard cut off above the k-th chunk's score. rrf and
    sum rank by the lists retrieved, which deeper lists refine but rarely reorder at the top."""
    if not candidates.cutoffs:
        return False
    policy = policy or SearchConfig()
    highest_cut = max(policy.bound(cut) for cut in candidates.cutoffs.values())
    if min_score is not None and highest_cut < min_score:
        return False
    if len(results) < k:
        return True
    if policy.fusion != "max" or policy.bm25_alpha is not None:
        return False
    return results[-1].score < highest_cut


def essential_hits(hits: Hits, k: int, policy: SearchConfig, max_matches: int = 3) -> Hits:
    """The vector hits of one shard for one query that `dedup` across shards can read, in the shard's
    order: each chunk's best `max_matches` vectors (its score and matches), the one with its best raw score
    (its cosine) and, under rrf/sum, its best of each fusion group (ranks and floors). Merging every
    shard's essential hits gives the page merging all hits gives: a shard sends these instead of its k x M
    vectors where every chunk's lists count (rrf, sum, hybrid; under max fusion it sends only the hits of
    its group's top k chunks: `group_winners`)."""
    filled = np.flatnonzero(hits.rows >= 0)
    if len(filled) <= 2 * k:  # at most two vectors a wanted chunk: nothing worth the sorting to drop
        return hits
    scores = hits.scores[filled]
    chunk_idx = hits.chunk_idx[filled]
    rows = hits.rows[filled]
    kinds = None if hits.kinds is None else np.asarray(hits.kinds, dtype=object)[filled]
    order = np.lexsort((rows, -policy.calibrate(scores, kinds)))  # dedup's order (one shard: score, row)
    chunks = chunk_idx[order]
    by_chunk = np.argsort(chunks, kind="stable")  # positions in `order`, grouped by chunk, best first
    starts = np.flatnonzero(np.r_[True, chunks[by_chunk][1:] != chunks[by_chunk][:-1]])
    rank = np.arange(len(chunks)) - np.repeat(starts, np.diff(np.r_[starts, len(chunks)]))
    keep = np.zeros(len(chunks), bool)
    keep[by_chunk[rank < max_matches]] = True
    raw = scores[order]
    best_raw = np.lexsort((-raw[by_chunk], chunks[by_chunk]))  # by chunk, raw score desc
    keep[by_chunk[best_raw[starts]]] = True
    if policy.fusion != "max" and kinds is not None:
        _, group = np.unique(policy.groups_of(kinds[order]), return_inverse=True)
        _, first = np.unique(np.stack([chunks, group]), axis=1, return_index=True)
        keep[first] = True  # the first, so best, vector of each (chunk, group)
    kept = np.sort(filled[order[keep]])  # in the shard's own order
    return replace(hits, scores=hits.scores[kept], rows=hits.rows[kept], chunk_idx=hits.chunk_idx[kept],
                   kinds=None if hits.kinds is None else hits.kinds[kept])


def group_winners(tops: list[list[ChunkResult]], k: int) -> set[int]:
    """Under max fusion without BM25, the chunks of a group of shards (one replica's, or one shard) that can
    reach a page of k, from each shard's own top k for one query: the group's top k in the merge's order
    (best score, then the shard and row of the best vector), as any other chunk has k of the group above
    it everywhere."""
    ranked = sorted((result for top in tops for result in top), key=lambda r: (-r.score, *r.matches[0][:2]))
    return {result.chunk_idx for result in ranked[:k]}


def reachable_chunks(per_shard: list[Hits], k: int, policy: SearchConfig) -> set[int]:
    """The chunks of a group of shards' hits for one query that can reach a page of k under an rrf, sum or
    hybrid policy, whatever the other shards hold: those fewer than k chunks of the group beat. A chunk d
    beats c when every channel the fused score rises with ranks d at or above c (each fusion group's best
    calibrated score, BM25), and the final order (the best calibrated vector, then the smaller chunk_idx)
    puts d first: then d's fused score is at least c's under any scale the merge's normalisation picks, so
    k such chunks keep c off the page. Unknown values count against beating: a chunk missing from a BM25
    list that may hold more is scored at the global floor, which only a full list's cut bounds."""
    vector = gather(per_shard)
    lexical = [hits for hits in per_shard if hits.lex_scores is not None and policy.bm25_alpha is not None]
    lex_keys = [hits.lex_chunk_idx[hits.lex_chunk_idx >= 0] for hits in lexical]
    keys = np.unique(np.concatenate([vector.chunk_idx, *lex_keys]).astype(np.int64))
    if len(keys) <= k:
        return set(keys.tolist())
    position = np.searchsorted(keys, vector.chunk_idx)
    calibrated = policy.calibrate(vector.scores, vector.kinds)
    best = np.full(len(keys), -np.inf)
    np.maximum.at(best, position, calibrated)
    beats = (best[:, None] > best[None, :]) | ((best[:, None] == best[None, :]) & (keys[:, None] < keys[None, :]))
    ranked = policy.fusion == "rrf"  # a rank channel orders ties by chunk_idx; a value channel counts them equal
    if policy.fusion != "max":
        kinds = vector.kinds if vector.kinds is not None else np.full(len(vector.scores), "?", dtype=object)
        labels = policy.groups_of(kinds)
        for label in sorted(set(labels.tolist())):
            group_best = np.full(len(keys), -np.inf)
            in_group = labels == label
            np.maximum.at(group_best, position[in_group], calibrated[in_group])
            beats &= _beats_on(group_best, keys, ranked)
    if lexical:
        raw = np.full(len(keys), np.nan)
        for hits, found in zip(lexical, lex_keys, strict=True):
            raw[np.searchsorted(keys, found)] = hits.lex_scores[hits.lex_chunk_idx >= 0]
        cuts = [float(hits.lex_scores[-1]) for hits in lexical if _full(hits.lex_chunk_idx >= 0)]
        beats &= _beats_on_lexical(raw, keys, min(cuts) if cuts else np.inf, ranked)
    return set(keys[beats.sum(axis=0) < k].tolist())


def _beats_on(values: np.ndarray, keys: np.ndarray, ranked: bool) -> np.ndarray:
    """[d, c]: d ranks at or above c on one vector channel (-inf: absent, scored at the list's floor or miss
    rank, below every present value and equal to another absent one)."""
    above = values[:, None] > values[None, :]
    equal = values[:, None] == values[None, :]
    if not ranked:
        return above | equal
    absent = np.isneginf(values)
    return above | (equal & ((keys[:, None] < keys[None, :]) | absent[None, :]))


def _beats_on_lexical(raw: np.ndarray, keys: np.ndarray, unseen_bound: float, ranked: bool) -> np.ndarray:
    """[d, c]: d ranks at or above c on BM25 (raw: nan where the chunk is unseen; an unseen chunk is scored
    at the global floor, at most `unseen_bound`, the lowest cut of the group's full lists; under rrf it
    takes the miss rank, below every seen one)."""
    seen = ~np.isnan(raw)
    both_seen = seen[:, None] & seen[None, :]
    both_unseen = ~seen[:, None] & ~seen[None, :]
    with np.errstate(invalid="ignore"):
        above = raw[:, None] > raw[None, :]
        equal = raw[:, None] == raw[None, :]
        over_floor = raw >= unseen_bound
    seen_over_unseen = seen[:, None] & ~seen[None, :] & (True if ranked else over_floor[:, None])
    if ranked:
        return (both_seen & (above | (equal & (keys[:, None] < keys[None, :])))) | both_unseen | seen_over_unseen
    return (both_seen & (above | equal)) | both_unseen | seen_over_unseen


def merge_hits(per_shard: list[Hits], k: int, min_score: float | None = None,
               policy: SearchConfig | None = None) -> tuple[list[ChunkResult], bool]:
    """One query's hits of every shard -> (top k distinct chunks, whether a wider search could change them)."""
    policy = policy or SearchConfig()
    candidates = gather(per_shard)
    results = dedup(candidates, k, min_score=min_score, policy=policy)
    return results, needs_more(candidates, results, k, min_score, policy)
