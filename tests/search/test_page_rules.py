"""What a shard's reply may leave out (search.merge): merging every shard's essential hits gives exactly the
page merging all hits gives, under every fusion policy, with and without BM25, with ties and min_score; and
the chunks a group of shards sends page metadata for (`group_winners` under max fusion, else
`reachable_chunks`) hold every chunk of the page, whatever the other groups hold, so the caller never needs
a second trip. Random hits over four shards, compared chunk by chunk (score, matches, cosine, bm25)."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.search.merge import Hits, essential_hits, group_winners, merge_hits, reachable_chunks
from qrag_ray.search.shard_reply import page_rows

KINDS = np.array(["chunk", "sentence", "question", "title"], dtype=object)
POLICIES = {
    "max": SearchConfig(),
    "max-calibrated": SearchConfig(kind_weights={"chunk": 0.5}, kind_bias={"question": -0.2}),
    "sum": SearchConfig(fusion="sum", kind_weights={"chunk": 0.5}, kind_bias={"question": -0.2}),
    "rrf-groups": SearchConfig(fusion="rrf", groups={"text": ["chunk", "sentence"]}),
    "max-hybrid": SearchConfig(bm25_alpha=0.6),
    "sum-hybrid": SearchConfig(fusion="sum", bm25_alpha=0.7, bm25_norm="minmax"),
    "sum-hybrid-z": SearchConfig(fusion="sum", bm25_alpha=0.5, bm25_norm="zscore",
                                 groups={"text": ["chunk", "sentence"]}),
    "rrf-hybrid": SearchConfig(fusion="rrf", bm25_alpha=0.6),
}


def _shard_hits(rng, shard: int, count: int, lexical: bool) -> Hits:
    chunks = rng.integers(shard * 1000, shard * 1000 + 30, count)  # a chunk's vectors all live in one shard
    scores = np.round(rng.uniform(0.1, 0.9, count), 2).astype(np.float32)  # rounded: many ties
    order = np.argsort(-scores, kind="stable")
    hits = Hits(shard, scores[order], np.arange(count, dtype=np.int64)[order], chunks[order],
                exhausted=False, kinds=KINDS[rng.integers(0, len(KINDS), count)][order])
    if lexical:
        # a full list (10 of 40 documents) or one shorter than asked (only some documents have the words)
        found = int(rng.integers(3, 11))
        lex = rng.choice(np.arange(shard * 1000, shard * 1000 + 40), found, replace=False)
        hits.lex_scores = np.r_[np.sort(np.round(rng.uniform(0.5, 9.0, found), 1))[::-1], np.zeros(10 - found)]
        hits.lex_scores = hits.lex_scores.astype(np.float32)
        hits.lex_chunk_idx = np.r_[lex, np.full(10 - found, -1)].astype(np.int64)
    return hits


def _page(results) -> list:
    return [(r.chunk_idx, r.score, r.matches, r.lexical, r.cosine) for r in results]


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("k,min_score", [(1, None), (5, None), (10, 0.5), (40, None)])
def test_merging_essential_hits_gives_the_page_of_all_hits(name, k, min_score):
    policy = POLICIES[name]
    rng = np.random.default_rng(7)
    for _ in range(20):
        per_shard = [_shard_hits(rng, shard, int(rng.integers(1, 120)), policy.bm25_alpha is not None)
                     for shard in range(3)]
        want, _ = merge_hits(per_shard, k, min_score, policy)
        few = [essential_hits(hits, k, policy) for hits in per_shard]
        got, _ = merge_hits(few, k, min_score, policy)
        assert want and _page(got) == _page(want)
        assert sum(len(hits.rows) for hits in few) <= sum(len(hits.rows) for hits in per_shard)


def test_essential_hits_keep_at_most_four_vectors_a_chunk_under_max_fusion():
    rng = np.random.default_rng(3)
    hits = _shard_hits(rng, 0, 200, lexical=False)
    few = essential_hits(hits, 5, SearchConfig())
    per_chunk = np.unique(few.chunk_idx, return_counts=True)[1]
    assert len(per_chunk) == len(np.unique(hits.chunk_idx)) and per_chunk.max() <= 4 < len(hits.rows)
    empty = Hits(0, np.zeros(0, np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64), True)
    assert essential_hits(empty, 5, SearchConfig()).rows.shape == (0,)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("k,min_score", [(1, None), (5, None), (10, 0.5), (40, None)])
def test_every_page_chunk_is_one_its_group_sends_metadata_for(name, k, min_score):
    """Shards 0-2 in one replica, shard 3 in another: each group names the chunks it sends page metadata
    for from its own hits alone; the page of all hits is among them, with every matched row."""
    policy = POLICIES[name]
    winners_decide = policy.fusion == "max" and policy.bm25_alpha is None
    rng = np.random.default_rng(11)
    sent_sizes = []
    for _ in range(30):
        per_shard = [_shard_hits(rng, shard, int(rng.integers(1, 120)), policy.bm25_alpha is not None)
                     for shard in range(4)]
        page, _ = merge_hits(per_shard, k, min_score, policy)
        assert page
        named: set[int] = set()
        rows: set[tuple[int, int]] = set()
        for group in (per_shard[:3], per_shard[3:]):
            if winners_decide:
                chunks = group_winners([merge_hits([hits], k, min_score, policy)[0] for hits in group], k)
                assert len(chunks) <= k
            else:
                chunks = reachable_chunks(group, k, policy)
            named |= chunks
            rows |= {(hits.shard, row) for hits in group for row in page_rows(hits, chunks, policy)}
        assert {result.chunk_idx for result in page} <= named
        assert {(shard, row) for result in page for shard, row, _ in result.matches} <= rows
        sent_sizes.append(len(named))
    distinct = len({int(chunk) for hits in per_shard for chunk in hits.chunk_idx})
    assert min(sent_sizes) >= min(k, 1) and distinct > 0
