"""Incremental versions of an index: `--append` adds documents and `--delete-ids` removes them without
re-embedding the unchanged chunks, and the published index equals a full rebuild over the same
documents (file for file, hence the same search results). Real Ray, MiniLM and FAISS."""

from __future__ import annotations

import json

import pytest

from qrag_ray.errors import QragError
from qrag_ray.index.format import load_manifest
from qrag_ray.index.incremental import incremental_config

QUERIES = ["When does the else clause of a for loop run?", "What does the assert statement do?",
           "How do I make an object usable in a with statement?", "What is a lambda expression?"]


def _search(open_engine, index):
    """(chunk id, score) of each query's top 4: four for every query, so two indexes compare on results."""
    engine = open_engine(index)
    pages = [[(r["chunk_id"], round(r["score"], 5)) for r in res] for res in engine.search(QUERIES, k=4)]
    assert [len(page) for page in pages] == [4] * len(QUERIES), pages
    return pages


@pytest.mark.slow
@pytest.mark.soak  # CI holds the same equality through compaction (tests/index/test_write_compaction.py)
def test_append_and_delete_equal_a_full_rebuild(local_ray, build_with, corpus_records, jsonl_writer, tmp_path,
                                               open_engine):
    from qrag_ray.index.build import build_index

    docs = corpus_records()
    # metadata travels too: the appended documents add a field (`since`), which an append may do
    for i, doc in enumerate(docs):
        doc["metadata"] = {"n": i, **({"since": f"2024-01-{i + 1:02d}"} if i >= 9 else {})}
    old = jsonl_writer(tmp_path / "old.jsonl", docs[:9])
    new = jsonl_writer(tmp_path / "new.jsonl", docs[9:])
    both = jsonl_writer(tmp_path / "both.jsonl", docs)
    common = {"representation": "hybrid", "generator.backend": "precomputed", "shards": 2,
              "chunker.method": "none"}
    out = tmp_path / "idx"
    first = build_with({**common, "input": str(old), "build.output": str(out), "build.keep_work": True})
    assert (tmp_path / ".idx.work").is_dir()

    appended = build_index(incremental_config(str(out), append=str(new)))
    full = build_with({**common, "input": str(both), "build.output": str(tmp_path / "full")})
    # only the new documents were embedded; the rest came from the kept checkpoints
    assert appended.vectors_reused == first.vectors
    assert appended.vectors_embedded == full.vectors - first.vectors > 0
    assert load_manifest(out).index_version != first.manifest.index_version  # a new version
    appended_manifest = load_manifest(out, verify=True).data
    full_manifest = load_manifest(tmp_path / "full").data
    assert appended_manifest["files"] == full_manifest["files"]
    assert appended_manifest["counts"] == full_manifest["counts"]
    assert appended_manifest["metadata_schema"] == {"n": "number", "since": "date"} == full_manifest["metadata_schema"]
    assert _search(open_engine, out) == _search(open_engine, tmp_path / "full")

    ids = tmp_path / "gone.txt"
    ids.write_text("for\nlambda\n")
    deleted = build_index(incremental_config(str(out), delete_ids=str(ids)))
    assert deleted.vectors_embedded == 0 and deleted.documents == len(docs) - 2
    rest = jsonl_writer(tmp_path / "rest.jsonl", [d for d in docs if d["id"] not in ("for", "lambda")])
    ref = build_with({**common, "input": str(rest), "build.output": str(tmp_path / "ref")})
    deleted_manifest = load_manifest(out, verify=True).data
    ref_manifest = load_manifest(tmp_path / "ref").data
    assert deleted_manifest["files"] == ref_manifest["files"] and deleted.vectors == ref.vectors
    hits = _search(open_engine, out)
    assert hits == _search(open_engine, tmp_path / "ref")
    assert not any(cid.split("#")[0] in ("for", "lambda") for res in hits for cid, _ in res)
    assert json.loads((out / "manifest.json").read_text())["config"]["build"]["delete_ids"] == [str(ids)]
    # a type change is the build's one error line, and the published index stays as it was
    bad = jsonl_writer(tmp_path / "bad.jsonl", [{"id": "zz", "text": "One more.", "metadata": {"n": "seven"}}])
    with pytest.raises(QragError, match="metadata field 'n' is a string, but document '.*' has it as a number"):
        build_index(incremental_config(str(out), append=str(bad)))
    assert load_manifest(out).metadata_schema == {"n": "number", "since": "date"}


def test_an_append_may_add_metadata_fields_but_not_change_a_type():
    from qrag_ray.index.incremental import check_fields

    check_fields({"n": "number"}, {"n": "number", "lang": "string"})
    check_fields(None, {"n": "number"})
    check_fields({"n": "number", "gone": "bool"}, {"n": "number"})  # deleted documents may take a field along
    with pytest.raises(QragError, match="metadata field 'n' is a string in the new documents, but the published "
                                        "index has it as a number"):
        check_fields({"n": "number"}, {"n": "string"})


def test_an_index_built_by_an_older_preset_keeps_its_kinds(tmp_path):
    """default@1 was one vector per chunk; appending to an index it built must not add sentence and
    window vectors for the new documents only (the recorded config names `default`, whose kinds changed)."""
    from qrag_ray.config.index import index_config, representation_plan

    old = index_config({"representation": "chunk-bm25", "input": str(tmp_path / "a.jsonl")}).model_dump(mode="json")
    old["representation"] = "default"  # as default@1 recorded it: its search settings were chunk-bm25's
    idx = tmp_path / "idx"
    idx.mkdir()
    (idx / "manifest.json").write_text(json.dumps({
        "format_version": 1, "index_version": "v1", "num_shards": 0, "shards": [], "files": {},
        "embedder": {"model": "all-MiniLM-L6-v2", "dim": 384}, "representation": "default", "kinds": ["chunk"],
        "config": old}))
    cfg = incremental_config(str(idx), append=str(tmp_path / "b.jsonl"))
    assert representation_plan(cfg) == (["chunk"], None) and cfg.representation == "chunk"
    assert cfg.title_prefix and cfg.search.bm25_alpha == 0.67 and cfg.bm25.enabled
    assert cfg.build.extra_inputs == [str(tmp_path / "b.jsonl")]


def test_an_index_recorded_before_run_settings_moved_still_grows(tmp_path):
    """A manifest written before `index:` became `faiss:` and run settings moved under `build:`."""
    from qrag_ray.config.index import index_config

    old = index_config({"representation": "chunk", "input": str(tmp_path / "a.jsonl")}).model_dump(mode="json")
    old["index"] = old.pop("faiss") | {"nprobe": 8}
    old["embedder"] |= {"actors": 2, "batch_size": 16}
    old |= {"output": "/elsewhere", "cache_dir": "/c"}
    del old["build"]["embedder"], old["build"]["output"], old["build"]["cache_dir"]
    idx = tmp_path / "idx"
    idx.mkdir()
    (idx / "manifest.json").write_text(json.dumps({
        "format_version": 1, "index_version": "v1", "num_shards": 0, "shards": [], "files": {},
        "embedder": {"model": "all-MiniLM-L6-v2", "dim": 384}, "representation": "chunk", "kinds": ["chunk"],
        "config": old}))
    cfg = incremental_config(str(idx), append=str(tmp_path / "b.jsonl"))
    assert cfg.faiss.nprobe == 8 and cfg.build.embedder.actors == 2 and cfg.build.cache_dir == "/c"
    assert cfg.build.output == str(idx) and cfg.build.overwrite
