"""One shard's BM25 index (bm25s), one document per chunk: a dense vector blurs the rare words that
questions share with their passage (docs/EVALUATION.md). IDF is global (`globalize_idf`), so a term's
weight does not depend on the chunk's shard. Tokens are stemmed as the shard records (`TOKENIZER`;
absent in indexes built before stemming), so queries are tokenised as its documents were."""

from __future__ import annotations

import functools
import json
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import Stemmer

from qrag_ray.config.search_policy import QUESTION_KINDS
from qrag_ray.errors import QragError

CHUNK_IDX = "chunk_idx.npy"
TOKENIZER = "qrag_tokenizer.json"  # {"stemmer": "english" | null}: how this shard's text was tokenised
_VOCAB, _INDPTR, _DATA, _PARAMS = "vocab.index.json", "indptr.csc.index.npy", "data.csc.index.npy", "params.index.json"


def lexical_docs(chunk_idx: np.ndarray, kind: list[str], text: list[str], qn: np.ndarray,
                 doc2query: bool) -> tuple[np.ndarray, list[str]]:
    """(sorted chunk ids, BM25 text) from a shard's vector rows before any filter: the `chunk` row's
    text, after it the `title` row's and (doc2query) each distinct generated question."""
    body: dict[int, str] = {}
    extra: dict[int, list[str]] = {}
    for chunk, kind_name, row_text, question_number in zip(chunk_idx.tolist(), kind, text, qn.tolist(), strict=True):
        if kind_name == "chunk":
            body[chunk] = row_text
        elif kind_name == "title":  # the document's title is evidence for BM25 too (BEIR's title + text)
            extra.setdefault(chunk, []).insert(0, row_text)
        elif doc2query and kind_name in QUESTION_KINDS and question_number >= 0:
            questions = extra.setdefault(chunk, [])
            if row_text not in questions:
                questions.append(row_text)
    ids = np.asarray(sorted(body), dtype=np.int64)
    return ids, ["\n".join([body[ci], *extra.get(ci, [])]) for ci in ids.tolist()]


@functools.cache
def _stemmer(name: str | None):
    """A PyStemmer Snowball stemmer by language name (None: no stemming), one per process."""
    if not name:
        return None
    try:
        return Stemmer.Stemmer(name)
    except KeyError:
        raise QragError(f"unknown BM25 stemmer {name!r} (known: {', '.join(Stemmer.algorithms())})") from None


def tokenize(texts: list[str], ids: bool, stemmer: str | None = None):
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer(stemmer), return_ids=ids, show_progress=False)


def build_bm25(chunk_idx: np.ndarray, texts: list[str], out_dir: str | Path, k1: float, b: float,
               stemmer: str | None = None) -> int:
    """Index and save; returns the vocabulary size. An empty shard writes only the ids and TOKENIZER."""
    import bm25s

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / CHUNK_IDX, np.asarray(chunk_idx, dtype=np.int64))
    (out / TOKENIZER).write_text(json.dumps({"stemmer": stemmer or None}))
    if not len(texts):
        return 0
    ret = bm25s.BM25(k1=k1, b=b)
    ret.index(_numbered_by_first_use(tokenize(texts, ids=True, stemmer=stemmer)), show_progress=False)
    ret.save(str(out))
    return len(ret.vocab_dict)


def _numbered_by_first_use(tok):
    """The same tokens with term ids in order of first use: bm25s numbers stemmed terms in a set's
    iteration order, which changes with the hash seed, so a rebuild would write other bytes."""
    from bm25s.tokenization import Tokenized

    renumber: dict[int, int] = {}
    ids = [[renumber.setdefault(t, len(renumber)) for t in doc] for doc in tok.ids]
    term = {i: w for w, i in tok.vocab.items()}
    vocab = {term[old]: new for old, new in renumber.items()}
    for word in sorted(set(tok.vocab) - set(vocab)):  # terms no document kept (none expected)
        vocab[word] = len(vocab)
    return Tokenized(ids=ids, vocab=vocab)


def lucene_idf(n_docs: int, document_frequency: np.ndarray) -> np.ndarray:
    """bm25s's default ("lucene") IDF, the one its stored scores were multiplied by."""
    return np.log1p((n_docs - document_frequency + 0.5) / (document_frequency + 0.5))


def _term_columns(path: Path) -> tuple[dict[str, int], np.ndarray]:
    """(term -> column, documents per column) of a saved shard's CSC score matrix."""
    counts = np.diff(np.load(path / _INDPTR))
    vocab = json.loads((path / _VOCAB).read_text())
    return {t: i for t, i in vocab.items() if i < len(counts)}, counts


def shard_frequencies(path: str | Path) -> tuple[int, dict[str, int]]:
    """(documents, {term: documents holding it}) of one saved shard BM25 index (an empty shard: 0, {})."""
    path = Path(path)
    n = len(np.load(path / CHUNK_IDX, mmap_mode="r"))
    if not n:
        return 0, {}
    method = json.loads((path / _PARAMS).read_text()).get("method", "lucene")
    if method != "lucene":  # we always build with bm25s's default; another IDF would need its own formula
        raise ValueError(f"{path}: global IDF is implemented for bm25s method 'lucene', not {method!r}")
    vocab, counts = _term_columns(path)
    return n, {t: int(counts[i]) for t, i in vocab.items()}


def rescale_idf(path: str | Path, n_all: int, df_all: Mapping[str, int]) -> None:
    """Rewrite one shard's stored BM25 scores with the IDF of a collection of `n_all` documents whose
    document frequencies are `df_all` (this shard's own documents included): bm25s stores idf(term) *
    tf-part per (term, document), so scaling a term's column by that idf / the shard's own is exact."""
    path = Path(path)
    n = len(np.load(path / CHUNK_IDX, mmap_mode="r"))
    if not n:
        return
    vocab, counts = _term_columns(path)
    cols = np.fromiter(vocab.values(), np.int64, len(vocab))
    local = counts[cols].astype(np.float64)
    glob = np.fromiter((df_all.get(t, 0) for t in vocab), np.float64, len(vocab))
    ratio = np.ones(len(counts))
    seen = local > 0
    ratio[cols[seen]] = lucene_idf(n_all, glob[seen]) / lucene_idf(n, local[seen])
    data = np.load(path / _DATA)
    np.save(path / _DATA, (data * np.repeat(ratio, counts)).astype(data.dtype))


def globalize_idf(paths: list[str | Path]) -> None:
    """Rewrite each shard's stored BM25 scores with the IDF over all `paths` (`rescale_idf`), so a term's
    weight does not depend on the shard its chunk landed in."""
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        return
    stats = [shard_frequencies(path) for path in paths]
    df_all: Counter = Counter()
    for _, frequencies in stats:
        df_all.update(frequencies)
    n_all = sum(count for count, _ in stats)
    for path, (count, _) in zip(paths, stats, strict=True):
        if count:
            rescale_idf(path, n_all, df_all)


class ShardLexicon:
    """A saved shard BM25 index, memory-mapped, plus its row -> chunk id array. The scorer (its vocabulary
    is a Python dict built from JSON) is read on the first search, not at load: a shard is loaded for
    every query policy, and only hybrid queries read it."""

    def __init__(self, path: str | Path):
        folder = Path(path)
        self.path = folder
        self.chunk_idx = np.load(folder / CHUNK_IDX)
        tok = folder / TOKENIZER  # absent in indexes built before stemming: those were not stemmed
        self.stemmer = json.loads(tok.read_text()).get("stemmer") if tok.is_file() else None
        self._bm25 = None
        self._lock = threading.Lock()

    @property
    def bm25(self):
        if self._bm25 is None and len(self.chunk_idx):
            with self._lock:  # concurrent first searches read it once
                if self._bm25 is None:
                    import bm25s

                    self._bm25 = bm25s.BM25.load(str(self.path), mmap=True)
        return self._bm25

    def __len__(self) -> int:
        return len(self.chunk_idx)

    def search(self, queries: list[str], k: int, docs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(raw scores, chunk ids), each (len(queries), min(k, docs)), best first; -1 pads empty slots.
        `docs` (a bool per document): only those are scored (a filter's selection)."""
        k = max(0, min(k, len(self) if docs is None else int(np.count_nonzero(docs))))
        scores = np.zeros((len(queries), k), np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        if k == 0 or self.bm25 is None:
            return scores, ids
        for query, toks in enumerate(tokenize(queries, ids=False, stemmer=self.stemmer)):
            if not toks:  # only stopwords or punctuation
                continue
            doc_scores = np.asarray(self.bm25.get_scores(toks), dtype=np.float32)
            if docs is not None:
                doc_scores[~docs] = 0.0  # a score of 0 is never returned
            top = np.argpartition(-doc_scores, k - 1)[:k] if k < len(doc_scores) else np.arange(len(doc_scores))
            top = top[np.lexsort((top, -doc_scores[top]))]
            top = top[doc_scores[top] > 0]
            scores[query, :len(top)] = doc_scores[top]
            ids[query, :len(top)] = self.chunk_idx[top]
        return scores, ids
