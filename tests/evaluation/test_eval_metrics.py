"""Retrieval metrics: hand-computed cases and a cross-check against ir_measures (pytrec_eval)."""

from __future__ import annotations

import math
import random

import pytest

from qrag_ray.evaluation.metrics import (
    evaluate,
    hit_at_k,
    leaked_queries,
    mrr_at_k,
    ndcg_at_k,
    recall_at_k,
    title_accuracy_at_k,
)

# three queries, one gold doc each (SQuAD shape)
QRELS = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
RUN = {"q1": ["a", "x", "y"], "q2": ["x", "y", "b"], "q3": ["x", "y", "z"]}
TITLES = {"a": "A", "b": "B", "c": "C", "x": "B", "y": "Y", "z": "C"}


def test_recall_single_gold_is_context_accuracy():
    assert recall_at_k(RUN, QRELS, 1) == pytest.approx(1 / 3)
    assert recall_at_k(RUN, QRELS, 2) == pytest.approx(1 / 3)
    assert recall_at_k(RUN, QRELS, 3) == pytest.approx(2 / 3)
    assert hit_at_k(RUN, QRELS, 3) == pytest.approx(2 / 3)


def test_recall_multi_gold_vs_hit():
    qrels = {"q": {"a": 1, "b": 2, "c": 0}}
    run = {"q": ["a", "c", "z", "b"]}
    assert recall_at_k(run, qrels, 1) == 0.5
    assert recall_at_k(run, qrels, 3) == 0.5
    assert recall_at_k(run, qrels, 4) == 1.0
    assert hit_at_k(run, qrels, 1) == 1.0


def test_title_accuracy():
    # q1: a has title A at rank 1; q2: x has title B at rank 1; q3: z (title C) at rank 3
    assert title_accuracy_at_k(RUN, QRELS, 1, TITLES) == pytest.approx(2 / 3)
    assert title_accuracy_at_k(RUN, QRELS, 3, TITLES) == pytest.approx(1.0)
    # explicit gold titles override the qrels-derived ones
    assert title_accuracy_at_k(RUN, QRELS, 1, TITLES, gold_titles={"q1": {"Y"}, "q2": {"Y"}, "q3": {"Y"}}) == 0.0


def test_mrr_and_ndcg_hand_computed():
    assert mrr_at_k(RUN, QRELS, 10) == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert mrr_at_k(RUN, QRELS, 2) == pytest.approx(1 / 3)
    # q1 rank 1 -> 1; q2 rank 3 -> 1/log2(4) = 0.5; q3 -> 0
    assert ndcg_at_k(RUN, QRELS, 10) == pytest.approx((1 + 0.5 + 0) / 3)
    # graded: gains 1 (rank 1) + 2 (rank 3, discount 1/2) = 2; ideal 2 + 1/log2(3)
    qrels = {"q": {"a": 1, "b": 2}}
    run = {"q": ["a", "c", "b"]}
    assert ndcg_at_k(run, qrels, 10) == pytest.approx(2 / (2 + 1 / math.log2(3)))
    assert ndcg_at_k(run, qrels, 1) == pytest.approx(1 / 2)


def test_missing_and_empty_runs_are_misses_and_duplicates_ignored():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}, "q4": {"d": 0}}  # q4: nothing relevant
    run = {"q1": ["x", "x", "a"], "q2": [], "other": ["a"]}  # q3 absent; 'other' not judged
    assert recall_at_k(run, qrels, 2) == pytest.approx(1 / 3)  # duplicate x takes one rank
    assert recall_at_k(run, qrels, 1) == 0.0
    assert mrr_at_k(run, qrels) == pytest.approx(0.5 / 3)
    metrics = evaluate(run, qrels, ks=(1, 2))
    assert metrics["R@2"] == pytest.approx(1 / 3)
    assert recall_at_k({}, {}, 1) == 0.0


def test_evaluate_keys_and_values():
    metrics = evaluate(RUN, QRELS, doc_titles=TITLES)
    for k in (1, 2, 5, 10, 20):
        assert f"R@{k}" in metrics and f"T@{k}" in metrics and f"Hit@{k}" in metrics
    assert {"MRR@10", "nDCG@10"} <= set(metrics)
    assert metrics["R@1"] == pytest.approx(1 / 3)
    assert metrics["T@1"] == pytest.approx(2 / 3)
    assert all(0.0 <= v <= 1.0 for v in metrics.values())
    # no titles -> no T@k
    assert not any(k.startswith("T@") for k in evaluate(RUN, QRELS))
    assert not any(k.startswith("T@") for k in evaluate(RUN, QRELS, doc_titles={d: "" for d in TITLES}))
    with pytest.raises(ValueError):
        recall_at_k(RUN, QRELS, 0)


def _random_case(seed: int):
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(60)]
    qrels = {}
    run = {}
    for number in range(80):
        qid = f"q{number}"
        n_rel = rng.choice([1, 1, 1, 2, 3, 5])
        judged = rng.sample(docs, n_rel + rng.randint(0, 3))
        qrels[qid] = {d: (rng.randint(1, 3) if i < n_rel else 0) for i, d in enumerate(judged)}
        run[qid] = rng.sample(docs, rng.randint(1, 25))  # non-empty: pytrec_eval skips queries without a run
    return run, qrels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_ir_measures(seed):
    import ir_measures  # a dev dependency: the cross-check must run, never skip
    from ir_measures import RR, R, nDCG

    run, qrels = _random_case(seed)
    # ir_measures ranks by score (descending); give strictly decreasing scores in our rank order
    scored = {q: {d: float(len(docs) - i) for i, d in enumerate(docs)} for q, docs in run.items()}
    ref = ir_measures.calc_aggregate([R @ 5, R @ 20, RR @ 10, nDCG @ 10, nDCG @ 3], qrels, scored)
    ours = evaluate(run, qrels, ks=(5, 20))
    assert abs(ours["R@5"] - ref[R @ 5]) < 1e-9
    assert abs(ours["R@20"] - ref[R @ 20]) < 1e-9
    assert abs(ours["MRR@10"] - ref[RR @ 10]) < 1e-9
    assert abs(ours["nDCG@10"] - ref[nDCG @ 10]) < 1e-9
    assert abs(ndcg_at_k(run, qrels, 3) - ref[nDCG @ 3]) < 1e-9


def test_leakage_check():
    queries = [{"qid": "1", "text": "Who won Super Bowl 50?"}, {"qid": "2", "text": "Where is it?"}]
    assert leaked_queries(["who won super bowl 50", "something else?"], queries) == ["1"]
    assert leaked_queries([], queries) == []
