"""BM25 alone on a BEIR folder, straight through bm25s with the package's tokenizer: stemming x (k1, b).

Why: a BM25 channel that scores under Lucene's on the TREC DL19 pool is a tokenizer or parameter
difference; this grid shows which of stemming and Lucene's parameters closes the gap (docs/EVALUATION.md,
"BM25 as Lucene runs it"). `qrag suite --configs bm25` confirms the shipped setting through the real index and merge.

  python eval/analysis/bm25_params.py --data $QRAG_DATA/msmarco-trec-dl19-pool
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv: list[str] | None = None) -> None:
    import bm25s

    from qrag_ray.evaluation.loaders import load_beir
    from qrag_ray.evaluation.metrics import ndcg_at_k
    from qrag_ray.index.lexical import tokenize

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="BEIR folder")
    args = parser.parse_args(argv)
    eval_set = load_beir(args.data)
    ids = [d["doc_id"] for d in eval_set.corpus]
    for stemmer in (None, "english"):
        docs = tokenize([d["text"] for d in eval_set.corpus], ids=True, stemmer=stemmer)
        qtoks = tokenize([q["text"] for q in eval_set.queries], ids=False, stemmer=stemmer)
        for k1, b in ((1.5, 0.75), (1.2, 0.75), (0.9, 0.4)):
            retriever = bm25s.BM25(k1=k1, b=b)
            retriever.index(docs, show_progress=False)
            run = {q["qid"]: [ids[i] for i in np.argsort(-retriever.get_scores(t), kind="stable")[:10]]
                   for q, t in zip(eval_set.queries, qtoks, strict=True)}
            ndcg = 100 * ndcg_at_k(run, eval_set.qrels, 10)
            print(f"stemmer={stemmer or 'none':8s} k1={k1:<4} b={b:<5} nDCG@10 {ndcg:.1f}")


if __name__ == "__main__":
    main()
