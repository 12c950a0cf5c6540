"""Filtered search against brute force over the filtered subset, on small synthetic indexes written by the
package's own shard writer (no Ray, no model: milliseconds): dense, BM25 and hybrid, one and three shards,
every selectivity, each cost strategy (direct scoring of the selected rows, FAISS with an ID selector, the
exhaustive retry of a query the index could not fill); exactly k distinct chunks whenever k pass."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.index import faiss_search
from qrag_ray.search.engine import SearchEngine
from qrag_ray.search.filters import InvalidFilter
from support.brute_force import bm25_truth, dense_truth, passes
from support.synthetic_index import synthetic_docs, write_synthetic_index

DOCS = synthetic_docs(90)
FILTERS = [
    None,  # doc_ids alone
    {"type": "eq", "key": "group", "value": "a"},
    {"type": "ne", "key": "group", "value": "a"},
    {"type": "in", "key": "group", "value": ["b", "c"]},
    {"type": "gte", "key": "year", "value": 2005},
    {"type": "and", "filters": [{"type": "eq", "key": "public", "value": True},
                                {"type": "lt", "key": "day", "value": "2024-01-10"}]},
    {"type": "or", "filters": [{"type": "eq", "key": "tags", "value": "loop"},
                               {"type": "gt", "key": "at", "value": "2024-02-03T20:00:00Z"}]},
    {"type": "nin", "key": "tags", "value": ["loop", "vector"]},
    {"type": "eq", "key": "group", "value": "zzz"},  # nothing passes
]


@pytest.fixture(scope="module", params=[1, 3], ids=["1shard", "3shards"])
def index(request, tmp_path_factory):
    return write_synthetic_index(tmp_path_factory.mktemp("idx") / "i", DOCS, shards=request.param)


def _queries(n: int = 4, dim: int = 16) -> np.ndarray:
    vectors = np.random.default_rng(7).standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _chosen(filter_spec, doc_ids=None) -> set[str]:
    from qrag_ray.io.metadata import normalize_metadata

    def selected(doc) -> bool:
        in_filter = filter_spec is None or passes(filter_spec, normalize_metadata(doc["metadata"], ""))
        return in_filter and (doc_ids is None or doc["doc_id"] in doc_ids)

    return {doc["doc_id"] for doc in DOCS if selected(doc)}


def _filter_id(filter_spec) -> str:
    return "doc_ids" if filter_spec is None else filter_spec["type"] + ":" + str(filter_spec.get("key"))


@pytest.mark.parametrize("strategy", ["direct", "selector", "retry"])
@pytest.mark.parametrize("filter_spec", FILTERS, ids=_filter_id)
def test_dense_filtered_equals_brute_force_over_the_subset(index, filter_spec, strategy, monkeypatch):
    if strategy != "direct":  # every selection searched by FAISS with the selector, not scored directly
        monkeypatch.setattr(faiss_search, "BRUTE_FORCE_VALUES", 0)
    if strategy == "retry":  # the first search returns too few: the exhaustive retry must fill every query
        real = faiss.IndexFlat.search

        def short(self, vectors, k, params=None, **kwargs):
            scores, rows = real(self, vectors, k, params=params, **kwargs)
            if params is not None:
                scores[:, k // 2:] = -np.inf
                rows[:, k // 2:] = -1
            return scores, rows
        monkeypatch.setattr(faiss.IndexFlat, "search", short)
    engine = SearchEngine(index, verify=False)
    doc_ids = ["d1", "d2", "d3", "d10", "d11", "d40", "d41", "d77"] if filter_spec is None else None
    chosen = _chosen(filter_spec, doc_ids)
    qvecs = _queries()
    for k in (1, 5, 40):
        pages = engine.search_vectors(qvecs, k, filter=engine.compile_filter(filter_spec, doc_ids))
        for page, truth in zip(pages, dense_truth(engine, qvecs, chosen), strict=True):
            ids = [r.chunk_id for r in page]
            assert len(ids) == min(k, len(chosen)) == len(set(ids))  # k distinct chunks whenever k pass
            assert ids == [c for c, _ in truth[:k]]
            assert [r.score for r in page] == pytest.approx([s for _, s in truth[:k]], abs=1e-5)
            assert all(r.doc_id in chosen for r in page)


@pytest.mark.parametrize("filter_spec", FILTERS[1:], ids=_filter_id)
def test_bm25_and_hybrid_filtered_equal_brute_force_over_the_subset(index, filter_spec):
    """alpha 0 ranks by BM25 alone; alpha 0.6 mixes the two, each list exact over the chosen chunks (the
    subset is smaller than the hybrid depth, so the closed form below is the whole fusion: a chunk without
    BM25 counts the lexical floor, the lowest score of a shard whose list every chosen chunk filled)."""
    chosen = _chosen(filter_spec)
    qvecs = _queries(2)
    texts = ["shard replica merge", "query latency cache token"]
    lexical = SearchEngine(index, verify=False, policy=SearchConfig().with_bm25_alpha(0.0))
    hybrid = SearchEngine(index, verify=False, policy=SearchConfig().with_bm25_alpha(0.6))
    compiled = lexical.compile_filter(filter_spec)
    dense = dense_truth(lexical, qvecs, chosen)
    for query_index, text in enumerate(texts):
        lex, per_shard = bm25_truth(lexical, text, chosen)
        query_vectors = qvecs[query_index:query_index + 1]
        page = lexical.search_vectors(query_vectors, 5, queries=[text], filter=compiled)[0]
        got = [(r.chunk_id, r.bm25) for r in page if r.bm25]
        top = lex[0][1] if lex else 1.0
        assert len(got) == min(5, len(lex))  # the best BM25 scores in order (equal scores in any order)
        assert [b for _, b in got] == pytest.approx([s / top for _, s in lex[:len(got)]], abs=1e-5)
        assert [b for _, b in got] == pytest.approx([dict(lex)[c] / top for c, _ in got], abs=1e-5)
        assert all(r.doc_id in chosen for r in page) and len(page) == min(5, len(chosen))
        floor = min([min(sc) / top for sc in per_shard if sc and min(sc) > 0] or [0.0])
        lexical_scores = dict(lex)
        want = {c: 0.6 * s + 0.4 * (lexical_scores[c] / top if c in lexical_scores else floor)
                for c, s in dense[query_index]}
        ranked = sorted(want.items(), key=lambda t: -t[1])[:10]
        page = hybrid.search_vectors(query_vectors, 10, queries=[text], filter=compiled)[0]
        assert [r.score for r in page] == pytest.approx([s for _, s in ranked], abs=1e-5)
        assert [r.score for r in page] == pytest.approx([want[r.chunk_id] for r in page], abs=1e-5)


@pytest.mark.parametrize("factory", ["IVF4,Flat", "HNSW8", "IVF4,PQ4x4fs,Refine(Flat)"])
def test_approximate_indexes_return_k_chunks_whenever_k_pass(tmp_path, factory, monkeypatch):
    """IVF probing one list of four, HNSW with a tiny beam: at 3% selectivity the index alone finds too
    few selected rows, so the exhaustive retry (or direct scoring) must fill the page; its chunks are
    the exact ones there (all selected rows are scored)."""
    docs = synthetic_docs(400, seed=3)
    idx = write_synthetic_index(tmp_path / "i", docs, shards=2, dim=8, factory=factory)
    engine = SearchEngine(idx, verify=False)
    for shard in engine.shards:
        inner = faiss.downcast_index(shard.faiss)
        inner = faiss.downcast_index(inner.base_index) if isinstance(inner, faiss.IndexRefine) else inner
        if isinstance(inner, faiss.IndexIVF):
            inner.nprobe = 1
        if isinstance(inner, faiss.IndexHNSW):
            inner.hnsw.efSearch = 4
    monkeypatch.setattr(faiss_search, "BRUTE_FORCE_VALUES", 0)
    doc_ids = [f"d{i}" for i in range(0, 400, 33)]  # 13 documents
    qvecs = _queries(6, dim=8)
    pages = engine.search_vectors(qvecs, 10, filter=engine.compile_filter(None, doc_ids))
    for page in pages:
        assert len({r.chunk_id for r in page}) == 10 and all(r.doc_id in doc_ids for r in page)


def test_filter_errors_name_what_is_wrong(index, tmp_path):
    engine = SearchEngine(index, verify=False)
    cases = [
        ({"type": "eq", "key": "colour", "value": "x"}, "unknown metadata field 'colour'; this index has: at, day"),
        ({"type": "gt", "key": "public", "value": True}, "'gt' does not apply to field 'public', which is a bool"),
        ({"type": "lt", "key": "day", "value": "2024-02-30"}, "is not an ISO-8601 date"),
        ({"type": "eq", "key": "year", "value": "2004"}, "field 'year' is a number"),
        ({"type": "in", "key": "group", "value": ["a"] * 1001}, "at most 1000 values"),
    ]
    deep = {"type": "eq", "key": "group", "value": "a"}
    for _ in range(9):
        deep = {"type": "and", "filters": [deep]}
    cases.append((deep, "deeper than 8 levels"))
    for filter_spec, message in cases:
        with pytest.raises(InvalidFilter, match=message.replace("(", r"\(")):
            engine.compile_filter(filter_spec)
    plain = write_synthetic_index(tmp_path / "plain", [{**d, "metadata": {}, "url": ""} for d in DOCS[:9]])
    bare = SearchEngine(plain, verify=False)
    assert bare.manifest.metadata_schema is None
    with pytest.raises(InvalidFilter, match="built without document metadata"):
        bare.compile_filter({"type": "eq", "key": "group", "value": "a"})
    page = bare.search_vectors(_queries(1), 3, filter=bare.compile_filter(None, ["d1", "d2"]))[0]
    assert sorted(r.doc_id for r in page) == ["d1", "d2"] and all(r.metadata == {} and r.url is None for r in page)


def test_results_carry_metadata_and_url(index):
    engine = SearchEngine(index, verify=False)
    page = engine.search_vectors(_queries(1), 90)[0]
    by_doc = {d["doc_id"]: d for d in DOCS}
    assert len(page) == 90
    for result in page:
        doc = by_doc[result.doc_id]
        assert result.url == (doc["url"] or None)
        assert result.metadata == doc["metadata"]  # as given: dates as text, whole numbers as integers


@pytest.mark.parametrize("factory", ["Flat", "SQfp16", "SQ8", "HNSW8", "IVF4,PQ4x4fs,Refine(SQfp16)", "PCA8,Flat"])
def test_stored_vectors_are_what_reconstruct_returns(factory):
    """Direct scoring decodes the selected rows' codes in one call: the same floats as FAISS's own
    reconstruct, for every index type that stores its vectors."""
    vectors = np.random.default_rng(3).standard_normal((300, 16)).astype(np.float32)
    index = faiss.index_factory(16, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    rows = np.array([299, 0, 17, 17, 150], dtype=np.int64)
    np.testing.assert_array_equal(faiss_search.stored_vectors(index, rows), index.reconstruct_batch(rows))


def test_an_ivf_probes_more_lists_the_fewer_rows_a_filter_selects():
    """A selection of a tenth of the rows probes ten times the lists (all of them at most): as many selected
    rows as the unfiltered search scans."""
    vectors = np.random.default_rng(4).standard_normal((2000, 8)).astype(np.float32)
    index = faiss.index_factory(8, "IVF32,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    index.nprobe = 2
    keep: list = []
    selector = faiss.IDSelectorRange(0, 200)
    assert faiss_search.selector_params(index, selector, keep).nprobe == 2
    assert faiss_search.selector_params(index, selector, keep, widen=10.0).nprobe == 20
    assert faiss_search.selector_params(index, selector, keep, widen=100.0).nprobe == 32


def test_a_repeated_filter_is_evaluated_once_per_shard(index, monkeypatch):
    """Queries that repeat a filter (an equal one, compiled anew) reuse each shard's selection and rank the
    same; a shard keeps the selections of its last SELECTIONS_KEPT filters, within its byte budget."""
    from qrag_ray.search import shard as shard_module

    evaluated = []
    real = shard_module.chunk_mask

    def counted(*args):
        evaluated.append(1)
        return real(*args)

    monkeypatch.setattr(shard_module, "chunk_mask", counted)
    engine = SearchEngine(index, verify=False)
    qvecs = _queries()
    first = engine.search_vectors(qvecs, 5, filter=engine.compile_filter(dict(FILTERS[4]), None))
    assert len(evaluated) == len(engine.shards)
    again = engine.search_vectors(qvecs[::-1], 5, filter=engine.compile_filter(dict(FILTERS[4]), None))
    assert len(evaluated) == len(engine.shards)  # no evaluation the second time
    assert [[r.chunk_id for r in p] for p in again[::-1]] == [[r.chunk_id for r in p] for p in first]
    years = [{"type": "gte", "key": "year", "value": 1990 + i} for i in range(2 * shard_module.SELECTIONS_KEPT)]
    for year_filter in years:
        engine.search_vectors(qvecs, 5, filter=engine.compile_filter(year_filter, None))
    for shard in engine.shards:
        kept = shard._selections
        assert 0 < len(kept) <= shard_module.SELECTIONS_KEPT and kept.bytes <= kept.max_bytes
    evaluated.clear()  # the most recent filter is still kept, the first ones are not
    engine.search_vectors(qvecs, 5, filter=engine.compile_filter(years[-1], None))
    assert not evaluated
    engine.search_vectors(qvecs, 5, filter=engine.compile_filter(years[0], None))
    assert len(evaluated) == len(engine.shards)
