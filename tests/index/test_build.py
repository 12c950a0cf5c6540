"""The build (qrag_ray.index.build) end to end: build report, Q-Q pruning with its fallback, a crash mid-write
that must leave the previous index loadable, every named preset's plan and (slow) real builds of the
presets that cover every pipeline path, and of a trained FAISS factory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from qrag_ray.errors import QragError
from qrag_ray.index.format import load_manifest
from qrag_ray.index.question_filters import greedy_prune
from qrag_ray.index.representations import dedup_questions


@pytest.mark.integration
def test_build_report(kinds_index):
    _, report = kinds_index
    assert report.documents == 14 and report.chunks > 14
    assert report.vectors == report.vectors_before_filters > report.chunks
    seconds = report.stage_seconds
    # each stage measured (a stage that recorded no time reads 0), and the driver's sequential stages
    # inside the total
    for stage in ("read+chunk", "embed", "stream", "build-shards", "total"):
        assert seconds[stage] > 0, seconds
    assert seconds["stream"] + seconds["build-shards"] <= seconds["total"], seconds
    assert report.generation.generated == 0  # precomputed: no LLM call


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.soak  # CI builds the GPU layout, its tokenizing workers included, to the same bytes (test_cpu_kernels.py)
def test_tokenizing_in_cpu_workers_writes_the_same_index(kinds_index, build_with, pydoc_jsonl, tmp_path):
    """The GPU build's shape (texts tokenized in CPU workers, the embedding actor only runs the model),
    forced on the CPU: every vector is the same bits, so the index files are the same bytes. A pool of
    two tokenizing workers covers the path; the default (every CPU slot left: six in the tests' Ray)
    would start six actors for it."""
    ref, _ = kinds_index
    out = tmp_path / "split"
    build_with({"input": str(pydoc_jsonl), "build.output": str(out), "shards": 3,
                "representation": "chunk+sentence+question+quote+onedoc", "generator.backend": "precomputed",
                "faiss.factory": "Flat", "chunker.method": "token", "chunker.size": 120, "chunker.overlap": 20,
                "build.embedder.tokenize": "tasks", "build.embedder.tokenizers": 2})
    ref_manifest = json.loads((ref / "manifest.json").read_text())
    out_manifest = json.loads((out / "manifest.json").read_text())
    assert ref_manifest["files"] and ref_manifest["files"] == out_manifest["files"]
    assert ref_manifest["counts"] == out_manifest["counts"]


@pytest.mark.integration
def test_pruning_and_fallback(filtered_index, read_index, corpus_records, embed):
    out, report = filtered_index
    data = read_index(out)
    manifest = data["manifest"]
    assert manifest["counts"]["vectors_before_filters"] == report.vectors_before_filters
    assert report.vectors < report.vectors_before_filters  # vectors before/after are reported
    per_chunk = {}
    for shard in data["shards"]:
        for row in shard["meta"].to_pylist():
            per_chunk.setdefault(row["chunk_idx"], []).append((row["kind"], row["text"]))
    chunks = {c["doc_id"]: c for c in data["chunks"].to_pylist()}  # chunker none: one chunk per doc
    assert len(chunks) == 14 and len(per_chunk) == 14  # no chunk lost all its vectors
    # off-topic questions are all filtered: the chunk stays reachable through its own text
    assert per_chunk[chunks["pass"]["chunk_idx"]] == [("chunk", chunks["pass"]["text"])]
    # near-duplicates pruned greedily at tau=0.8, exactly as the definition says
    for doc in corpus_records():
        if doc["id"] == "pass":
            continue
        questions = dedup_questions(doc["questions"])
        cvec = embed([chunks[doc["id"]]["text"]])[0]
        question_vecs = embed(questions)
        close = np.flatnonzero(question_vecs @ cvec >= 0.1)
        kept = [questions[i] for i in close[greedy_prune(question_vecs[close], 0.8)]]
        assert per_chunk[chunks[doc["id"]]["chunk_idx"]] == [("question", q) for q in kept], doc["id"]
    brk = per_chunk[chunks["break"]["chunk_idx"]]
    assert len(brk) < len(dedup_questions(next(d["questions"] for d in corpus_records() if d["id"] == "break")))


@pytest.mark.integration
def test_crash_mid_write_keeps_old_index(kinds_index, build_with, tmp_path, monkeypatch, jsonl_writer, open_engine,
                                         corpus_records):
    """The shard files are written, then the process 'dies' while writing the manifest: OUTPUT still
    holds the previous, fully valid index and no staging dir is left behind."""
    import qrag_ray.index.build as build

    out = tmp_path / "idx"
    shutil.copytree(kinds_index[0], out)
    before = load_manifest(out, verify=True).index_version
    corpus = jsonl_writer(tmp_path / "small.jsonl", corpus_records(with_questions=False)[:2])
    real = build.write_manifest

    def dying_write_manifest(staging, data):
        assert any((staging / "shards").glob("*.faiss"))  # the new shards were already on disk
        (staging / "manifest.json").write_text('{"format_version": 1, "trunc')
        raise RuntimeError("simulated crash while writing the manifest")

    monkeypatch.setattr(build, "write_manifest", dying_write_manifest)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_with({"input": str(corpus), "build.output": str(out), "representation": "chunk", "build.overwrite": True})
    monkeypatch.setattr(build, "write_manifest", real)
    assert load_manifest(out, verify=True).index_version == before
    # no staging dir is left; the work dir (checkpoints) is, so the same command resumes
    assert sorted(p.name for p in tmp_path.iterdir()) == [".idx.work", "idx", "small.jsonl"]
    res = open_engine(out).search(["What does the assert statement do?"], k=3)[0]
    assert len(res) == 3
    again = build_with({"input": str(corpus), "build.output": str(out), "representation": "chunk",
                        "build.overwrite": True})
    assert again.vectors_embedded == 0 and again.vectors_reused == again.vectors > 0
    assert again.shards_reused == 1  # only the manifest and the publish were left to do
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "small.jsonl"]
    assert load_manifest(out, verify=True).data["counts"]["documents"] == 2


@pytest.mark.integration
def test_bad_input_fails_before_writing(local_ray, build_with, tmp_path, jsonl_writer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(QragError, match="empty corpus"):
        build_with({"input": str(empty), "build.output": str(tmp_path / "o1")})
    dup = jsonl_writer(tmp_path / "dup.jsonl", [{"id": "a", "text": "one"}, {"id": "a", "text": "two"}])
    with pytest.raises(QragError, match="duplicate document id"):
        build_with({"input": str(dup), "build.output": str(tmp_path / "o2")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dup.jsonl", "empty.jsonl"]


# ---------------------------------------------------------------- the named presets, a trained factory, a crash


# every named preset: what its plan stores, whether it builds BM25 and prefixes titles (pure config)
PRESET_KINDS = {
    "chunk": {"chunk"}, "hype": {"question"}, "quote": {"quote"}, "quote-onedoc": {"onedoc"},
    "atom-sentence": {"sentence"}, "atom-question": {"question"}, "hybrid": {"chunk", "question"},
    "atom-hybrid": {"chunk", "sentence", "question", "quote"},
    "atom-hybrid-bm25": {"chunk", "sentence", "question", "quote"},
    "sentence-window-bm25": {"chunk", "sentence", "window"}, "default": {"chunk", "sentence", "window"},
    "chunk-bm25": {"chunk"},
}
WITH_BM25 = {"atom-hybrid-bm25", "sentence-window-bm25", "default", "chunk-bm25"}


def test_every_named_preset_plans_its_kinds():
    from qrag_ray.config.index import index_config, representation_plan
    from qrag_ray.config.presets import PRESETS

    assert set(PRESET_KINDS) == set(PRESETS)
    for rep, kinds in PRESET_KINDS.items():
        cfg = index_config({"representation": rep, "generator": {"backend": "precomputed"}})
        assert set(representation_plan(cfg)[0]) == kinds, rep
        assert cfg.bm25.enabled == (rep in WITH_BM25), rep
        assert cfg.title_prefix == (rep in ("default", "chunk-bm25")), rep


# Real builds of the presets that between them take every pipeline path the plans above name: questions
# per atom beside sentences, quotes and BM25; one vector from the chunk and all its questions; sentence
# windows with the title prefix and BM25. The other presets store subsets of these kinds. CI builds the
# default; the other two are soak: their kinds are built in the fast tier (the `kinds_index` fixture's
# chunk, sentence, question, quote and onedoc vectors; atom questions in tests/generation/test_requests_cache.py).
@pytest.mark.slow
@pytest.mark.parametrize("rep", [pytest.param("atom-hybrid-bm25", marks=pytest.mark.soak),
                                 pytest.param("quote-onedoc", marks=pytest.mark.soak), "default"])
def test_named_presets_build_and_search(rep, build_with, local_ray, pydoc_jsonl, tmp_path, open_engine):
    kinds = PRESET_KINDS[rep]
    backend = "none" if rep == "default" else "precomputed"
    report = build_with({"input": str(pydoc_jsonl), "build.output": str(tmp_path / rep), "representation": rep,
                         "generator.backend": backend, "shards": 2, "chunker.method": "none"})
    manifest = load_manifest(tmp_path / rep, verify=True)
    assert {k for s in manifest.data["shards"] for k in s["kinds"]} == kinds
    assert manifest.representation == rep and report.chunks == 14
    res = open_engine(tmp_path / rep).search(["When does the else clause of a for loop run?"], k=3)[0]
    assert len({r["chunk_id"] for r in res}) == 3
    # only the presets with BM25 build the channel, and their results carry the lexical score
    assert manifest.has_bm25 == (rep in WITH_BM25)
    assert manifest.data["config"]["title_prefix"] == (rep == "default")
    assert all(("bm25" in r) == manifest.has_bm25 for r in res)


@pytest.mark.slow
def test_a_trained_factory_through_the_pipeline(build_with, local_ray, pydoc_jsonl, tmp_path, open_engine):
    """A factory that needs training goes through the pipeline's training task (each factory's index
    class is tests/index/test_index_format.py's)."""
    import faiss

    factory = "IVF4,PQ8x4"  # 4-bit PQ: 16 centroids fit ~70 vectors/shard

    out = tmp_path / "idx"
    build_with({"input": str(pydoc_jsonl), "build.output": str(out), "representation": "atom-sentence", "shards": 2,
                "faiss.factory": factory, "faiss.nprobe": 4, "chunker.method": "none"})
    manifest = load_manifest(out, verify=True)
    assert manifest.data["faiss"]["factory"] == factory
    raw = faiss.read_index(str(out / manifest.shard(0).faiss))  # keep it: downcast_index does not own it
    idx = faiss.downcast_index(raw)
    assert isinstance(idx, faiss.IndexIVFPQ)
    assert idx.ntotal == manifest.shard(0).vectors > 0
    res = open_engine(out).search(["When does the else clause of a for loop run?"], k=5)[0]
    assert len({r["chunk_id"] for r in res}) == 5 and res[0]["doc_id"] in ("for", "while", "break")


# soak: the same property with an injected crash runs in every CI (test_crash_mid_write_keeps_old_index),
# and a real SIGKILL of `qrag index` in tests/index/test_resume.py
@pytest.mark.slow
@pytest.mark.soak
def test_killed_build_leaves_old_index(kinds_index, tmp_path, pydoc_jsonl):
    """A real crash: SIGKILL the `qrag index` process while it runs; the old index at OUTPUT stays
    loadable and the leftovers are the `.OUTPUT.work` checkpoints (tests/index/test_resume.py resumes them)
    or a `.OUTPUT.tmp-*` folder that no reader loads."""
    out = tmp_path / "idx"
    shutil.copytree(kinds_index[0], out)
    before = load_manifest(out, verify=True).index_version
    cmd = [sys.executable, "-m", "qrag_ray.cli", "index", "--input", str(pydoc_jsonl), "--output", str(out),
           "--representation", "atom-sentence", "--overwrite"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 300
    # the first checkpoint part: the build is mid-way (the staging dir only appears at publish time)
    while time.time() < deadline and proc.poll() is None and not list(tmp_path.glob(".idx.work/vectors/*/*.parquet")):
        time.sleep(0.2)
    if proc.poll() is not None:
        pytest.fail(f"qrag index exited ({proc.returncode}) before it could be killed: {proc.stderr.read()[-2000:]}")
    assert list(tmp_path.glob(".idx.work/vectors/*/*.parquet")), "the build never started writing"
    os.killpg(proc.pid, signal.SIGKILL)  # the whole process group this test started (driver + its Ray)
    proc.wait(timeout=60)
    assert load_manifest(out, verify=True).index_version == before
    for leftover in tmp_path.glob(".idx.tmp-*"):
        assert not (leftover / "manifest.json").exists()
    assert json.loads((out / "manifest.json").read_text())["representation"] != "atom-sentence"


def test_factory_errors_are_user_errors():
    """A factory string FAISS rejects, or a shard too small to train IVF-PQ, is a config mistake:
    a clear QragError (one CLI line), not a FAISS traceback."""
    from qrag_ray.config.index import FaissConfig
    from qrag_ray.index.writer import build_faiss

    vecs = np.random.default_rng(0).standard_normal((48, 32)).astype(np.float32)
    with pytest.raises(QragError, match="invalid FAISS factory string 'Bogus'"):
        build_faiss(vecs, FaissConfig(factory="Bogus"))
    with pytest.raises(QragError, match="cannot train FAISS 'IVF4,PQ8' on 48 vectors"):
        build_faiss(vecs, FaissConfig(factory="IVF4,PQ8"))
