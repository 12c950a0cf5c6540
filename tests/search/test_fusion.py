"""Score fusion over a chunk's vectors (qrag_ray.search.merge): pure numpy, hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.config.index import IndexConfig, SearchConfig
from qrag_ray.index.representations import vector_rows
from qrag_ray.search.merge import Hits, dedup, gather, merge_hits


def hits(shard, scores, chunks, kinds, exhausted=True):
    n = len(scores)
    return Hits(shard, np.array(scores, np.float32), np.arange(n, dtype=np.int64),
                np.array(chunks, np.int64), exhausted, np.array(kinds, dtype=object))


# chunk 1: one lucky sentence (0.90), nothing else; chunk 2: found by both lists (0.85 sentence, 0.84 question)
SENTENCE_AND_ATOM = [hits(0, [0.90, 0.85, 0.84, 0.70, 0.60], [1, 2, 2, 3, 3],
                          ["sentence", "sentence", "atomquote", "atomquote", "sentence"])]


def test_max_takes_the_best_vector():
    results, more = merge_hits(SENTENCE_AND_ATOM, 3, policy=SearchConfig(fusion="max"))
    assert [r.chunk_idx for r in results] == [1, 2, 3]
    assert results[0].score == pytest.approx(0.90)
    assert not more


def test_rrf_rewards_chunks_found_by_several_kinds():
    results, _ = merge_hits(SENTENCE_AND_ATOM, 3, policy=SearchConfig(fusion="rrf", rrf_k=60))
    # sentence ranks: 1->1, 2->2, 3->3 ; atomquote ranks: 2->1, 3->2, 1 unseen -> 3 (len+1)
    want = {1: 1 / 61 + 1 / 63, 2: 1 / 62 + 1 / 61, 3: 1 / 63 + 1 / 62}
    assert [r.chunk_idx for r in results] == [2, 1, 3]
    for result in results:
        assert result.score == pytest.approx(want[result.chunk_idx])


def test_sum_uses_floor_for_missing_kind():
    results, _ = merge_hits(SENTENCE_AND_ATOM, 3, policy=SearchConfig(fusion="sum"))
    # floors: sentence 0.60 (chunk 3's best sentence is 0.60), atomquote 0.70
    want = {1: 0.90 + 0.70, 2: 0.85 + 0.84, 3: 0.60 + 0.70}
    assert [r.chunk_idx for r in results] == [2, 1, 3]
    assert results[0].score == pytest.approx(want[2], abs=1e-6)


def test_kind_weights_reorder_max_and_widen_cutoff():
    policy = SearchConfig(fusion="max", kind_weights={"atomquote": 1.1})
    results, more = merge_hits(SENTENCE_AND_ATOM, 2, policy=policy)
    assert [r.chunk_idx for r in results] == [2, 1]  # 0.84 * 1.1 = 0.924 > 0.90
    # a cut-off shard: an unseen vector at 0.80 could be weighted to 0.88 > the 2nd chunk's 0.90? no;
    cut = [hits(0, [0.9, 0.85], [1, 2], ["sentence", "sentence"], exhausted=False)]
    _, more = merge_hits(cut, 2, policy=policy)
    assert more  # 0.85 * 1.1 = 0.935 > 0.85: a weighted unseen vector could outrank chunk 2


def test_min_score_uses_best_vector_for_every_fusion():
    for fusion in ("max", "rrf", "sum"):
        results, _ = merge_hits(SENTENCE_AND_ATOM, 3, min_score=0.8, policy=SearchConfig(fusion=fusion))
        assert sorted(r.chunk_idx for r in results) == [1, 2], fusion


def test_policy_from_config_and_unknown_kind_rejected():
    config = IndexConfig(search={"fusion": "rrf", "kind_weights": {"sentence": 2.0}})
    policy = config.search
    assert policy.fusion == "rrf" and policy.kind_weights == {"sentence": 2.0} and policy.bound(0.5) == 1.0
    with pytest.raises(ValueError):
        SearchConfig(kind_weights={"nope": 1.0})


def test_gather_without_kinds_still_ranks_by_max():
    shard_hits = Hits(0, np.array([0.5, 0.4], np.float32), np.array([0, 1]), np.array([7, 8]), True)
    candidates = gather([shard_hits])
    assert candidates.kinds is None
    assert [r.chunk_idx for r in dedup(candidates, 2)] == [7, 8]


def test_atomquote_embeds_question_with_its_atom():
    chunk = {"chunk_idx": 5, "shard": 0, "text": "A long chunk. The Eiffel Tower was completed in 1889."}
    rows = vector_rows(chunk, ["sentence", "atomquote"], ["When was the Eiffel Tower completed?"],
                       ["A long chunk.", "The Eiffel Tower was completed in 1889."],
                       atom="The Eiffel Tower was completed in 1889.")
    atomquote = [r for r in rows if r["kind"] == "atomquote"]
    assert len(atomquote) == 1
    assert atomquote[0]["embed_text"] == "When was the Eiffel Tower completed?\nThe Eiffel Tower was completed in 1889."
    assert atomquote[0]["text"] == "When was the Eiffel Tower completed?"
    assert sum(r["kind"] == "sentence" for r in rows) == 2


# chunk 1: a sentence at 0.80 and a chunk vector at 0.50; chunk 2: a generic question at 0.88, sentence 0.60,
# chunk vector 0.55. Question-question cosines run high, so chunk 2 wins any uncalibrated max.
WITH_QUESTIONS = [hits(0, [0.88, 0.80, 0.60, 0.55, 0.50], [2, 1, 2, 2, 1],
                       ["question", "sentence", "sentence", "chunk", "chunk"])]
GROUPED = {"atom": ("sentence", "question")}


def test_kind_bias_makes_a_question_clear_its_sentence_by_a_margin():
    assert [r.chunk_idx for r in merge_hits(WITH_QUESTIONS, 2, policy=SearchConfig(fusion="max"))[0]] == [2, 1]
    results, _ = merge_hits(WITH_QUESTIONS, 2, policy=SearchConfig(fusion="max", kind_bias={"question": -0.1}))
    assert [r.chunk_idx for r in results] == [1, 2]  # 0.88 - 0.1 = 0.78 < 0.80
    assert results[1].score == pytest.approx(0.78)


def test_groups_count_the_best_of_their_kinds_once_then_sum_with_the_rest():
    policy = SearchConfig(fusion="sum", kind_weights={"chunk": 0.5}, kind_bias={"question": -0.2}, groups=GROUPED)
    results, _ = merge_hits(WITH_QUESTIONS, 2, policy=policy)
    # chunk 1: 0.5*0.50 + max(0.80)               = 1.05
    # chunk 2: 0.5*0.55 + max(0.60, 0.88 - 0.2)   = 0.275 + 0.68 = 0.955
    assert [r.chunk_idx for r in results] == [1, 2]
    assert [r.score for r in results] == pytest.approx([1.05, 0.955])
    # without the group, sentence and question are summed as two kinds: chunk 2's question floor-pads chunk 1
    ungrouped = SearchConfig(fusion="sum", kind_weights={"chunk": 0.5}, kind_bias={"question": -0.2})
    ungrouped_results, _ = merge_hits(WITH_QUESTIONS, 2, policy=ungrouped)
    assert len(ungrouped_results) == 2
    assert [r.score for r in ungrouped_results] != pytest.approx([1.05, 0.955])


def test_rrf_ranks_a_group_as_one_list():
    results, _ = merge_hits(WITH_QUESTIONS, 2, policy=SearchConfig(fusion="rrf", rrf_k=60, groups=GROUPED))
    # atom list: chunk 2 (0.88) then chunk 1 (0.80); chunk list: chunk 2 (0.55) then chunk 1 (0.50)
    assert [r.chunk_idx for r in results] == [2, 1]
    assert results[0].score == pytest.approx(2 / 61) and results[1].score == pytest.approx(2 / 62)


def test_cutoff_bound_covers_every_calibrated_kind():
    policy = SearchConfig(fusion="max", kind_weights={"chunk": 0.5, "quote": 1.2},
                          kind_bias={"question": -0.2, "quote": 0.05})
    assert policy.bound(0.5) == pytest.approx(0.65)  # quote: 1.2 * 0.5 + 0.05
    assert SearchConfig(fusion="max", kind_bias={"question": -0.2}).bound(-0.3) == pytest.approx(-0.3)  # default kind
    cut = [hits(0, [0.80, 0.70], [1, 2], ["sentence", "sentence"], exhausted=False)]
    assert not merge_hits(cut, 2, policy=SearchConfig(fusion="max", kind_bias={"question": -0.2}))[1]
    assert merge_hits(cut, 2, policy=SearchConfig(fusion="max", kind_bias={"question": 0.2}))[1]  # 0.7+0.2 > 0.7


def test_search_config_groups_and_bias_validated_and_carried_to_the_policy():
    config = IndexConfig(search={"fusion": "sum", "kind_bias": {"question": -0.2},
                                 "groups": {"atom": ["sentence", "question"]}})
    policy = config.search
    assert policy.kind_bias == {"question": -0.2} and policy.groups == {"atom": ["sentence", "question"]}
    assert policy.group_of("question") == "atom" and policy.group_of("chunk") == "chunk"
    for bad in ({"groups": {"a": ["sentence"], "b": ["sentence", "question"]}},  # a kind in two groups
                {"groups": {"chunk": ["sentence", "question"]}},  # group named like a kind
                {"groups": {"atom": []}},
                {"groups": {"atom": ["nope"]}},
                {"kind_bias": {"nope": 0.1}},
                {"kind_bias": {"question": -5.0}}):
        with pytest.raises(ValueError):
            SearchConfig(**bad)
