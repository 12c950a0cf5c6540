"""A shard's reply to a batch of queries (search.shard_reply.ShardReply): held flat, it gives back every
query's own hits, and the pickled reply (what a ShardSearcher sends) holds the same hits."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from qrag_ray.search.merge import Hits
from qrag_ray.search.shard_reply import ShardReply

KINDS = np.array(["chunk", "sentence", "question"], dtype=object)


def _query_hits(rng, count: int, lexical: bool, empty_slots: int = 0) -> Hits:
    rows = np.r_[rng.integers(0, 10_000, count), np.full(empty_slots, -1)].astype(np.int64)
    chunks = np.where(rows >= 0, rows // 7, -1)
    scores = np.sort(rng.uniform(0, 1, len(rows)))[::-1].astype(np.float32)
    hits = Hits(2, scores, rows, chunks, exhausted=bool(rng.integers(0, 2)), kinds=KINDS[rng.integers(0, 3, len(rows))])
    if lexical:
        lex_count = int(rng.integers(0, 6))
        hits.lex_scores = rng.uniform(0, 9, lex_count).astype(np.float32)
        hits.lex_chunk_idx = rng.integers(0, 1000, lex_count).astype(np.int64)
    return hits


def _same(first: Hits, second: Hits) -> bool:
    arrays = ("scores", "rows", "chunk_idx", "kinds", "lex_scores", "lex_chunk_idx")
    return first.shard == second.shard and first.exhausted == second.exhausted and all(
        (getattr(first, name) is None and getattr(second, name) is None)
        or (getattr(first, name).shape == getattr(second, name).shape
            and (getattr(first, name) == getattr(second, name)).all()) for name in arrays)


@pytest.mark.parametrize("lexical", [False, True])
def test_each_query_gets_back_its_own_hits_and_the_pickle_holds_them(lexical):
    rng = np.random.default_rng(5)
    hits = [_query_hits(rng, int(rng.integers(0, 40)), lexical, int(rng.integers(0, 3))) for _ in range(17)]
    reply = ShardReply.of(2, hits)
    assert len(reply) == 17
    assert all(_same(reply.hits(query), query_hits) for query, query_hits in enumerate(hits))
    back = pickle.loads(pickle.dumps(reply, protocol=5))
    assert all(_same(back.hits(query), query_hits) for query, query_hits in enumerate(hits))
    assert sum(len(query_hits.rows) for query_hits in hits) > 0  # the round trip carried hits, not nothing


def test_a_field_set_for_some_queries_only_is_refused():
    rng = np.random.default_rng(1)
    first = _query_hits(rng, 3, False)
    second = _query_hits(rng, 3, False)
    second.kinds = None
    with pytest.raises(ValueError, match="some queries"):
        ShardReply.of(2, [first, second])
