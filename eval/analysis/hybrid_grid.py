"""Dense + BM25 fusion grid over one built index, through the real merge.

Why: choosing the hybrid default across datasets means scoring alphas x normalisations on every
dataset, and each `qrag eval` variant costs a full search pass. Here every query is searched once,
deep (`--depth` vectors and BM25 hits per shard), through the index's own searchers, and each policy
re-ranks those candidates with `qrag_ray.search.merge.dedup`, the function `qrag search` and the Serve
router merge with. Confirm the winner through the real path with `qrag suite`.

  python eval/analysis/hybrid_grid.py --index runs/suite-quick/dl19/indexes/chunk \
      --dataset beir --data $QRAG_DATA/msmarco-trec-dl19-pool --output runs/grid-dl19.json
The index must carry BM25 (bm25.enabled). Prints nDCG@10 and R@1 per policy.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.67, 0.7, 0.8, 0.9)
NORMS = ("max", "minmax", "zscore")


def policies(base) -> dict[str, object]:
    out = {"dense": replace(base, bm25_alpha=None), "bm25": replace(base, bm25_alpha=0.0)}
    for norm, alpha in itertools.product(NORMS, ALPHAS):
        out[f"{norm}@{alpha:g}"] = replace(base, bm25_alpha=alpha, bm25_norm=norm)
    out["rrf"] = replace(base, fusion="rrf", bm25_alpha=0.5)
    return out


def main(argv: list[str] | None = None) -> None:
    from qrag_ray.evaluation.loaders import load_eval_set
    from qrag_ray.evaluation.metrics import evaluate
    from qrag_ray.search.engine import SearchEngine
    from qrag_ray.search.merge import dedup, gather

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--subset", type=int)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--depth", type=int, default=200)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    eval_set = load_eval_set(args.dataset, args.data, subset=args.subset, offset=args.offset)
    search_engine = SearchEngine(args.index)
    texts = [q["text"] for q in eval_set.queries]
    qvecs = search_engine.embed(texts)
    hits = [s.search(qvecs, args.depth, texts) for s in search_engine.shards]
    cands = [gather(hits, qi) for qi in range(len(texts))]

    def doc_of(chunk_idx: int) -> str:
        """The document a chunk belongs to."""
        return search_engine.chunks.get(chunk_idx)["doc_id"]

    out = {}
    for name, pol in policies(search_engine.policy).items():
        run = {}
        for query, candidates in zip(eval_set.queries, cands, strict=True):
            seen = set()
            docs = []
            for hit in dedup(candidates, 50, policy=pol):
                doc_id = doc_of(hit.chunk_idx)
                if doc_id not in seen:
                    seen.add(doc_id)
                    docs.append(doc_id)
            run[query["qid"]] = docs
        metrics = evaluate(run, eval_set.qrels, ks=[1, 10])
        out[name] = {"nDCG@10": round(100 * metrics["nDCG@10"], 2), "R@1": round(100 * metrics["R@1"], 2)}
        print(f"{name:14s} nDCG@10 {out[name]['nDCG@10']:6.2f}  R@1 {out[name]['R@1']:6.2f}", flush=True)
    if args.output:
        with open(args.output, "w") as file:
            json.dump({"index": args.index, "data": args.data, "subset": args.subset, "results": out}, file, indent=2)


if __name__ == "__main__":
    main()
