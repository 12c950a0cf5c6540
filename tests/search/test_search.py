"""In-process search: dedup by chunk fills k with the true top k chunks, checked against a brute-force
max-per-chunk over every vector of the index computed here with numpy."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from qrag_ray.errors import QragError
from qrag_ray.search.engine import SearchEngine

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS or Serve

QUERIES = [
    "When does the else clause of a for loop run?",
    "How do I make an object usable in a with statement?",
    "What happens if an exception is raised inside a finally clause?",
    "how to leave a loop early",
    "asynchronous iteration",
]


def brute_force(data, qvec: np.ndarray, k: int) -> tuple[list[int], list[float], list[int]]:
    """(top k chunk ids by best vector, their scores, chunk ids of the top k *vectors*)."""
    cidx = np.concatenate([s["meta"].column("chunk_idx").to_numpy() for s in data["shards"]])
    vecs = np.concatenate([s["vectors"] for s in data["shards"]])
    scores = vecs @ qvec
    best: dict[int, float] = {}
    for c, s in zip(cidx.tolist(), scores.tolist(), strict=True):
        best[c] = max(best.get(c, -2.0), s)
    top = sorted(best, key=lambda c: -best[c])[:k]
    top_vec_chunks = cidx[np.argsort(-scores)[:k]].tolist()
    return top, [best[c] for c in top], top_vec_chunks


@pytest.fixture(scope="module")
def engines(kinds_index, sentence_cli_index, minilm, read_index):
    out = {}
    for name, path in (("kinds", kinds_index[0]), ("sentences", sentence_cli_index[0])):
        out[name] = (SearchEngine(path, embedder=minilm), read_index(path))
    return out


@pytest.mark.parametrize("name", ["sentences", "kinds"])
@pytest.mark.parametrize("k", [1, 5, 12])
def test_k_distinct_chunks_are_the_true_top_k(engines, name, k):
    engine, data = engines[name]
    qvecs = engine.embed(QUERIES)
    crowded = 0
    for q, qv in zip(QUERIES, qvecs, strict=True):
        res = engine.search([q], k=k)[0]
        ids = [r["chunk_id"] for r in res]
        assert len(ids) == k == len(set(ids))
        want, want_scores, top_vec_chunks = brute_force(data, qv, k)
        idx_of = {r["chunk_idx"]: r["chunk_id"] for r in data["chunks"].to_pylist()}
        assert ids == [idx_of[c] for c in want]
        np.testing.assert_allclose([r["score"] for r in res], want_scores, atol=1e-4)
        assert all(a["score"] >= b["score"] for a, b in pairwise(res))
        crowded += len(set(top_vec_chunks)) < k
    if k > 1:
        # the case dedup exists for: the top k vectors belong to fewer than k chunks
        assert crowded > 0


def test_result_shape_and_matched(engines):
    engine, _ = engines["sentences"]
    res = engine.search(["When does the else clause of a for loop run?"], k=3)[0]
    r = res[0]
    assert set(r) == {"chunk_id", "doc_id", "title", "score", "text", "matched", "cosine"}
    assert r["cosine"] == pytest.approx(r["score"], abs=1e-5)  # max fusion, no calibration: the best cosine
    assert r["doc_id"] in ("for", "while", "break") and r["chunk_id"].startswith(r["doc_id"] + "#")
    assert r["matched"] and all(m["kind"] == "sentence" for m in r["matched"])
    assert r["matched"][0]["text"] in r["text"]  # the matched sentence comes from the chunk
    assert r["matched"][0]["score"] == pytest.approx(r["score"], abs=1e-5)


def test_k_beyond_index_returns_every_chunk(engines):
    engine, data = engines["sentences"]
    n = data["chunks"].num_rows
    res = engine.search(["loop"], k=n + 50)[0]
    assert len(res) == n == len({r["chunk_id"] for r in res})


def test_min_score_and_bad_input(engines):
    """min_score keeps exactly the top k's results at or above it: some (the query names its topic), not all."""
    engine, _ = engines["sentences"]
    unfiltered = engine.search(["for loop else clause"], k=10)[0]
    res = engine.search(["for loop else clause"], k=10, min_score=0.5)[0]
    assert res, "no result at or above min_score 0.5 for a query that names its topic"
    assert all(r["score"] >= 0.5 for r in res) and len(res) < 10
    assert [r["chunk_id"] for r in res] == [r["chunk_id"] for r in unfiltered if r["score"] >= 0.5]
    with pytest.raises(QragError, match="k must be between"):
        engine.search(["x"], k=0)
    with pytest.raises(QragError, match="non-empty"):
        engine.search(["  "], k=3)
