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
    chunk_idx = np.concatenate([s["meta"].column("chunk_idx").to_numpy() for s in data["shards"]])
    vectors = np.concatenate([s["vectors"] for s in data["shards"]])
    scores = vectors @ qvec
    best: dict[int, float] = {}
    for chunk, score in zip(chunk_idx.tolist(), scores.tolist(), strict=True):
        best[chunk] = max(best.get(chunk, -2.0), score)
    top = sorted(best, key=lambda c: -best[c])[:k]
    top_vec_chunks = chunk_idx[np.argsort(-scores)[:k]].tolist()
    return top, [best[c] for c in top], top_vec_chunks


@pytest.fixture(scope="module")
def engines(kinds_index, sentence_cli_index, minilm, read_index):
    by_name = {}
    for name, path in (("kinds", kinds_index[0]), ("sentences", sentence_cli_index[0])):
        by_name[name] = (SearchEngine(path, embedder=minilm), read_index(path))
    return by_name


@pytest.mark.parametrize("name", ["sentences", "kinds"])
@pytest.mark.parametrize("k", [1, 5, 12])
def test_k_distinct_chunks_are_the_true_top_k(engines, name, k):
    engine, data = engines[name]
    qvecs = engine.embed(QUERIES)
    crowded = 0
    for query, query_vector in zip(QUERIES, qvecs, strict=True):
        results = engine.search([query], k=k)[0]
        ids = [r["chunk_id"] for r in results]
        assert len(ids) == k == len(set(ids))
        want, want_scores, top_vec_chunks = brute_force(data, query_vector, k)
        idx_of = {r["chunk_idx"]: r["chunk_id"] for r in data["chunks"].to_pylist()}
        assert ids == [idx_of[c] for c in want]
        np.testing.assert_allclose([r["score"] for r in results], want_scores, atol=1e-4)
        assert all(a["score"] >= b["score"] for a, b in pairwise(results))
        crowded += len(set(top_vec_chunks)) < k
    if k > 1:
        # the case dedup exists for: the top k vectors belong to fewer than k chunks
        assert crowded > 0


def test_result_shape_and_matched(engines):
    engine, _ = engines["sentences"]
    results = engine.search(["When does the else clause of a for loop run?"], k=3)[0]
    result = results[0]
    assert set(result) == {"chunk_id", "doc_id", "title", "score", "text", "matched", "cosine"}
    assert result["cosine"] == pytest.approx(result["score"], abs=1e-5)  # max fusion, no calibration: the best cosine
    assert result["doc_id"] in ("for", "while", "break") and result["chunk_id"].startswith(result["doc_id"] + "#")
    assert result["matched"] and all(m["kind"] == "sentence" for m in result["matched"])
    assert result["matched"][0]["text"] in result["text"]  # the matched sentence comes from the chunk
    assert result["matched"][0]["score"] == pytest.approx(result["score"], abs=1e-5)


def test_k_beyond_index_returns_every_chunk(engines):
    engine, data = engines["sentences"]
    n = data["chunks"].num_rows
    results = engine.search(["loop"], k=n + 50)[0]
    assert len(results) == n == len({r["chunk_id"] for r in results})


def test_min_score_and_bad_input(engines):
    """min_score keeps exactly the top k's results at or above it: some (the query names its topic), not all."""
    engine, _ = engines["sentences"]
    unfiltered = engine.search(["for loop else clause"], k=10)[0]
    results = engine.search(["for loop else clause"], k=10, min_score=0.5)[0]
    assert results, "no result at or above min_score 0.5 for a query that names its topic"
    assert all(r["score"] >= 0.5 for r in results) and len(results) < 10
    assert [r["chunk_id"] for r in results] == [r["chunk_id"] for r in unfiltered if r["score"] >= 0.5]
    with pytest.raises(QragError, match="k must be between"):
        engine.search(["x"], k=0)
    with pytest.raises(QragError, match="non-empty"):
        engine.search(["  "], k=3)
