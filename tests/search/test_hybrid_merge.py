"""Dense + BM25 hybrid merge (pure numpy): normalisation across shards, the alpha mix, chunks only one
channel found, and the config that turns it on."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.search.merge import Hits, dedup, gather, merge_hits


def hits(shard, scores, chunks, lex_scores, lex_chunks, kinds=None):
    n = len(scores)
    shard_hits = Hits(shard, np.array(scores, np.float32), np.arange(n, dtype=np.int64),
                      np.array(chunks, np.int64), True,
                      None if kinds is None else np.array(kinds, dtype=object))
    shard_hits.lex_scores = np.array(lex_scores, np.float32)
    shard_hits.lex_chunk_idx = np.array(lex_chunks, np.int64)
    return shard_hits


def test_bm25_is_divided_by_the_best_score_over_all_shards():
    per_shard = [hits(0, [0.9], [1], [4.0, 1.0], [1, 3]), hits(1, [0.5], [2], [8.0, 0.0], [2, -1])]
    candidates = gather(per_shard)
    lexical = dict(zip(candidates.lex_chunks.tolist(), candidates.lex_scores.tolist(), strict=True))
    assert lexical == {1: 0.5, 3: 0.125, 2: 1.0}
    assert candidates.lex_floor == pytest.approx(0.125)  # shard 0's list is full: unseen chunks there score <= 1/8


def test_lists_with_free_slots_put_unseen_chunks_at_zero():
    per_shard = [hits(0, [0.9], [1], [4.0, 0.0], [1, -1]), hits(1, [0.5], [2], [2.0, 0.0], [2, -1])]
    assert gather(per_shard).lex_floor == 0.0


def test_alpha_mixes_dense_and_lexical():
    # dense prefers 1, BM25 prefers 2 strongly
    per_shard = [hits(0, [0.9, 0.8], [1, 2], [1.0, 10.0], [1, 2])]
    dense = merge_hits(per_shard, 2, policy=SearchConfig())[0]
    assert [r.chunk_idx for r in dense] == [1, 2] and dense[0].lexical is None
    mixed = merge_hits(per_shard, 2, policy=SearchConfig(bm25_alpha=0.5))[0]
    assert [r.chunk_idx for r in mixed] == [2, 1]
    assert mixed[0].score == pytest.approx(0.5 * 0.8 + 0.5 * 1.0)
    assert mixed[1].score == pytest.approx(0.5 * 0.9 + 0.5 * 0.1) and mixed[1].lexical == pytest.approx(0.1)
    # alpha 1 is the dense ranking, alpha 0 the BM25 ranking
    assert [r.chunk_idx for r in merge_hits(per_shard, 2, policy=SearchConfig(bm25_alpha=1.0))[0]] == [1, 2]
    assert [r.chunk_idx for r in merge_hits(per_shard, 2, policy=SearchConfig(bm25_alpha=0.0))[0]] == [2, 1]


def test_a_chunk_only_bm25_found_reaches_the_page_with_the_dense_floor():
    per_shard = [hits(0, [0.9, 0.6], [1, 2], [10.0, 1.0], [5, 1])]
    results = merge_hits(per_shard, 3, policy=SearchConfig(bm25_alpha=0.5))[0]
    assert [r.chunk_idx for r in results] == [5, 1, 2]
    lex_only = results[0]
    assert lex_only.matches == [] and lex_only.lexical == 1.0
    assert lex_only.score == pytest.approx(0.5 * 0.6 + 0.5 * 1.0)  # the lowest dense score retrieved
    # chunk 2: no BM25 hit in a full list, so it counts that list's lowest score (0.1)
    assert results[2].score == pytest.approx(0.5 * 0.6 + 0.5 * 0.1)


def test_min_score_drops_chunks_without_dense_evidence():
    per_shard = [hits(0, [0.9, 0.6], [1, 2], [10.0, 1.0], [5, 1])]
    results = dedup(gather(per_shard), 3, min_score=0.5, policy=SearchConfig(bm25_alpha=0.5))
    assert [r.chunk_idx for r in results] == [1, 2]


def test_hybrid_over_sum_fusion_and_rrf():
    kinds = ["chunk", "sentence", "sentence"]
    per_shard = [hits(0, [0.7, 0.8, 0.75], [1, 1, 2], [1.0, 3.0], [1, 2], kinds)]
    sum_policy = SearchConfig(fusion="sum", bm25_alpha=0.5)
    results = merge_hits(per_shard, 2, policy=sum_policy)[0]
    # chunk 1: sum 0.7 + 0.8 = 1.5; chunk 2: chunk floor 0.7 + 0.75 = 1.45, BM25 1.0 vs 1/3
    assert results[0].chunk_idx == 2 and results[0].score == pytest.approx(0.5 * 1.45 + 0.5 * 1.0)
    rrf_policy = SearchConfig(fusion="rrf", bm25_alpha=0.5)
    results = merge_hits(per_shard, 2, policy=rrf_policy)[0]
    # rrf: BM25 is one more ranking, weighted 1 - alpha, so the scales agree; chunk 1 tops both dense
    # lists, chunk 2 only the BM25 one
    assert results[0].chunk_idx == 1 and results[0].score == pytest.approx(0.5 * (2 / 61) + 0.5 / 62, rel=1e-6)
    assert results[1].score == pytest.approx(0.5 * (2 / 62) + 0.5 / 61, rel=1e-6)


def test_policy_and_config_carry_alpha():
    from qrag_ray.config.index import IndexConfig, SearchConfig, build_index_config
    from qrag_ray.errors import QragError

    assert SearchConfig(bm25_alpha=0.75).bm25_alpha == 0.75
    assert SearchConfig.model_validate({}).bm25_alpha is None
    with pytest.raises(QragError, match="bm25.enabled"):
        build_index_config(None, representation="chunk", **{"search.bm25_alpha": 0.7})
    with pytest.raises(QragError, match="bm25_alpha"):
        build_index_config(None, **{"search.bm25_alpha": 1.5, "bm25.enabled": True})
    config = IndexConfig.model_validate({"bm25": {"enabled": True}, "search": {"bm25_alpha": 0.6}})
    assert config.bm25.doc2query and config.search.bm25_alpha == 0.6


def test_each_chunk_carries_its_best_raw_cosine_whatever_the_fusion():
    """/v1/answer gates on this: fused scores (calibrated, rrf, hybrid) live on other scales."""
    per_shard = [hits(0, [0.62, 0.55, 0.30], [1, 1, 2], [1.0, 10.0], [1, 2],
                      kinds=["question", "sentence", "sentence"])]
    calibrated = SearchConfig(kind_bias={"question": -0.2}, bm25_alpha=0.5)
    for policy in (SearchConfig(), SearchConfig(fusion="rrf"), calibrated):
        by_chunk = {r.chunk_idx: r for r in merge_hits(per_shard, 2, policy=policy)[0]}
        assert by_chunk[1].cosine == pytest.approx(0.62) and by_chunk[2].cosine == pytest.approx(0.30)
    hybrid = {r.chunk_idx: r for r in merge_hits(per_shard, 2, policy=calibrated)[0]}
    assert hybrid[2].score > 0.30  # its fused score is not its similarity


# ------------------------------------------------------------------------- score normalisations

def test_minmax_and_zscore_put_both_lists_on_one_scale():
    from qrag_ray.search.merge import normalise

    scores, floor = normalise({1: 0.8, 2: 0.6, 3: 0.4}, 0.4, "minmax")
    assert scores == pytest.approx({1: 1.0, 2: 0.5, 3: 0.0}) and floor == 0.0
    scores, floor = normalise({1: 3.0, 2: 1.0}, 0.5, "zscore")
    assert scores == pytest.approx({1: 1.0, 2: -1.0}) and floor == pytest.approx(-1.5)
    assert normalise({1: 2.0}, 0.0, "max") == ({1: 2.0}, 0.0)
    assert normalise({1: 0.3, 2: 0.3}, 0.3, "minmax") == ({1: 1.0, 2: 1.0}, 0.0)  # no spread: all equal


def test_normalisation_changes_which_channel_decides():
    """Dense cosines bunch together (0.50-0.56) while BM25 over its best spreads over 0.2-1: dividing by
    the best lets BM25 decide at alpha 0.5; z-scores weigh the two spreads alike."""
    from qrag_ray.search.merge import Candidates, hybrid_scores

    dense = {1: 0.56, 2: 0.50, 3: 0.53}
    candidates = Candidates(np.zeros(0, np.float32), np.zeros(0, np.int64), np.zeros(0, np.int32),
                            np.zeros(0, np.int64),
                            lex_chunks=np.asarray([2, 1, 3]), lex_scores=np.asarray([1.0, 0.9, 0.2]))

    def top(norm: str) -> int:
        fused = hybrid_scores(dense, candidates, SearchConfig(fusion="sum", bm25_alpha=0.5, bm25_norm=norm))
        return max(fused.items(), key=lambda t: t[1])[0]

    assert top("max") == 2 and top("zscore") == 1
