"""`qrag info`: an index's description and sample chunks with the questions generated for them, read from
the index's own tables; a bad path or a corrupt index is one error line and exit 2."""

from __future__ import annotations

import json
import shutil

import pytest

from qrag_ray.cli import main
from qrag_ray.index.representations import dedup_questions
from support.corpus import PYDOC_QUESTIONS


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.integration
def test_info_describes_the_index_and_lists_its_sample_chunks_questions(client_index, capsys):
    code, out, err = run(["info", "--index", str(client_index), "--sample", "4", "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    manifest = json.loads((client_index / "manifest.json").read_text())
    assert (summary["representation"], summary["preset"]) == ("hybrid", "hybrid@1")
    assert summary["index_version"] == manifest["index_version"]
    assert summary["counts"] == manifest["counts"]
    assert sum(summary["vectors_per_kind"].values()) == manifest["counts"]["vectors"]
    assert set(summary["vectors_per_kind"]) == {"chunk", "question"} and summary["bm25"] is None
    assert summary["embedder"] == {"model": "all-MiniLM-L6-v2", "dim": 384} and summary["num_shards"] == 1
    on_disk = sum(p.stat().st_size for p in client_index.rglob("*") if p.is_file())
    assert summary["bytes"]["total"] == on_disk and summary["bytes"]["faiss"] > 0 and summary["build_seconds"] > 0
    if summary["metadata_schema"] is not None:  # a build that records the corpus's metadata fields
        assert {"group", "order", "tags"} <= set(summary["metadata_schema"])
    samples = summary["samples"]
    assert len(samples) == 4 and len({x["doc_id"] for x in samples}) >= 3  # spread over the index
    for entry in samples:  # precomputed questions belong to every chunk of their document, each once
        assert entry["questions"] == dedup_questions(PYDOC_QUESTIONS[entry["doc_id"]]), entry
        assert entry["text"] and entry["chunk_id"].startswith(entry["doc_id"] + "#")

    code, out, err = run(["info", "--index", str(client_index), "--sample", "2"], capsys)
    assert code == 0, err
    assert "hybrid (preset hybrid@1" in out and "vectors per kind" in out and "bm25             none" in out
    shown = json.loads(run(["info", "--index", str(client_index), "--sample", "2", "--json"], capsys)[1])["samples"]
    assert len(shown) == 2
    for sample in shown:  # every chunk has precomputed questions: the listing shows them
        assert sample["questions"] and sample["chunk_id"] in out
        assert all(f"- {q}" in out for q in sample["questions"])


@pytest.mark.integration
def test_a_corrupt_table_is_one_line(client_index, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(client_index, bad)
    (bad / "chunks.parquet").write_bytes(b"not parquet at all")
    code, out, err = run(["info", "--index", str(bad)], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: corrupt index") and "chunks.parquet" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("make,says", [
    (lambda d: d / "missing", "index not found"),
    (lambda d: (d / "file.txt").write_text("x") and d / "file.txt", "index not found"),
    (lambda d: d, "is not a qrag index (no manifest.json)"),
    (lambda d: (d / "manifest.json").write_text("{not json") and d, "corrupt manifest"),
    (lambda d: (d / "manifest.json").write_text('{"format_version": 2}') and d, "corrupt manifest"),
])
def test_bad_paths_are_one_line(tmp_path, capsys, make, says):
    code, out, err = run(["info", "--index", str(make(tmp_path))], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
