"""Score fusion over a chunk's vectors (qrag_ray.search.merge): pure numpy, hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.config import IndexConfig, SearchConfig
from qrag_ray.index.searcher import ShardHits
from qrag_ray.representations import vector_rows
from qrag_ray.search.merge import FusionPolicy, dedup, gather, merge_hits


def hits(shard, scores, chunks, kinds, exhausted=True):
    n = len(scores)
    return ShardHits(shard, np.array([scores], np.float32), np.array([list(range(n))], np.int64),
                     np.array([chunks], np.int64), exhausted, np.array([kinds], dtype=object))


# chunk 1: one lucky sentence (0.90), nothing else; chunk 2: found by both lists (0.85 sentence, 0.84 question)
H = [hits(0, [0.90, 0.85, 0.84, 0.70, 0.60], [1, 2, 2, 3, 3], ["sentence", "sentence", "atomquote", "atomquote", "sentence"])]


def test_max_takes_the_best_vector():
    res, more = merge_hits(H, 0, 3, policy=FusionPolicy("max"))
    assert [r.chunk_idx for r in res] == [1, 2, 3]
    assert res[0].score == pytest.approx(0.90)
    assert not more


def test_rrf_rewards_chunks_found_by_several_kinds():
    res, _ = merge_hits(H, 0, 3, policy=FusionPolicy("rrf", rrf_k=60))
    # sentence ranks: 1->1, 2->2, 3->3 ; atomquote ranks: 2->1, 3->2, 1 unseen -> 3 (len+1)
    want = {1: 1 / 61 + 1 / 63, 2: 1 / 62 + 1 / 61, 3: 1 / 63 + 1 / 62}
    assert [r.chunk_idx for r in res] == [2, 1, 3]
    for r in res:
        assert r.score == pytest.approx(want[r.chunk_idx])


def test_sum_uses_floor_for_missing_kind():
    res, _ = merge_hits(H, 0, 3, policy=FusionPolicy("sum"))
    # floors: sentence 0.60 (chunk 3's best sentence is 0.60), atomquote 0.70
    want = {1: 0.90 + 0.70, 2: 0.85 + 0.84, 3: 0.60 + 0.70}
    assert [r.chunk_idx for r in res] == [2, 1, 3]
    assert res[0].score == pytest.approx(want[2], abs=1e-6)


def test_kind_weights_reorder_max_and_widen_cutoff():
    pol = FusionPolicy("max", {"atomquote": 1.1})
    res, more = merge_hits(H, 0, 2, policy=pol)
    assert [r.chunk_idx for r in res] == [2, 1]  # 0.84 * 1.1 = 0.924 > 0.90
    # a cut-off shard: an unseen vector at 0.80 could be weighted to 0.88 > the 2nd chunk's 0.90? no;
    cut = [hits(0, [0.9, 0.85], [1, 2], ["sentence", "sentence"], exhausted=False)]
    _, more = merge_hits(cut, 0, 2, policy=pol)
    assert more  # 0.85 * 1.1 = 0.935 > 0.85: a weighted unseen vector could outrank chunk 2


def test_min_score_uses_best_vector_for_every_fusion():
    for f in ("max", "rrf", "sum"):
        res, _ = merge_hits(H, 0, 3, min_score=0.8, policy=FusionPolicy(f))
        assert sorted(r.chunk_idx for r in res) == [1, 2], f


def test_policy_from_config_and_unknown_kind_rejected():
    cfg = IndexConfig(search={"fusion": "rrf", "kind_weights": {"sentence": 2.0}})
    pol = FusionPolicy.from_config(cfg.search)
    assert pol.fusion == "rrf" and pol.kind_weights == {"sentence": 2.0} and pol.max_weight == 2.0
    with pytest.raises(ValueError):
        SearchConfig(kind_weights={"nope": 1.0})


def test_gather_without_kinds_still_ranks_by_max():
    h = ShardHits(0, np.array([[0.5, 0.4]], np.float32), np.array([[0, 1]]), np.array([[7, 8]]), True)
    c = gather([h], 0)
    assert c.kinds is None
    assert [r.chunk_idx for r in dedup(c, 2)] == [7, 8]


def test_atomquote_embeds_question_with_its_atom():
    chunk = {"chunk_idx": 5, "shard": 0, "text": "A long chunk. The Eiffel Tower was completed in 1889."}
    rows = vector_rows(chunk, ["sentence", "atomquote"], ["When was the Eiffel Tower completed?"],
                       ["A long chunk.", "The Eiffel Tower was completed in 1889."],
                       atom="The Eiffel Tower was completed in 1889.")
    aq = [r for r in rows if r["kind"] == "atomquote"]
    assert len(aq) == 1 and aq[0]["embed_text"] == "When was the Eiffel Tower completed?\nThe Eiffel Tower was completed in 1889."
    assert aq[0]["text"] == "When was the Eiffel Tower completed?"
    assert sum(r["kind"] == "sentence" for r in rows) == 2
