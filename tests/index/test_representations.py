"""Representations: which vectors each one stores per chunk (pure), and what an index built with
every kind actually holds (real Ray pipeline, real MiniLM)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from qrag_ray.config.index import IndexConfig, index_config, representation_plan, resolve_representation
from qrag_ray.index.format import chunk_key
from qrag_ray.index.representations import dedup_questions, sentence_windows
from qrag_ray.index.rows import base_vector_rows
from qrag_ray.text.sentences import split_sentences

CHUNK = {"chunk_idx": 11, "shard": 1, "text": "Loops run. A break ends them. Else runs otherwise.",
         "questions": ["What ends a loop?", "what ends a loop", "When does else run?"]}
QUESTIONS = ["What ends a loop?", "When does else run?"]  # the duplicate (up to case/punctuation) collapses
SENTS = ["Loops run.", "A break ends them.", "Else runs otherwise."]
TEXT = CHUNK["text"]

EXPECTED = {  # representation -> stored (kind, embed_text) rows
    "chunk": [("chunk", TEXT)],
    "hype": [("question", q) for q in QUESTIONS],
    "atom-question": [("question", q) for q in QUESTIONS],  # precomputed questions: per chunk
    "quote": [("quote", f"{q}\n{TEXT}") for q in QUESTIONS],
    "quote-onedoc": [("onedoc", TEXT + "\n" + "\n".join(QUESTIONS))],
    "atom-sentence": [("sentence", s) for s in SENTS],
    "hybrid": [("chunk", TEXT)] + [("question", q) for q in QUESTIONS],
    "sentence+quote": [("sentence", s) for s in SENTS] + [("quote", f"{q}\n{TEXT}") for q in QUESTIONS],
    "atom-hybrid": [("chunk", TEXT)] + [("sentence", s) for s in SENTS] + [("question", q) for q in QUESTIONS]
    + [("quote", f"{q}\n{TEXT}") for q in QUESTIONS],
    "chunk+sentence+quote": [("chunk", TEXT)] + [("sentence", s) for s in SENTS]
    + [("quote", f"{q}\n{TEXT}") for q in QUESTIONS],
    # consecutive pairs only: three sentences give two windows, with no LLM
    "chunk+sentence+window": [("chunk", TEXT)] + [("sentence", s) for s in SENTS]
    + [("window", "Loops run. A break ends them."), ("window", "A break ends them. Else runs otherwise.")],
    "window": [("window", "Loops run. A break ends them."), ("window", "A break ends them. Else runs otherwise.")],
}


@pytest.mark.parametrize("rep", list(EXPECTED))
def test_rows_per_representation(rep):
    backend = "none" if rep in ("chunk", "atom-sentence", "chunk+sentence+window", "window") else "precomputed"
    cfg = IndexConfig(representation=rep, generator={"backend": backend})
    kinds, _ = representation_plan(cfg)
    rows = base_vector_rows(CHUNK, kinds, cfg, aux_questions=False)
    stored = [(r["kind"], r["embed_text"]) for r in rows if r["store"]]
    assert stored == EXPECTED[rep]
    # the chunk's own vector is always computed: stored, or kept aside for filters and fallback
    assert [r["kind"] for r in rows].count("chunk") == 1
    assert all(r["chunk_idx"] == 11 and r["shard"] == 1 for r in rows)


def test_the_question_kinds_are_the_rows_that_hold_a_question():
    """QUESTION_KINDS (what doc2query, the leakage check and the demo read as generated questions) is every
    kind whose row text is one generated question, and no other; GENERATED_KINDS adds the kinds that need
    questions to exist at all."""
    from qrag_ray.config.search_policy import GENERATED_KINDS, QUESTION_KINDS, VECTOR_KINDS
    from qrag_ray.index.representations import vector_rows

    rows = vector_rows(CHUNK, list(VECTOR_KINDS), CHUNK["questions"], SENTS, atom=SENTS[0], title="Loops")
    assert {r["kind"] for r in rows if r["text"] in QUESTIONS} == set(QUESTION_KINDS)
    without = vector_rows(CHUNK, list(VECTOR_KINDS), [], SENTS, atom=SENTS[0], title="Loops")
    assert set(VECTOR_KINDS) - {r["kind"] for r in without} == set(GENERATED_KINDS)


def test_preset_search_defaults_yield_to_the_config():
    # the preset brings its calibrated group fusion; an explicit choice wins field by field
    cfg = index_config(dict(representation="atom-hybrid", generator={"backend": "vllm"}))
    assert representation_plan(cfg) == (["chunk", "sentence", "question", "quote"], "atom")
    assert cfg.search.fusion == "sum" and cfg.search.kind_weights == {"chunk": 0.5}
    assert cfg.search.kind_bias == {"question": -0.2, "quote": -0.05}
    assert cfg.search.groups == {"atom": ["sentence", "question", "quote"]}
    mine = index_config(dict(representation="atom-hybrid", generator={"backend": "vllm"}, search={"fusion": "max"}))
    assert mine.search.fusion == "max" and mine.search.kind_bias == {"question": -0.2, "quote": -0.05}
    assert index_config(dict(representation="chunk+sentence+quote",
                             generator={"backend": "vllm"})).search.fusion == "max"


def test_bm25_preset_brings_its_channel_and_weight_unless_turned_off():
    # atom-hybrid-bm25 is atom-hybrid plus BM25 (doc2query) at alpha 0.67 (EVALUATION.md §4.8)
    cfg = index_config(dict(representation="atom-hybrid-bm25", generator={"backend": "vllm"}))
    assert representation_plan(cfg) == (["chunk", "sentence", "question", "quote"], "atom")
    assert cfg.bm25.enabled and cfg.bm25.doc2query and cfg.search.bm25_alpha == 0.67
    assert cfg.search.groups == {"atom": ["sentence", "question", "quote"]}
    # the preset must not leak into the defaults other configs start from
    plain = index_config(dict(representation="chunk"))
    assert not plain.bm25.enabled and plain.search.bm25_alpha is None and not plain.title_prefix
    assert not index_config(dict(representation="atom-hybrid", generator={"backend": "vllm"})).bm25.enabled
    # field by field: a chosen weight or doc2query setting wins; BM25 off means dense search, not an error
    mine = index_config(dict(representation="atom-hybrid-bm25", generator={"backend": "vllm"},
                             bm25={"doc2query": False}, search={"bm25_alpha": 0.5}))
    assert mine.bm25.enabled and not mine.bm25.doc2query and mine.search.bm25_alpha == 0.5
    off = index_config(dict(representation="atom-hybrid-bm25", generator={"backend": "vllm"}, bm25={"enabled": False}))
    assert not off.bm25.enabled and off.search.bm25_alpha is None and off.search.fusion == "sum"
    # each config gets its own copy of the preset's values: changing one changes no other
    cfg.search.kind_weights["chunk"] = 1.0
    assert index_config(dict(representation="atom-hybrid-bm25",
                             generator={"backend": "vllm"})).search.kind_weights == {"chunk": 0.5}
    assert index_config(dict(representation="atom-hybrid",
                             generator={"backend": "vllm"})).search.kind_weights == {"chunk": 0.5}
    cfg.search.kind_weights["chunk"] = 0.5
    # what a manifest records validates back to the same config (eval reuse, serving), no preset needed
    again = IndexConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.bm25 == cfg.bm25 and again.search == cfg.search and again.title_prefix == cfg.title_prefix


def test_question_kinds_need_a_generator():
    with pytest.raises(ValueError, match="needs generated questions"):
        IndexConfig(representation="hype")
    with pytest.raises(ValueError, match="unknown representation 'hyde-ish'"):
        IndexConfig(representation="hyde-ish")
    with pytest.raises(ValueError, match="unknown representation"):
        resolve_representation("chunk+bogus")
    assert resolve_representation("sentence+chunk") == (["sentence", "chunk"], None)
    assert resolve_representation("sentence+quote") == (["sentence", "quote"], "chunk")


def test_aux_questions_for_filters_are_not_stored():
    cfg = IndexConfig(representation="quote", generator={"backend": "precomputed"})
    rows = base_vector_rows(CHUNK, ["quote"], cfg, aux_questions=True)
    aux = [r for r in rows if r["kind"] == "question"]
    assert [r["text"] for r in aux] == QUESTIONS and not any(r["store"] for r in aux)
    # quote i and question i share qn, so pruning a question drops its quote vector too
    assert {r["qn"] for r in aux} == {r["qn"] for r in rows if r["kind"] == "quote"}


# ---------------------------------------------------------------- the built index


@pytest.fixture(scope="module")
def built(kinds_index, read_index, corpus_records):
    out, report = kinds_index
    data = read_index(out)
    qs_of = {r["id"]: r["questions"] for r in corpus_records()}
    chunks = data["chunks"].to_pylist()
    rows = {}  # chunk_idx -> list of (shard, kind, text, vector)
    for shard in data["shards"]:
        meta = shard["meta"].to_pylist()
        for i, row in enumerate(meta):
            rows.setdefault(row["chunk_idx"], []).append((shard["id"], row["kind"], row["text"], shard["vectors"][i]))
    return data, chunks, rows, qs_of, report


@pytest.mark.integration
def test_vectors_per_kind(built):
    data, chunks, rows, qs_of, report = built
    assert len(chunks) == report.chunks > len(qs_of)  # 120-token windows split the longer topics
    total = Counter()
    for chunk in chunks:
        got = Counter(k for _, k, _, _ in rows[chunk["chunk_idx"]])
        n_questions = len(dedup_questions(qs_of[chunk["doc_id"]]))
        want = {"chunk": 1, "sentence": len(set(split_sentences(chunk["text"]))), "question": n_questions,
                "quote": n_questions,
                "onedoc": 1}
        assert dict(got) == want, chunk["chunk_id"]
        total.update(got)
    manifest = data["manifest"]
    assert sum(total.values()) == manifest["counts"]["vectors"] == report.vectors
    assert manifest["counts"]["questions"] == total["question"] == report.questions
    assert manifest["kinds"] == ["chunk", "sentence", "question", "quote", "onedoc"]


@pytest.mark.integration
def test_stored_vectors_are_minilm_embeddings(built, embed):
    """quote stores embed("question\\nchunk"); question, sentence and chunk store their own text's
    embedding; onedoc embeds the chunk followed by all its questions."""
    _, chunks, rows, qs_of, _ = built
    for chunk in chunks[:4]:
        by_kind = {}
        for _, kind, text, vec in rows[chunk["chunk_idx"]]:
            by_kind.setdefault(kind, []).append((text, vec))
        questions = dedup_questions(qs_of[chunk["doc_id"]])
        expect = ([f"{t}\n{chunk['text']}" for t, _ in by_kind["quote"]] + [t for t, _ in by_kind["question"]]
                  + [t for t, _ in by_kind["sentence"]] + [chunk["text"], chunk["text"] + "\n" + "\n".join(questions)])
        got = np.stack([v for k in ("quote", "question", "sentence", "chunk", "onedoc") for _, v in by_kind[k]])
        np.testing.assert_allclose(got, embed(expect), atol=2e-4)
        # the matched text shown for a quote vector is the question alone
        assert sorted(t for t, _ in by_kind["quote"]) == sorted(questions)


@pytest.mark.integration
def test_vectors_are_unit_norm(built):
    data = built[0]
    for shard in data["shards"]:
        np.testing.assert_allclose(np.linalg.norm(shard["vectors"], axis=1), 1.0, atol=1e-4)


@pytest.mark.integration
def test_all_vectors_of_a_chunk_in_its_shard(built):
    data, chunks, rows, _, _ = built
    n_shards = data["manifest"]["num_shards"]
    assert n_shards == 3
    for chunk in chunks:
        assert chunk["chunk_idx"] == chunk_key(chunk["chunk_id"])
        assert chunk["shard"] == chunk["chunk_idx"] % n_shards
        assert {s for s, *_ in rows[chunk["chunk_idx"]]} == {chunk["shard"]}
    # each chunk in exactly one row of chunks.parquet, and no vector points at an unknown chunk
    ids = [c["chunk_idx"] for c in chunks]
    assert len(ids) == len(set(ids)) and set(rows) == set(ids)
    assert all(s["index"].ntotal > 0 for s in data["shards"])  # 3 shards, all used on this corpus


def test_sentence_windows_need_two_sentences():
    assert sentence_windows([]) == []
    assert sentence_windows(["Only one."]) == []
    assert sentence_windows(["A.", "B.", "C."]) == ["A. B.", "B. C."]


def test_default_preset_is_what_index_builds_without_a_representation():
    """The title-prefixed chunk at half weight + its best sentence or window + stemmed BM25 at alpha
    0.67, the best mean across the suite."""
    cfg = index_config({})
    assert cfg.representation == "default" and representation_plan(cfg) == (["chunk", "sentence", "window"], None)
    assert cfg.search.fusion == "sum" and cfg.search.kind_weights == {"chunk": 0.5}
    assert cfg.title_prefix and cfg.bm25.enabled and cfg.bm25.stemmer == "english" and cfg.search.bm25_alpha == 0.67
    # --no-bm25 gives its dense form, and a chosen title setting wins
    off = index_config({"bm25": {"enabled": False}, "title_prefix": False})
    assert off.search.bm25_alpha is None and not off.title_prefix
    assert not index_config({"representation": "chunk"}).bm25.enabled
