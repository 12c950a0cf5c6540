"""Retrieval metrics over ranked runs (pure functions; fractions in [0, 1]): `run` is {qid: [doc_id, ...]}
best first, `qrels` {qid: {doc_id: grade}}. The conventions (distinct documents, which queries average,
linear-gain nDCG as trec_eval cuts it) are in docs/EVALUATION.md, "How the metrics are computed".
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

from qrag_ray.index.representations import norm_question

Run = Mapping[str, Sequence[str]]
Qrels = Mapping[str, Mapping[str, int]]

DEFAULT_KS = (1, 2, 5, 10, 20)


def _ranked(docs: Sequence[str] | None, k: int) -> list[str]:
    """First k distinct doc ids of a ranking."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return list(dict.fromkeys(docs or ()))[:k]


def _relevant(qrels: Qrels) -> dict[str, set[str]]:
    """{qid: its relevant documents} for the queries the averages run over (those with one)."""
    return {q: rel for q, rels in qrels.items() if (rel := {d for d, g in rels.items() if g > 0})}


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def recall_at_k(run: Run, qrels: Qrels, k: int) -> float:
    """Mean fraction of each query's relevant documents found in its top k (= C@k with one gold doc)."""
    return _mean([len(rel & set(_ranked(run.get(q), k))) / len(rel) for q, rel in _relevant(qrels).items()])


def hit_at_k(run: Run, qrels: Qrels, k: int) -> float:
    """Fraction of queries with at least one relevant document in the top k (success@k)."""
    return _mean([1.0 if rel & set(_ranked(run.get(q), k)) else 0.0 for q, rel in _relevant(qrels).items()])


def gold_titles_from_qrels(qrels: Qrels, doc_titles: Mapping[str, str],
                           gold_titles: Mapping[str, Iterable[str]] | None = None) -> dict[str, set[str]]:
    """{qid: non-empty gold titles}: `gold_titles` when given, else the titles of its relevant documents."""
    if gold_titles is None:
        gold_titles = {q: {doc_titles.get(d) for d, g in rels.items() if g > 0} for q, rels in qrels.items()}
    return {q: set(t) - {"", None} for q, t in gold_titles.items()}


def title_accuracy_at_k(run: Run, qrels: Qrels, k: int, doc_titles: Mapping[str, str],
                        gold_titles: Mapping[str, Iterable[str]] | None = None) -> float:
    """T@k: fraction of queries for which any of the top k documents shares a gold title, over the judged
    queries that have one (0.0 when none has)."""
    gold = gold_titles_from_qrels(qrels, doc_titles, gold_titles)
    return _mean([1.0 if any((doc_titles.get(d) or "") in gold[q] for d in _ranked(run.get(q), k)) else 0.0
                  for q in _relevant(qrels) if gold.get(q)])


def mrr_at_k(run: Run, qrels: Qrels, k: int = 10) -> float:
    """Mean reciprocal rank of the first relevant document within the top k (0 when none)."""
    return _mean([next((1.0 / i for i, d in enumerate(_ranked(run.get(q), k), 1) if d in rel), 0.0)
                  for q, rel in _relevant(qrels).items()])


def ndcg_at_k(run: Run, qrels: Qrels, k: int = 10) -> float:
    """Mean nDCG@k with graded gains (grade), log2 discount, ideal ranking from the qrels."""
    vals = []
    for qid in _relevant(qrels):
        rels = qrels[qid]
        dcg = sum(max(rels.get(d, 0), 0) / math.log2(i + 1) for i, d in enumerate(_ranked(run.get(qid), k), 1))
        ideal = sorted((g for g in rels.values() if g > 0), reverse=True)[:k]
        idcg = sum(g / math.log2(i + 1) for i, g in enumerate(ideal, 1))
        vals.append(dcg / idcg if idcg > 0 else 0.0)
    return _mean(vals)


def evaluate(run: Run, qrels: Qrels, ks: Sequence[int] = DEFAULT_KS, doc_titles: Mapping[str, str] | None = None,
             gold_titles: Mapping[str, Iterable[str]] | None = None,
             mrr_k: int = 10, ndcg_k: int = 10) -> dict[str, float]:
    """All metrics as fractions: "R@k", "Hit@k" for each k, "T@k" for each k when titles are known
    (doc_titles given and some gold document has a title), "MRR@{mrr_k}", "nDCG@{ndcg_k}"."""
    ks = sorted(set(int(k) for k in ks))
    out = {f"R@{k}": recall_at_k(run, qrels, k) for k in ks} | {f"Hit@{k}": hit_at_k(run, qrels, k) for k in ks}
    if doc_titles is not None:
        gold = gold_titles_from_qrels(qrels, doc_titles, gold_titles)
        if any(gold.get(q) for q in _relevant(qrels)):
            out |= {f"T@{k}": title_accuracy_at_k(run, qrels, k, doc_titles, gold) for k in ks}
    return out | {f"MRR@{mrr_k}": mrr_at_k(run, qrels, mrr_k), f"nDCG@{ndcg_k}": ndcg_at_k(run, qrels, ndcg_k)}


def leaked_queries(generated: Iterable[str], queries: Iterable[Mapping[str, str]]) -> list[str]:
    """QuOTE §3.2.5 leakage check: qids of evaluation queries that equal a generated question
    (case, punctuation and whitespace ignored)."""
    gen = {norm_question(g) for g in generated if g} - {""}  # the rule the index's question dedup uses
    return [q["qid"] for q in queries if norm_question(q["text"]) in gen]
