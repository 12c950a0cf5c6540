"""`qrag eval` end to end on a small labelled set the test writes: real Ray, FAISS and MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qrag_ray.cli import main
from qrag_ray.io.pydoc_corpus import unwrap

TOPICS = ("assert", "class", "for", "try", "while", "import", "lambda", "global")
QUERIES = {
    "q-for": ("How does a for loop iterate over the items of a sequence?", "for"),
    "q-assert": ("How do I insert debugging assertions into a program?", "assert"),
    "q-import": ("How does Python find and load a module?", "import"),
    "q-lambda": ("How do I create an anonymous function?", "lambda"),
}


@pytest.fixture(scope="module")
def eval_folder(tmp_path_factory) -> Path:
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("evalset")
    with (root / "corpus.jsonl").open("w") as file:
        for topic in TOPICS:
            # precomputed questions: one of them is verbatim a test query (leakage)
            questions = [QUERIES["q-for"][0]] if topic == "for" else [f"What is the {topic} statement?"]
            file.write(json.dumps({"id": topic, "title": topic, "text": unwrap(topics[topic])[:1500],
                                   "questions": questions}) + "\n")
    with (root / "queries.jsonl").open("w") as file:
        for qid, (text, _) in QUERIES.items():
            file.write(json.dumps({"id": qid, "text": text}) + "\n")
    (root / "qrels.tsv").write_text("".join(f"{qid}\t{doc}\t1\n" for qid, (_, doc) in QUERIES.items()))
    return root


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.soak  # CI's slices phase runs `qrag suite`, the same driver, side by side with index reuse
def test_eval_side_by_side_writes_report_and_reuses_indexes(eval_folder, tmp_path):
    out = tmp_path / "run"
    args = ["eval", "--dataset", "jsonl", "--data", str(eval_folder), "--representations", "chunk,atom-sentence",
            "--k", "1,5", "--output", str(out)]
    assert main(args) == 0
    res = json.loads((out / "results.json").read_text())
    results = res["representations"]
    assert set(results) == {"chunk", "atom-sentence"}
    for label, result in results.items():
        metrics = result["metrics"]
        assert 0.0 <= metrics["R@1"] <= metrics["R@5"] <= 1.0, (label, metrics)
        assert metrics["R@5"] >= 0.75, (label, metrics)  # 4 easy queries over 8 documents
        assert result["vectors"] >= result["chunks"] >= len(TOPICS)
    assert results["atom-sentence"]["vectors"] > results["chunk"]["vectors"]
    assert (out / "results.md").read_text().count("`atom-sentence`") == 1
    assert (out / "recall.png").stat().st_size > 1000
    # a second run with the same settings reuses both indexes
    assert main(args) == 0
    again = json.loads((out / "results.json").read_text())
    again = again["representations"]
    assert all(r["index_reused"] for r in again.values())
    assert again["chunk"]["metrics"] == results["chunk"]["metrics"]


@pytest.mark.integration
def test_leakage_is_reported_and_strict_fails(eval_folder, tmp_path, capsys):
    out = tmp_path / "leak"
    base = ["eval", "--dataset", "jsonl", "--data", str(eval_folder), "--representations", "hype",
            "--generator", "precomputed", "--k", "1", "--output", str(out)]
    assert main(base) == 0
    res = json.loads((out / "results.json").read_text())
    hype = (res["representations"])["hype"]
    assert hype["leaked_queries"] == 1
    assert hype["questions"] == len(TOPICS)
    capsys.readouterr()
    assert main(base + ["--strict"]) == 2
    err = capsys.readouterr().err
    assert "leakage" in err and "Traceback" not in err


def test_bad_eval_input_is_one_line(tmp_path, capsys):
    assert main(["eval", "--dataset", "squad", "--data", str(tmp_path / "missing.json"), "--output",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err and "Traceback" not in err and len(err.splitlines()) == 1
    assert main(["eval", "--dataset", "nope", "--data", str(tmp_path), "--output", str(tmp_path / "o")]) == 2
    capsys.readouterr()
    assert main(["eval", "--dataset", "jsonl", "--data", str(tmp_path), "--offset", "-1", "--output",
                 str(tmp_path / "o")]) == 2
    assert "--offset must be 0 or more" in capsys.readouterr().err
    # two variants with one label would share an index folder and one result: refused before any work
    assert main(["eval", "--dataset", "jsonl", "--data", str(tmp_path), "--representations", "chunk,chunk",
                 "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "duplicate evaluation variants" in err and len(err.strip().splitlines()) == 1


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.soak  # an option of the driver CI's slices phase runs
def test_offset_evaluates_a_held_out_slice(eval_folder, tmp_path):
    """Another slice into the same output folder: evaluated on its own index, not the first slice's."""
    import pyarrow.parquet as pq

    out = tmp_path / "held"
    for offset in ("0", "2"):
        assert main(["eval", "--dataset", "jsonl", "--data", str(eval_folder), "--representations", "chunk",
                     "--k", "1", "--offset", offset, "--subset", "3", "--output", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    # the documents the index was built from
    corpus = set(pq.read_table(out / "indexes" / "chunk" / "chunks.parquet", columns=["doc_id"]).column(0).to_pylist())
    all_ids = [json.loads(x).get("id") or json.loads(x).get("doc_id")
               for x in (eval_folder / "corpus.jsonl").read_text().splitlines()]
    assert corpus == set(all_ids[2:5])
    assert res["meta"]["offset"] == 2 and res["meta"]["documents"] == 3


def write_manifest(index_dir: Path, config: dict, kinds: list[str]) -> None:
    """A manifest as a build of another release could have left it (no files: nothing else to read)."""
    index_dir.mkdir(parents=True, exist_ok=True)
    (index_dir / "manifest.json").write_text(json.dumps({
        "format_version": 2, "index_version": "0", "files": {}, "representation": config["representation"],
        "embedder": {"model": "all-MiniLM-L6-v2", "dim": 384}, "num_shards": 0, "shards": [],
        "config": config, "kinds": kinds}))


def test_reuse_needs_the_same_kinds_not_just_the_same_config(tmp_path):
    """A preset whose kinds changed (atom-hybrid gained bare question vectors) must not reuse an index
    built under the old preset with an otherwise identical config."""
    from qrag_ray.config.index import index_config
    from qrag_ray.evaluation.driver import find_reusable

    cfg = index_config({"representation": "atom-hybrid", "generator": {"backend": "precomputed"}})
    folder = tmp_path / "indexes" / "atom-hybrid"
    write_manifest(folder, cfg.model_dump(mode="json"), ["chunk", "sentence", "question", "quote"])
    assert find_reusable(tmp_path / "indexes", folder, cfg) == folder
    write_manifest(folder, cfg.model_dump(mode="json"), ["chunk", "sentence", "quote"])
    assert find_reusable(tmp_path / "indexes", folder, cfg) is None
    # what is not an index is not reused (and not an error)
    (folder / "manifest.json").write_text("{not json")
    assert find_reusable(tmp_path / "indexes", folder, cfg) is None


def test_an_index_built_before_a_config_section_existed_is_reused_unless_the_section_matters(tmp_path):
    """Manifests record the whole config; one written before `bm25` existed lacks it. The default
    (no BM25) must still match it, and a variant that asks for BM25 must not."""
    from qrag_ray.config.index import index_config
    from qrag_ray.evaluation.driver import find_reusable

    cfg = index_config({"representation": "atom-sentence"})
    folder = tmp_path / "indexes" / "atom-sentence"
    old = cfg.model_dump(mode="json")
    del old["bm25"]
    write_manifest(folder, old, ["sentence"])
    assert find_reusable(tmp_path / "indexes", folder, cfg) == folder
    assert find_reusable(tmp_path / "indexes", folder,
                         index_config({"representation": "atom-sentence", "bm25": {"enabled": True}})) is None
    # a recorded config this release rejects is not reusable (and not an error)
    write_manifest(folder, old | {"retired_field": 1}, ["sentence"])
    assert find_reusable(tmp_path / "indexes", folder, cfg) is None
