"""One shard's BM25 index (bm25s): built beside the FAISS file, searched with the same queries.

Why a sparse channel at all: questions written by someone reading the passage share its words, and a
dense MiniLM vector blurs exactly those rare words (names, numbers). On SQuAD dev BM25 alone beats
every dense configuration and dense + BM25 adds 7-8 R@1 (docs/EVALUATION.md §4.7). doc2query puts a
chunk's generated questions into its BM25 text: the words a user will ask with.

One BM25 document per chunk. IDF is per shard, as in any sharded engine (Elasticsearch's default);
shards are hash-partitioned, so their statistics agree closely. Scores leave the shard raw; the merge
divides them by the query's best score over all shards (qrag_ray.search.merge).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHUNK_IDX = "chunk_idx.npy"
QUESTION_KINDS = ("question", "quote", "atomquote")


def lexical_docs(chunk_idx: np.ndarray, kind: list[str], text: list[str], qn: np.ndarray,
                 doc2query: bool) -> tuple[np.ndarray, list[str]]:
    """(chunk ids, BM25 text) from a shard's vector rows, before any vector filter: the `chunk` row
    every chunk has (stored or auxiliary) gives its text; with doc2query each distinct generated
    question of the chunk is appended. Ids come out sorted."""
    body: dict[int, str] = {}
    extra: dict[int, list[str]] = {}
    for ci, kd, tx, n in zip(chunk_idx.tolist(), kind, text, qn.tolist()):
        if kd == "chunk":
            body[ci] = tx
        elif doc2query and kd in QUESTION_KINDS and n >= 0:
            qs = extra.setdefault(ci, [])
            if tx not in qs:
                qs.append(tx)
    ids = np.asarray(sorted(body), dtype=np.int64)
    return ids, ["\n".join([body[ci], *extra.get(ci, [])]) for ci in ids.tolist()]


def tokenize(texts: list[str], ids: bool):
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", return_ids=ids, show_progress=False)


def build_bm25(chunk_idx: np.ndarray, texts: list[str], out_dir: str | Path, k1: float, b: float) -> int:
    """Index and save; returns the vocabulary size. Nothing is written for an empty shard but the ids."""
    import bm25s

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / CHUNK_IDX, np.asarray(chunk_idx, dtype=np.int64))
    if not len(texts):
        return 0
    ret = bm25s.BM25(k1=k1, b=b)
    ret.index(tokenize(texts, ids=True), show_progress=False)
    ret.save(str(out))
    return len(ret.vocab_dict)


class ShardLexicon:
    """A saved shard BM25 index, memory-mapped, plus its row -> chunk id array."""

    def __init__(self, path: str | Path):
        import bm25s

        p = Path(path)
        self.chunk_idx = np.load(p / CHUNK_IDX)
        self.bm25 = bm25s.BM25.load(str(p), mmap=True) if len(self.chunk_idx) else None

    def __len__(self) -> int:
        return len(self.chunk_idx)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(raw scores, chunk ids), each (len(queries), min(k, docs)), best first; -1 pads the slots of
        documents sharing no term with the query (score 0)."""
        k = max(0, min(k, len(self)))
        scores = np.zeros((len(queries), k), np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        if k == 0 or self.bm25 is None:
            return scores, ids
        for qi, toks in enumerate(tokenize(queries, ids=False)):
            if not toks:  # only stopwords or punctuation
                continue
            s = np.asarray(self.bm25.get_scores(toks), dtype=np.float32)
            top = np.argpartition(-s, k - 1)[:k] if k < len(s) else np.arange(len(s))
            top = top[np.lexsort((top, -s[top]))]
            top = top[s[top] > 0]
            scores[qi, :len(top)] = s[top]
            ids[qi, :len(top)] = self.chunk_idx[top]
        return scores, ids
