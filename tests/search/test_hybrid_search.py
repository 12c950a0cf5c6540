"""Hybrid search end to end: a real 2-shard index built with a BM25 channel (doc2query over the
precomputed questions), searched in process through FAISS + bm25s + the merge."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.errors import QragError
from qrag_ray.search.engine import SearchEngine

pytestmark = pytest.mark.integration  # real Ray, MiniLM, FAISS or Serve

QUERIES = [
    "When does the else clause of a for loop run?",
    "What does __exit__ receive?",
    "What is the capital of France?",
    "lambda",
]
ALPHA = 0.6


@pytest.fixture(scope="module")
def hybrid_index(local_ray, pydoc_jsonl, index_root, build_with):
    out = index_root / "hybrid-bm25"
    report = build_with({"input": str(pydoc_jsonl), "build.output": str(out), "shards": 2,
                         "representation": "hybrid", "generator.backend": "precomputed", "chunker.method": "none",
                         "bm25.enabled": True, "search.bm25_alpha": ALPHA})
    return out, report


def test_each_shard_has_a_checksummed_bm25_index_of_its_chunks(hybrid_index):
    path, report = hybrid_index
    manifest = json.loads((path / "manifest.json").read_text())
    assert sum(s["bm25_docs"] for s in manifest["shards"]) == manifest["counts"]["chunks"] == report.chunks
    for shard in manifest["shards"]:
        listed = [f for f in manifest["files"] if f.startswith(shard["bm25"] + "/")]
        assert any(f.endswith("chunk_idx.npy") for f in listed) and len(listed) >= 5
    # a tampered BM25 file is refused like a tampered FAISS file
    bm25_file = path / manifest["shards"][0]["bm25"] / "chunk_idx.npy"
    good = bm25_file.read_bytes()
    try:
        bm25_file.write_bytes(good[:-8] + bytes(8))
        with pytest.raises(QragError, match="checksum"):
            SearchEngine(path)
    finally:
        bm25_file.write_bytes(good)


def test_doc2query_makes_a_chunk_findable_by_its_questions_words(hybrid_index, minilm):
    # "pass" holds off-topic questions (conftest): only its generated questions mention France
    engine = SearchEngine(hybrid_index[0], embedder=minilm, policy=SearchConfig(bm25_alpha=0.0))
    top = engine.search(["What is the capital of France?"], k=3)[0]
    assert top[0]["doc_id"] == "pass" and top[0]["bm25"] == 1.0
    assert top[1]["bm25"] < 1.0


def test_alpha_one_is_the_dense_ranking(hybrid_index, minilm):
    dense = SearchEngine(hybrid_index[0], embedder=minilm, policy=SearchConfig())
    one = SearchEngine(hybrid_index[0], embedder=minilm, policy=SearchConfig(bm25_alpha=1.0))
    for query in QUERIES:
        dense_page = dense.search([query], k=5)[0]
        alpha_one_page = one.search([query], k=5)[0]
        assert dense_page
        assert [r["chunk_id"] for r in dense_page] == [r["chunk_id"] for r in alpha_one_page]
        assert "bm25" not in dense_page[0] and "bm25" in alpha_one_page[0]


def test_scores_decompose_into_alpha_dense_plus_bm25(hybrid_index, minilm):
    engine = SearchEngine(hybrid_index[0], embedder=minilm)  # the manifest's policy: alpha 0.6
    assert engine.policy.bm25_alpha == ALPHA
    seen_lexical = False
    for query in QUERIES:
        results = engine.search([query], k=8)[0]
        assert len(results) == 8 == len({r["chunk_id"] for r in results})
        assert all(a["score"] >= b["score"] for a, b in pairwise(results))
        for result in results:
            assert 0.0 <= result["bm25"] <= 1.0
            if result["matched"]:  # max fusion: the dense part is the best vector's cosine
                dense_part = result["matched"][0]["score"]
                assert result["score"] == pytest.approx(ALPHA * dense_part + (1 - ALPHA) * result["bm25"], abs=2e-5)
            seen_lexical |= result["bm25"] > 0
    assert seen_lexical
    # the same ranking from precomputed vectors + texts (what `qrag eval` calls)
    query_vectors = engine.embed(QUERIES)
    direct = engine.search_vectors(query_vectors, 8, queries=QUERIES)
    via_text = engine.search(QUERIES, k=8)
    assert [len(page) for page in direct] == [8] * len(QUERIES)
    assert [[r.chunk_id for r in rs] for rs in direct] == [
        [r["chunk_id"] for r in rs] for rs in via_text]
    with pytest.raises(QragError, match="query texts"):
        engine.search_vectors(query_vectors, 8)


def test_hybrid_on_an_index_without_bm25_is_a_clear_error(kinds_index, minilm):
    with pytest.raises(QragError, match="bm25.enabled"):
        SearchEngine(kinds_index[0], embedder=minilm, policy=SearchConfig(bm25_alpha=0.5))


def test_cli_search_overrides_alpha_and_refuses_an_index_without_bm25(hybrid_index, kinds_index, capsys):
    from qrag_ray.cli import main

    assert main(["search", "--index", str(hybrid_index[0]), "--k", "3", "--bm25-alpha", "0",
                 "What is the capital of France?"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert results[0]["doc_id"] == "pass" and results[0]["bm25"] == 1.0
    for argv, message in ((["--index", str(kinds_index[0]), "--bm25-alpha", "0.5"], "bm25.enabled"),
                          (["--index", str(hybrid_index[0]), "--bm25-alpha", "1.5"], "must lie in")):
        assert main(["search", *argv, "loops"]) == 2
        stderr = capsys.readouterr().err.strip()
        assert message in stderr and "Traceback" not in stderr and len(stderr.splitlines()) == 1


def test_hybrid_rounds_go_deep_and_rank_like_exhaustive_lists(hybrid_index, minilm):
    """A chunk one list missed is scored at that list's floor, so shallow lists (k x M hits) can sink a
    chunk that BM25 puts 2nd but the dense list cut off. A hybrid query's first round asks each shard
    for HYBRID_MIN_DEPTH hits per channel (a dense query still asks k x M), and small k then ranks
    exactly as exhaustive lists do."""
    from qrag_ray.index.format import chunk_key
    from qrag_ray.search.merge import merge_hits
    from qrag_ray.search.shard import HYBRID_MIN_DEPTH

    engine = SearchEngine(hybrid_index[0], embedder=minilm)
    asked: list[tuple[int, bool]] = []
    for shard in engine.shards:
        real = shard.nearest

        def nearest(vectors, k, texts=None, selection=None, _real=real):
            asked.append((k, texts is not None))
            return _real(vectors, k, texts, selection)

        shard.nearest = nearest
    vectors = engine.embed(QUERIES)
    deep = [shard.nearest(vectors, shard.ntotal, QUERIES) for shard in engine.shards]
    asked.clear()
    for k in (1, 2, 3):
        got = engine.search_vectors(vectors, k, queries=QUERIES)
        for query in range(len(QUERIES)):
            want = merge_hits([hits[query] for hits in deep], k, None, engine.policy)[0]
            assert want and [chunk_key(r.chunk_id) for r in got[query]] == [r.chunk_idx for r in want]
            assert [r.score for r in got[query]] == pytest.approx([r.score for r in want], abs=1e-6)
    assert asked and all(depth >= HYBRID_MIN_DEPTH and text for depth, text in asked)
    asked.clear()
    engine.policy = SearchConfig()  # dense only: the depth stays k x M
    engine.search_vectors(vectors, 2)
    assert asked and asked[0] == (2 * engine.shards[0].multiplier, False)


@pytest.mark.parametrize("policy", [None, SearchConfig(fusion="rrf", bm25_alpha=ALPHA), SearchConfig()])
def test_the_replies_carry_the_page_and_little_else(hybrid_index, minilm, policy):
    """Each shard's reply carries the metadata of every chunk on the page (the caller asks nothing again),
    and of few others: a small multiple of k, not the hundreds of chunks the shards' lists hold."""
    engine = SearchEngine(hybrid_index[0], embedder=minilm, policy=policy)
    vectors = engine.embed(QUERIES)
    for query, text in enumerate(QUERIES):
        page = engine.search_vectors(vectors[query:query + 1], 5, queries=[text])[0]
        carried = {meta.chunk_id for reply in engine.last.replies for meta in reply.chunks.values()}
        listed = {int(key) for reply in engine.last.replies for key in reply.hits(0).chunk_idx if key >= 0}
        assert page and {result.chunk_id for result in page} <= carried
        assert len(carried) <= 8 * 5 < len(listed) or len(listed) <= 8 * 5
