"""What a forward-pass precision costs in rankings: the real MiniLM on CPU, SQuAD dev's first contexts
as the corpus and their questions as queries, exact cosine search (numpy), nDCG@10 / R@1 / MRR@10 per
dtype against float32, plus how far the vectors move. CPU bfloat16/float16 round like a GPU's do
(TF32 is CUDA only, and closer to float32 than both).

    python benchmarks/bench_embed_precision.py --squad /work/shared/data/squad-v1.1/dev-v1.1.json \
        --contexts 300 --out runs/bench_embed_precision.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def squad(path: str, contexts: int) -> tuple[list[str], list[str], list[int]]:
    """(contexts, questions, the context index each question was written for)."""
    ctx, qs, gold = [], [], []
    for art in json.loads(Path(path).read_text())["data"]:
        for p in art["paragraphs"]:
            if len(ctx) == contexts:
                return ctx, qs, gold
            ctx.append(p["context"])
            for qa in p["qas"]:
                qs.append(qa["question"])
                gold.append(len(ctx) - 1)
    return ctx, qs, gold


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--squad", required=True, help="SQuAD v1.1 dev JSON")
    ap.add_argument("--contexts", type=int, default=300)
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/bench_embed_precision.json")
    a = ap.parse_args()

    import torch

    from qrag_ray.embedding import Forward, load_sentence_transformer
    from qrag_ray.embedding.tokens import token_ids
    from qrag_ray.evaluation.metrics import mrr_at_k, ndcg_at_k, recall_at_k

    torch.set_num_threads(a.threads)
    ctx, qs, gold = squad(a.squad, a.contexts)
    qrels = {str(i): {str(g): 1} for i, g in enumerate(gold)}
    res = {"command": " ".join([Path(sys.executable).name] + sys.argv), "contexts": len(ctx), "questions": len(qs),
           "cpus": os.cpu_count(), "dtypes": {}}
    ref = None
    for dt in a.dtypes.split(","):
        st = load_sentence_transformer("all-MiniLM-L6-v2", device="cpu", dtype=dt, backend="torch")
        fwd = Forward(st, tokens_per_batch=8192)
        t = time.perf_counter()
        vec = {name: fwd(*token_ids(st.tokenizer, texts, int(st.max_seq_length))) for name, texts in
               (("contexts", ctx), ("questions", qs))}
        secs = time.perf_counter() - t
        top = np.argsort(-(vec["questions"] @ vec["contexts"].T), axis=1, kind="stable")[:, :10]
        run = {str(i): [str(d) for d in row] for i, row in enumerate(top)}
        r = {"nDCG@10": ndcg_at_k(run, qrels, 10), "R@1": recall_at_k(run, qrels, 1),
             "MRR@10": mrr_at_k(run, qrels, 10), "seconds": round(secs, 1)}
        if ref is None:
            ref = (vec, top)
        else:
            both = np.concatenate([vec["contexts"], vec["questions"]])
            base = np.concatenate([ref[0]["contexts"], ref[0]["questions"]])
            r |= {"max_abs_diff": float(np.abs(both - base).max()), "min_cosine": float((both * base).sum(1).min()),
                  "top1_same": float(np.mean(top[:, 0] == ref[1][:, 0])),
                  "top10_same_set": float(np.mean([set(x) == set(y) for x, y in zip(top, ref[1])]))}
        res["dtypes"][dt] = r
        print(dt, {k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
