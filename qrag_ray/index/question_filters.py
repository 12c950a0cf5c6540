"""Per-chunk filters on embedded vectors (pure numpy), run in the shard writer where all of a chunk's
vectors are together. The papers' order: drop questions that do not belong to their chunk
(question-chunk similarity as in QuOTE and Doc2Query--; no content word in common), then Q-Q pruning
(Raina & Gales): greedily drop a question whose cosine to a kept question of the chunk exceeds tau.
Last, `max_atoms` pools what is left beside the chunk vector (sentences, windows, questions) into at most
m vectors: the centroids of their clusters, re-normalised."""

from __future__ import annotations

import re

import numpy as np

from qrag_ray.config.index import FilterConfig

_WORD = re.compile(r"[a-z0-9]+")
_STOP = {
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "from", "by", "with", "about", "as", "is", "are",
    "was", "were", "be", "been", "being", "do", "does", "did", "what", "which", "who", "whom", "whose", "when",
    "where", "why", "how", "that", "this", "these", "those", "it", "its", "and", "or", "not", "no", "there",
    "their", "they", "he", "she", "his", "her", "him", "them", "we", "you", "your", "our", "i", "me", "my", "can",
    "could", "would", "should", "will", "shall", "may", "might", "must", "has", "have", "had", "than", "then",
    "into", "over", "under", "after", "before", "during", "between", "through", "against", "among",
}


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1}


def greedy_prune(vectors: np.ndarray, tau: float) -> np.ndarray:
    """Indices (in order) of vectors kept when each must have cosine <= tau to all kept before it."""
    kept: list[int] = []
    for i in range(len(vectors)):
        if not kept or float(np.max(vectors[kept] @ vectors[i])) <= tau:
            kept.append(i)
    return np.asarray(kept, dtype=np.int64)


def select_questions(qvecs: np.ndarray, qtexts: list[str], chunk_vec: np.ndarray | None, chunk_text: str,
                     cfg: FilterConfig) -> np.ndarray:
    """Boolean mask over a chunk's questions (unit vectors) saying which survive the filters."""
    keep = np.ones(len(qtexts), dtype=bool)
    if not len(qtexts):
        return keep
    if cfg.require_content_overlap:
        chunk_words = content_words(chunk_text)
        keep &= np.array([bool(content_words(q) & chunk_words) for q in qtexts])
    if cfg.min_question_chunk_sim is not None and chunk_vec is not None:
        keep &= (qvecs @ chunk_vec) >= cfg.min_question_chunk_sim
    if cfg.prune_tau is not None and keep.any():
        idx = np.flatnonzero(keep)
        keep = np.isin(np.arange(len(keep)), idx[greedy_prune(qvecs[idx], cfg.prune_tau)])
    return keep


def pool(vecs: np.ndarray, max_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_clusters` clusters of unit vectors (average linkage on cosine distance): (each cluster's member
    nearest its centroid, the re-normalised centroids)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    if len(vecs) > 1:
        labels = fcluster(linkage(vecs, "average", "cosine"), max_clusters, "maxclust")
    else:
        labels = np.ones(len(vecs), int)
    groups = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    cents = np.stack([vecs[g].mean(axis=0) for g in groups])
    cents /= np.maximum(np.linalg.norm(cents, axis=1, keepdims=True), 1e-12)
    return np.array([g[np.argmax(vecs[g] @ c)] for g, c in zip(groups, cents, strict=True)], dtype=np.int64), cents


def filter_chunk_rows(kind: np.ndarray, qn: np.ndarray, store: np.ndarray, texts: list[str],
                      vecs: np.ndarray, cfg: FilterConfig) -> tuple[np.ndarray, np.ndarray]:
    """(mask of rows to write to the index, their vectors) for the rows of one chunk; a pooled atom's row
    carries its cluster's centroid."""
    chunk_rows = np.flatnonzero(kind == "chunk")
    chunk_vec, chunk_text = (vecs[chunk_rows[0]], texts[chunk_rows[0]]) if len(chunk_rows) else (None, "")
    out = store.copy()
    q_rows = np.flatnonzero((kind == "question") & (qn >= 0))
    active = cfg.prune_tau is not None or cfg.min_question_chunk_sim is not None or cfg.require_content_overlap
    if active and len(q_rows):
        q_rows = q_rows[np.argsort(qn[q_rows], kind="stable")]
        mask = select_questions(vecs[q_rows], [texts[i] for i in q_rows], chunk_vec, chunk_text, cfg)
        out &= ~np.isin(qn, qn[q_rows][~mask])
    atoms = np.flatnonzero(out & (kind != "chunk"))
    if cfg.max_atoms is not None and len(atoms) > cfg.max_atoms:
        reps, cents = pool(vecs[atoms], cfg.max_atoms)
        vecs = vecs.copy()
        vecs[atoms[reps]] = cents
        out[np.setdiff1d(atoms, atoms[reps])] = False
    if cfg.keep_chunk_fallback and not out.any() and len(chunk_rows):
        out[chunk_rows[0]] = True
    return out, vecs
