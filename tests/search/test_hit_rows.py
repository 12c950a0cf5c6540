"""A shard replica's hits for a batch of queries (search.hit_rows): flattening and indexing give back every
query's own hits, trimming to each query's chunks in one pass keeps exactly the hits a per-query trim
keeps, and the pickled reply holds the same hits."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from qrag_ray.index.shard_index import ShardHits
from qrag_ray.search.hit_rows import HitRows, only_chunks

KINDS = np.array(["chunk", "sentence", "question"], dtype=object)


def _query_hits(rng, n: int, lexical: bool, empty_slots: int = 0) -> ShardHits:
    rows = np.r_[rng.integers(0, 10_000, n), np.full(empty_slots, -1)].astype(np.int64)
    chunks = np.where(rows >= 0, rows // 7, -1)
    scores = np.sort(rng.uniform(0, 1, len(rows)))[::-1].astype(np.float32)
    h = ShardHits(2, scores[None], rows[None], chunks[None], exhausted=bool(rng.integers(0, 2)),
                  kinds=KINDS[rng.integers(0, 3, len(rows))][None])
    if lexical:
        m = int(rng.integers(0, 6))
        h.lex_scores = rng.uniform(0, 9, m).astype(np.float32)[None]
        h.lex_chunk_idx = rng.integers(0, 1000, m).astype(np.int64)[None]
    return h


def _same(a: ShardHits, b: ShardHits) -> bool:
    arrays = ("scores", "rows", "chunk_idx", "kinds", "lex_scores", "lex_chunk_idx")
    return a.shard == b.shard and a.exhausted == b.exhausted and all(
        (getattr(a, n) is None and getattr(b, n) is None)
        or (getattr(a, n).shape == getattr(b, n).shape and (getattr(a, n) == getattr(b, n)).all()) for n in arrays)


@pytest.mark.parametrize("lexical", [False, True])
def test_each_query_gets_back_its_own_hits_and_the_pickle_holds_them(lexical):
    rng = np.random.default_rng(5)
    hits = [_query_hits(rng, int(rng.integers(0, 40)), lexical, int(rng.integers(0, 3))) for _ in range(17)]
    packed = HitRows.of(2, hits)
    assert len(packed) == 17 and all(_same(p, h) for p, h in zip(packed, hits))
    assert _same(packed[-1], hits[-1])
    back = pickle.loads(pickle.dumps(packed, protocol=5))
    assert all(_same(p, h) for p, h in zip(back, hits))
    with pytest.raises(IndexError):
        packed[17]


def test_trimming_every_query_at_once_keeps_what_a_per_query_trim_keeps():
    rng = np.random.default_rng(9)
    for _ in range(50):
        hits = [_query_hits(rng, int(rng.integers(0, 60)), True, int(rng.integers(0, 3))) for _ in range(9)]
        keep = [set(rng.choice(np.unique(h.chunk_idx[0]), int(rng.integers(0, 4))).tolist()) if h.rows.size else set()
                for h in hits]
        if rng.integers(0, 2):
            keep[0].add(-1)  # an empty slot's -1 is kept only when asked for
        got = only_chunks(HitRows.of(2, hits), keep)
        for g, h, k in zip(got, hits, keep):
            mask = np.isin(h.chunk_idx[0], list(k))
            want = ShardHits(2, h.scores[:, mask], h.rows[:, mask], h.chunk_idx[:, mask], h.exhausted,
                             h.kinds[:, mask], h.lex_scores, h.lex_chunk_idx)
            assert _same(g, want)


def test_a_field_set_for_some_queries_only_is_refused():
    rng = np.random.default_rng(1)
    a, b = _query_hits(rng, 3, False), _query_hits(rng, 3, False)
    b.kinds = None
    with pytest.raises(ValueError, match="kinds"):
        HitRows.of(2, [a, b])
