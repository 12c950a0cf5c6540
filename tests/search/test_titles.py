"""Titles are evidence: a query that matches only a document's title finds that document,
through a real index (real MiniLM, real FAISS, real bm25s), whether the title is prefixed to the chunk's
embedded text or is a vector of its own."""

from __future__ import annotations

import pytest

from qrag_ray.index.representations import title_text, vector_rows

# Six short biographies whose texts never name their subject: only the title says who each one is.
DOCS = [
    ("okonkwo", "Marguerite Okonkwo-Lindqvist",
     "She was born in 1901 and worked as a chemist in a small laboratory by the sea."),
    ("haddad", "Tobias Haddad-Vermeulen",
     "He was born in 1899 and worked as a chemist in a laboratory near the harbour."),
    ("sato", "Ingrid Sato-Fairweather", "She was born in 1903 and taught chemistry at a school in the mountains."),
    ("brennan", "Casimir Brennan-Oduya", "He was born in 1898 and ran a pharmacy in a market town."),
    ("moreau", "Yelena Moreau-Achebe", "She was born in 1905 and studied minerals in a university museum."),
    ("quist", "Rafael Quist-Nakamura", "He was born in 1900 and repaired scientific instruments for a living."),
]
QUERY = "Tobias Haddad-Vermeulen"  # the texts alone rank another biography first (the control below)


@pytest.fixture(scope="module")
def titled_corpus(tmp_path_factory, jsonl_writer):
    path = tmp_path_factory.mktemp("titled") / "bios.jsonl"
    return jsonl_writer(path, [{"id": i, "title": t, "text": x} for i, t, x in DOCS])


def _top_doc(local_ray, build_with, open_engine, corpus, out, **cfg) -> list[str]:
    build_with({"input": str(corpus), "build.output": str(out), "chunker.method": "none", "faiss.factory": "Flat",
                **cfg})
    return [r["doc_id"] for r in open_engine(out).search([QUERY], k=3)[0]]


@pytest.mark.integration
@pytest.mark.parametrize("cfg", [
    {"representation": "chunk", "title_prefix": True},
    {"representation": "chunk+title", "search.experimental.fusion": "max"},
    {"representation": "chunk", "bm25.enabled": True, "search.bm25_alpha": 0.0, "title_prefix": False,
     "_kinds": "chunk+title"},
], ids=["prefix", "title-vector", "title-in-bm25"])
def test_a_title_only_match_retrieves_its_document(cfg, local_ray, build_with, open_engine, titled_corpus, tmp_path):
    cfg = dict(cfg)
    if "_kinds" in cfg:
        cfg["representation"] = cfg.pop("_kinds")
    assert _top_doc(local_ray, build_with, open_engine, titled_corpus, tmp_path / "idx", **cfg)[0] == "haddad"


@pytest.mark.integration
def test_without_titles_the_same_query_misses(local_ray, build_with, open_engine, titled_corpus, tmp_path):
    """The control: the texts alone do not single the document out, so the tests above measure titles."""
    top = _top_doc(local_ray, build_with, open_engine, titled_corpus, tmp_path / "idx", representation="chunk")
    assert top and top[0] != "haddad"


def test_title_rows_are_built_only_when_asked():
    chunk = {"chunk_idx": 4, "shard": 0, "text": "Body text."}
    rows = vector_rows(chunk, ["chunk"], [], title="Super_Bowl_50")
    assert [(r["kind"], r["embed_text"]) for r in rows] == [("chunk", "Body text.")]
    rows = vector_rows(chunk, ["chunk", "title"], [], title="Super_Bowl_50", title_prefix=True)
    assert [(r["kind"], r["text"], r["embed_text"]) for r in rows] == [
        ("chunk", "Body text.", "Super Bowl 50\nBody text."), ("title", "Super Bowl 50", "Super Bowl 50")]
    untitled = vector_rows(chunk, ["chunk", "title"], [], title="")
    assert [r["kind"] for r in untitled] == ["chunk"]  # no empty title vector
    assert title_text("  A_b  c ") == "A b c"
