"""How much a lexical (BM25) channel adds to the dense presets, and how much the generated questions add
to it (doc2query: the chunk's BM25 text expanded with its questions), like for like on one built index.

Why this exists: to tell what a small generator's questions are worth once a lexical channel is there.
SQuAD questions were written by annotators reading the paragraph, so they share its words: a lexical
channel is the biggest lever on this data. So every dense configuration is paired
with BM25 over the chunk alone and BM25 over chunk + questions. The BM25 weight is chosen on the
even-numbered articles and reported on the odd ones, as in fusion_grid.py. The product's hybrid
search (bm25.enabled + search.bm25_alpha; EVALUATION.md §4.8) reproduces these figures through the
real index and search path; this script stays the place to choose the weight.

  python eval/analysis/lexical_channel.py --index runs/i6-fewshot3-full/indexes/atom-hybrid \
      --data $QRAG_DATA/squad-v1.1/dev-v1.1.json --output runs/i9-lexical.json
For a slice index add the `--offset/--subset` it was built with. An index without question vectors
(e.g. `chunk+sentence`) gives the no-LLM rows only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from fusion_grid import fused, load_matrices, parity_halves, split_metrics

WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.7)


def bm25_matrix(doc_texts: list[str], queries: list[str]) -> np.ndarray:
    """(queries, docs) BM25 scores over English-stopworded tokens, divided by each query's best score so
    one weight fits every query (raw BM25 scales with query length)."""
    import bm25s

    from qrag_ray.index.lexical import tokenize  # the product's tokenisation, so the figures carry over

    ret = bm25s.BM25()
    ret.index(tokenize(doc_texts, ids=True), show_progress=False)
    toks = tokenize(queries, ids=False)
    scores = np.stack([ret.get_scores(t) for t in toks]).astype(np.float32)
    return scores / np.maximum(scores.max(1, keepdims=True), 1e-6)


def dense_configs(mats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The dense presets the index can score (EVALUATION.md §4.6 for the calibrated one)."""
    out = {"chunk": mats["chunk"], "atom-sentence": fused(mats, 0.0, {}),
           "chunk x0.5 + sentence (no LLM)": fused(mats, 0.5, {})}
    if "question" in mats and "quote" in mats:
        out["atom-hybrid (calibrated)"] = fused(mats, 0.5, {"question": -0.2, "quote": -0.05})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--data", required=True, help="SQuAD v1.1 JSON the index was built from")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--subset", type=int, default=None)
    parser.add_argument("--output", required=True, help="JSON file for the table")
    args = parser.parse_args()

    mats, gold, article, eval_set = load_matrices(Path(args.index), args.data, args.offset, args.subset)
    halves = parity_halves(article)
    qtexts = [q["text"] for q in eval_set["queries"]]
    lexical = {"bm25(chunk)": bm25_matrix([d["text"] for d in eval_set["corpus"]], qtexts)}
    if any(eval_set["questions"]):
        lexical["bm25(chunk+questions)"] = bm25_matrix(
            [d["text"] + "\n" + "\n".join(qs) for d, qs in zip(eval_set["corpus"], eval_set["questions"], strict=True)],
            qtexts)

    def score(label, dense, weight=None):
        return {"label": label, "w_bm25": weight, **split_metrics(dense, gold, halves)}

    rows = [score(name, B) for name, B in lexical.items()]
    for dname, dense in dense_configs(mats).items():
        rows.append(score(dname, dense))
        for lname, lexical_scores in lexical.items():
            cands = [score(f"{dname} + w*{lname}", dense + w * lexical_scores, w) for w in WEIGHTS]
            rows.append(max(cands, key=lambda r: (r["even"]["R@1"], r["even"]["MRR@10"])))
    print(f"{'configuration (BM25 weight chosen on even articles)':64s} {'w':>4s} {'even R@1':>8s} "
          f"{'odd R@1':>8s} {'all R@1':>8s} {'all R@5':>8s} {'all MRR':>8s}")
    for row in rows:
        weight = f"{row['w_bm25']:.1f}" if row["w_bm25"] is not None else ""
        print(f"{row['label']:64s} {weight:>4s} {row['even']['R@1']:8.1f} {row['odd']['R@1']:8.1f} "
              f"{row['all']['R@1']:8.1f} {row['all']['R@5']:8.1f} {row['all']['MRR@10']:8.1f}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"index": args.index, "offset": args.offset, "subset": args.subset,
                                             "queries": len(gold), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
