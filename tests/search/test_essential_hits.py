"""A shard replica sends only its essential hits (search.merge.essential_hits): merging those of every shard
must give exactly the page merging all hits gives, under every fusion policy, with and without BM25, with
ties and min_score. Random hits over three shards, compared chunk by chunk (score, matches, cosine, bm25)."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.index.shard_index import ShardHits
from qrag_ray.search.hit_rows import HitRows, only_chunks
from qrag_ray.search.merge import essential_hits, merge_hits
from qrag_ray.search.shard_search import group_winners

KINDS = np.array(["chunk", "sentence", "question", "title"], dtype=object)
POLICIES = {
    "max": SearchConfig(),
    "max-calibrated": SearchConfig(kind_weights={"chunk": 0.5}, kind_bias={"question": -0.2}),
    "sum": SearchConfig(fusion="sum", kind_weights={"chunk": 0.5}, kind_bias={"question": -0.2}),
    "rrf-groups": SearchConfig(fusion="rrf", groups={"text": ["chunk", "sentence"]}),
    "max-hybrid": SearchConfig(bm25_alpha=0.6),
    "sum-hybrid": SearchConfig(fusion="sum", bm25_alpha=0.7, bm25_norm="minmax"),
}


def _shard_hits(rng, shard: int, n: int, lexical: bool) -> ShardHits:
    chunks = rng.integers(shard * 1000, shard * 1000 + 30, n)  # a chunk's vectors all live in one shard
    scores = np.round(rng.uniform(0.1, 0.9, n), 2).astype(np.float32)  # rounded: many ties
    order = np.argsort(-scores, kind="stable")
    h = ShardHits(shard, scores[order][None], np.arange(n, dtype=np.int64)[order][None], chunks[order][None],
                  exhausted=False, kinds=KINDS[rng.integers(0, len(KINDS), n)][order][None])
    if lexical:
        lex = rng.choice(np.arange(shard * 1000, shard * 1000 + 40), 10, replace=False)
        h.lex_scores = np.sort(rng.uniform(0.5, 9.0, 10)).astype(np.float32)[::-1][None]
        h.lex_chunk_idx = lex[None].astype(np.int64)
    return h


def _page(results) -> list:
    return [(r.chunk_idx, r.score, r.matches, r.lexical, r.cosine) for r in results]


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("k,min_score", [(1, None), (5, None), (10, 0.5), (40, None)])
def test_merging_essential_hits_gives_the_page_of_all_hits(name, k, min_score):
    policy = POLICIES[name]
    rng = np.random.default_rng(7)
    for _ in range(20):
        per = [_shard_hits(rng, s, int(rng.integers(1, 120)), policy.bm25_alpha is not None) for s in range(3)]
        want, _ = merge_hits(per, 0, k, min_score, policy)
        few = [essential_hits(h, k, policy) for h in per]
        got, _ = merge_hits(few, 0, k, min_score, policy)
        assert _page(got) == _page(want)
        assert sum(h.rows.shape[1] for h in few) <= sum(h.rows.shape[1] for h in per)


def test_essential_hits_keep_at_most_four_vectors_a_chunk_under_max_fusion():
    rng = np.random.default_rng(3)
    h = _shard_hits(rng, 0, 200, lexical=False)
    few = essential_hits(h, 5, SearchConfig())
    per_chunk = np.unique(few.chunk_idx, return_counts=True)[1]
    assert len(per_chunk) == len(np.unique(h.chunk_idx)) and per_chunk.max() <= 4 < h.rows.shape[1]
    assert essential_hits(ShardHits(0, np.zeros((1, 0), np.float32), np.zeros((1, 0), np.int64),
                                    np.zeros((1, 0), np.int64), True), 5, SearchConfig()).rows.shape == (1, 0)


def test_one_shard_under_max_fusion_sends_only_its_top_k_chunks():
    rng = np.random.default_rng(3)
    h = _shard_hits(rng, 0, 200, lexical=False)
    top, _ = merge_hits([h], 0, 5, None, SearchConfig())
    keep = group_winners([[top]], 5, SearchConfig())
    sent = only_chunks(HitRows.of(0, [h]), keep)[0]
    assert set(np.unique(sent.chunk_idx).tolist()) == {r.chunk_idx for r in top}
    assert merge_hits([sent], 0, 5, None, SearchConfig())[0] == top


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("k,min_score", [(1, None), (5, None), (10, 0.5), (40, None)])
def test_a_group_of_shards_replying_its_own_top_k_gives_the_page_of_all_hits(name, k, min_score):
    """One replica searching shards 0-2 and another shard 3: under max fusion each group sends the hits of
    only the chunks `group_winners` names, else every shard its essential hits, and the merge is unchanged."""
    policy = POLICIES[name]
    rng = np.random.default_rng(11)
    for _ in range(20):
        per = [_shard_hits(rng, s, int(rng.integers(1, 120)), policy.bm25_alpha is not None) for s in range(4)]
        want, _ = merge_hits(per, 0, k, min_score, policy)
        sent = []
        for group in (per[:3], per[3:]):
            tops = [[merge_hits([h], 0, k, min_score, policy)[0]] for h in group]
            keep = group_winners(tops, k, policy)  # what add_page sends, by the same rule
            assert (keep is None) == (policy.fusion != "max" or policy.bm25_alpha is not None)
            sent += ([essential_hits(h, k, policy) for h in group] if keep is None
                     else [only_chunks(HitRows.of(h.shard, [h]), keep)[0] for h in group])
            if keep is not None:
                assert len(keep[0]) <= k
        got, _ = merge_hits(sent, 0, k, min_score, policy)
        assert _page(got) == _page(want)
