"""Dense fusion grid over one built index, with a split by article so the choice is made on one half.

Why this exists: fusion choices (weights, per-kind offsets, groups) need no re-index, but scoring each
one through `qrag eval` costs a search pass per variant. Here every query is scored against every vector
once (exact, dense: SQuAD dev is 10,570 x ~20k), reduced to one score matrix per kind and chunk, and the
grid is pure numpy. Choose on the even-numbered articles, report the odd ones: the session-5..7 recipes
were tuned on the first articles and their gains did not carry to the rest of the dev set.
Confirm the winner through the real search path with `qrag eval --variants` (EVALUATION.md §4.6).

  python eval/analysis/fusion_grid.py --index runs/i6-fewshot3-full/indexes/atom-hybrid \
      --data $QRAG_DATA/squad-v1.1/dev-v1.1.json --output runs/i6-fusion-grid.json
The index must hold chunk and sentence vectors; question settings are searched when it also holds
question or quote vectors (`atom-hybrid`, v1 or calibrated: bare questions missing from v1 are the quote
rows' text, embedded here with the index's embedder). `--windows` adds two-sentence windows (no LLM) to
the atom group; `--offset/--subset` take a slice index as `qrag eval` built it (EVALUATION.md §4.7).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np


def chunk_max(query_vecs: np.ndarray, vecs: np.ndarray, docs: np.ndarray, n_docs: int) -> np.ndarray:
    """(queries, docs) best score of each doc's vectors; -inf where a doc has none."""
    out = np.full((len(query_vecs), n_docs), -np.inf, np.float32)
    order = np.argsort(docs, kind="stable")
    sorted_docs = docs[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_docs)) + 1]
    out[:, sorted_docs[starts]] = np.maximum.reduceat(query_vecs @ vecs[order].T, starts, axis=1)
    return out


def rank_metrics(scores: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """R@1, R@5, MRR@10 (percent) with one gold doc per query; a tie with the gold doc ranks below it."""
    gold_scores = scores[np.arange(len(gold)), gold][:, None]
    rank = (gold_scores < scores).sum(1) + 1
    return {"R@1": 100 * float((rank == 1).mean()), "R@5": 100 * float((rank <= 5).mean()),
            "MRR@10": 100 * float(np.where(rank <= 10, 1.0 / rank, 0.0).mean())}


def parity_halves(article: np.ndarray) -> dict[str, np.ndarray]:
    """Query masks: even-numbered articles (choose here), odd ones (report here), and all."""
    return {"even": article % 2 == 0, "odd": article % 2 == 1, "all": np.ones(len(article), bool)}


def split_metrics(scores: np.ndarray, gold: np.ndarray, halves: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    return {h: rank_metrics(scores[m], gold[m]) for h, m in halves.items()}


def fused(mats: dict[str, np.ndarray], w_chunk: float, biases: dict[str, float | None]) -> np.ndarray:
    """w_chunk * chunk + max(sentence, kind + bias for each kind in `biases`); a None bias leaves it out."""
    atom = mats["sentence"]
    for kind, bias in biases.items():
        if bias is not None:
            atom = np.maximum(atom, mats[kind] + bias)
    return w_chunk * mats["chunk"] + atom if w_chunk else atom


def corpus_windows(corpus: list[dict]) -> tuple[list[str], np.ndarray]:
    """The `window` vectors the index would hold for every doc, with their doc positions."""
    from qrag_ray.index.representations import sentence_windows
    from qrag_ray.text.sentences import split_sentences

    texts = []
    docs = []
    for i, document in enumerate(corpus):
        windows = sentence_windows(split_sentences(document["text"]))
        texts += windows
        docs += [i] * len(windows)
    return texts, np.array(docs, dtype=np.int64)


def load_matrices(idx_dir: Path, data: str, offset: int = 0, subset: int | None = None, windows: bool = False):
    """Dense (queries, docs) best-score matrices per vector kind of a built SQuAD index, plus the gold doc
    and article number of each query and each doc's generated questions. Bare questions are re-embedded
    from the quote rows when the index stores none; kinds the index lacks are simply absent."""
    import faiss
    import pyarrow.parquet as pq

    from qrag_ray.embedding import encode, load_sentence_transformer
    from qrag_ray.evaluation.loaders import load_squad
    from qrag_ray.index.format import load_manifest, shard_faiss, shard_meta

    man = load_manifest(idx_dir)
    eval_set = load_squad(data, subset=subset, offset=offset)
    doc_pos = {d["doc_id"]: i for i, d in enumerate(eval_set.corpus)}
    chunks = pq.read_table(idx_dir / "chunks.parquet", columns=["chunk_idx", "doc_id"]).to_pydict()
    chunk_doc = dict(zip(chunks["chunk_idx"], chunks["doc_id"], strict=True))
    vecs = []
    docs = []
    kinds = []
    texts = []
    for shard in range(man.num_shards):
        index = faiss.read_index(str(idx_dir / shard_faiss(shard)))
        vecs.append(index.reconstruct_n(0, index.ntotal))
        rows = pq.read_table(idx_dir / shard_meta(shard), columns=["chunk_idx", "kind", "text"]).to_pydict()
        docs += [doc_pos[chunk_doc[c]] for c in rows["chunk_idx"]]
        kinds += rows["kind"]
        texts += rows["text"]
    all_vecs = np.concatenate(vecs)
    docs = np.array(docs)
    kinds = np.array(kinds)
    model = load_sentence_transformer(man.data["embedder"]["model"])
    query_vecs = encode(model, [q["text"] for q in eval_set.queries])
    n_docs = len(eval_set.corpus)
    # a doc without a vector of some kind must not be lifted by it: -inf stays out of the max
    mats = {k: chunk_max(query_vecs, all_vecs[kinds == k], docs[kinds == k], n_docs)
            for k in sorted(set(kinds.tolist()))}
    qkind = "question" if "question" in mats else "quote"
    qmask = kinds == qkind
    if "quote" in mats and "question" not in mats:
        bare = encode(model, np.array(texts, dtype=object)[qmask].tolist())
        mats["question"] = chunk_max(query_vecs, bare, docs[qmask], n_docs)
    if windows and "window" not in mats:  # not in the index: embedded here with its embedder
        wtexts, wdocs = corpus_windows(eval_set.corpus)
        mats["window"] = chunk_max(query_vecs, encode(model, wtexts), wdocs, n_docs)
    questions: list[list[str]] = [[] for _ in range(n_docs)]
    for doc, text in zip(docs[qmask].tolist(), np.array(texts, dtype=object)[qmask].tolist(), strict=True):
        questions[doc].append(text)
    gold = np.array([doc_pos[next(iter(eval_set.qrels[q["qid"]]))] for q in eval_set.queries])
    # article number in the file, from doc_id "{article:03d}-{paragraph:03d}": the same split for any slice
    article = np.array([int(eval_set.corpus[g]["doc_id"].split("-")[0]) for g in gold])
    return mats, gold, article, {"corpus": eval_set.corpus, "queries": eval_set.queries, "questions": questions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--data", required=True, help="SQuAD v1.1 JSON the index was built from (full dev)")
    parser.add_argument("--offset", type=int, default=0, help="as the index was built (`qrag eval --offset`)")
    parser.add_argument("--subset", type=int, default=None, help="as the index was built (`qrag eval --subset`)")
    parser.add_argument("--windows", action="store_true", help="add two-sentence windows to the atom group")
    parser.add_argument("--output", required=True, help="JSON file for the grid")
    args = parser.parse_args()

    mats, gold, article, _ = load_matrices(Path(args.index), args.data, args.offset, args.subset, args.windows)
    halves = parity_halves(article)

    grid = [("atom-sentence", 0.0, {})]

    def options(kind: str, values: tuple) -> tuple:
        """The values to try for a kind's bias: none (None) when the index has no vectors of it."""
        return values if kind in mats else (None,)

    for chunk_weight, question_bias, quote_bias, window_bias in itertools.product(
            (0.3, 0.5, 0.7, 1.0), options("question", (None, -0.1, -0.15, -0.2, -0.25)),
            options("quote", (None, 0.0, -0.05, -0.1)), options("window", (None, 0.0, -0.02, -0.05))):
        biases = {"question": question_bias, "quote": quote_bias, "window": window_bias}
        parts = ["sentence"] + [f"{k}{b:+}" for k, b in biases.items() if b is not None]
        grid.append((f"chunk x{chunk_weight} + max({', '.join(parts)})", chunk_weight, biases))
    rows = []
    for label, chunk_weight, biases in grid:
        scores = fused(mats, chunk_weight, biases)
        rows.append({"label": label, "w_chunk": chunk_weight, **{f"bias_{k}": b for k, b in biases.items()},
                     **split_metrics(scores, gold, halves)})
    chosen = max(rows[1:], key=lambda r: (r["even"]["R@1"], r["even"]["MRR@10"]))
    base = rows[0]
    print(f"{'configuration':62s} {'even R@1':>8s} {'odd R@1':>8s} {'all R@1':>8s} {'all R@5':>8s} {'all MRR':>8s}")
    for row in sorted(rows, key=lambda r: -r["even"]["R@1"])[:12] + [base]:
        mark = " <- chosen on even" if row is chosen else ""
        print(f"{row['label']:62s} {row['even']['R@1']:8.1f} {row['odd']['R@1']:8.1f} {row['all']['R@1']:8.1f} "
              f"{row['all']['R@5']:8.1f} {row['all']['MRR@10']:8.1f}{mark}")
    gain = {h: round(chosen[h]["R@1"] - base[h]["R@1"], 1) for h in halves}
    print(f"chosen on even articles: {chosen['label']}; R@1 over atom-sentence: {gain}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"index": args.index, "offset": args.offset, "subset": args.subset,
                                             "queries": len(gold), "chosen": chosen,
                                             "gain_over_atom_sentence": gain, "grid": rows}, indent=1))


if __name__ == "__main__":
    main()
