"""Merging per-shard vector hits into k distinct chunks (pure numpy): the dedup that must still fill
the page, and the signal that tells the engine to widen its over-retrieval."""

from __future__ import annotations

import numpy as np

from qrag_ray.search.merge import Hits, dedup, gather, merge_hits, needs_more


def hits(shard: int, scores: list[float], chunks: list[int], exhausted: bool = False) -> Hits:
    n = len(scores)
    return Hits(shard, np.array(scores, np.float32), np.arange(n, dtype=np.int64),
                np.array(chunks, np.int64), exhausted)


def test_dedup_max_per_chunk_and_k_distinct():
    per_shard = [hits(0, [0.9, 0.85, 0.8, 0.3], [1, 1, 2, 3]), hits(1, [0.88, 0.5], [4, 4])]
    candidates = gather(per_shard)
    results = dedup(candidates, 3)
    assert [r.chunk_idx for r in results] == [1, 4, 2]
    assert [round(r.score, 2) for r in results] == [0.9, 0.88, 0.8]
    # matches keep the chunk's vectors best first, for "matched" explanations
    assert [(s, row) for s, row, _ in results[0].matches] == [(0, 0), (0, 1)]
    assert len({r.chunk_idx for r in dedup(candidates, 10)}) == 4


def test_too_few_distinct_chunks_asks_for_more():
    per_shard = [hits(0, [0.9, 0.89, 0.88], [1, 1, 1]), hits(1, [0.7, 0.69, 0.68], [2, 2, 2])]
    results, more = merge_hits(per_shard, 3)
    assert len(results) == 2 and more
    # exhausted shards: nothing more to find, the short page is final
    per_shard = [hits(0, [0.9, 0.89], [1, 1], exhausted=True), hits(1, [0.7], [2], exhausted=True)]
    results, more = merge_hits(per_shard, 3)
    assert len(results) == 2 and not more


def test_cutoff_above_kth_chunk_asks_for_more():
    # shard 0 cut off at 0.8: an unseen chunk there could score up to 0.8 > the 2nd chunk's 0.5
    per_shard = [hits(0, [0.95, 0.9, 0.8], [1, 1, 1]), hits(1, [0.5, 0.4], [2, 3], exhausted=True)]
    candidates = gather(per_shard)
    results = dedup(candidates, 2)
    assert [r.chunk_idx for r in results] == [1, 2]
    assert needs_more(candidates, results, 2)
    # when every unseen vector scores below the k-th chunk, the page is exact
    per_shard = [hits(0, [0.95, 0.9, 0.4], [1, 2, 2]), hits(1, [0.5, 0.3], [3, 4])]
    candidates = gather(per_shard)
    assert not needs_more(candidates, dedup(candidates, 2), 2)


def test_min_score_cuts_and_stops_widening():
    per_shard = [hits(0, [0.9, 0.2, 0.1], [1, 2, 3])]
    candidates = gather(per_shard)
    assert [r.chunk_idx for r in dedup(candidates, 3, min_score=0.5)] == [1]
    assert not needs_more(candidates, dedup(candidates, 3, min_score=0.5), 3, min_score=0.5)


def test_empty_slots_are_ignored():
    shard_hits = Hits(0, np.array([0.9, -1.0], np.float32), np.array([0, -1], np.int64),
                      np.array([7, -1], np.int64), exhausted=True)
    candidates = gather([shard_hits])
    assert candidates.chunk_idx.tolist() == [7]
    assert [r.chunk_idx for r in dedup(candidates, 5)] == [7]
