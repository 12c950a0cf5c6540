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
    for norm, a in itertools.product(NORMS, ALPHAS):
        out[f"{norm}@{a:g}"] = replace(base, bm25_alpha=a, bm25_norm=norm)
    out["rrf"] = replace(base, fusion="rrf", bm25_alpha=0.5)
    return out


def main(argv: list[str] | None = None) -> None:
    from qrag_ray.evaluation.loaders import load_eval_set
    from qrag_ray.evaluation.metrics import evaluate
    from qrag_ray.search.engine import SearchEngine
    from qrag_ray.search.merge import dedup, gather

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--subset", type=int)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--depth", type=int, default=200)
    ap.add_argument("--output")
    a = ap.parse_args(argv)
    ev = load_eval_set(a.dataset, a.data, subset=a.subset, offset=a.offset)
    eng = SearchEngine(a.index)
    texts = [q["text"] for q in ev.queries]
    qvecs = eng.embed(texts)
    hits = [s.search(qvecs, a.depth, texts) for s in eng.shards]
    cands = [gather(hits, qi) for qi in range(len(texts))]
    doc = lambda ci: eng.chunks.get(ci)["doc_id"]  # noqa: E731
    out = {}
    for name, pol in policies(eng.policy).items():
        run = {}
        for q, c in zip(ev.queries, cands, strict=True):
            seen, docs = set(), []
            for r in dedup(c, 50, policy=pol):
                d = doc(r.chunk_idx)
                if d not in seen:
                    seen.add(d)
                    docs.append(d)
            run[q["qid"]] = docs
        m = evaluate(run, ev.qrels, ks=[1, 10])
        out[name] = {"nDCG@10": round(100 * m["nDCG@10"], 2), "R@1": round(100 * m["R@1"], 2)}
        print(f"{name:14s} nDCG@10 {out[name]['nDCG@10']:6.2f}  R@1 {out[name]['R@1']:6.2f}", flush=True)
    if a.output:
        with open(a.output, "w") as f:
            json.dump({"index": a.index, "data": a.data, "subset": a.subset, "results": out}, f, indent=2)


if __name__ == "__main__":
    main()
