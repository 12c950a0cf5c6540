"""Regression matrix (load / check / run with an injected runner) and the side-by-side report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qrag_ray.errors import QragError
from qrag_ray.evaluation.matrix import Condition, check, compare, load_matrix, run_matrix, select
from qrag_ray.evaluation.report import write_report
from qrag_ray.evaluation.results import EvalMeta, EvalReport, VariantResult

REPO = Path(__file__).resolve().parents[2]

MATRIX = """
- id: chunk
  dataset: squad
  data: squad.json
  subset: 10
  representation: chunk
  embedder: all-MiniLM-L6-v2
  generator: none
  extra: {chunker: {method: none}}
  expected: {"R@1": 62.5, "R@5": 86.4}
  tolerance: 1.0
- id: sentence-ci
  dataset: squad
  data: ${QRAG_TEST_DATA_DIR:-/data}/squad.json
  subset: 50
  offset: 300
  representation: atom-sentence
  expected: null
  tags: [ci]
- id: partial
  dataset: jsonl
  data: /abs/folder
  expected: {"R@1": 50.0, "R@10": null}
  tolerance: 0.5
  tags: [ci]
"""


@pytest.fixture()
def matrix_file(tmp_path: Path) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX)
    return path


def test_load_matrix(matrix_file, monkeypatch):
    monkeypatch.delenv("QRAG_TEST_DATA_DIR", raising=False)
    conds = load_matrix(matrix_file)
    assert [c.id for c in conds] == ["chunk", "sentence-ci", "partial"]
    condition = conds[0]
    assert condition.data == str(matrix_file.parent / "squad.json")  # relative to the matrix file
    assert condition.embedder == {"model": "all-MiniLM-L6-v2"} and condition.generator == {"backend": "none"}
    assert condition.index_overrides() == {"representation": "chunk", "embedder": {"model": "all-MiniLM-L6-v2"},
                                           "generator": {"backend": "none"}, "chunker": {"method": "none"}}
    assert conds[1].data == "/data/squad.json" and conds[1].record_only and conds[1].tolerance == 1.0
    assert conds[0].offset == 0 and conds[1].offset == 300  # a held-out slice
    assert not conds[2].record_only
    monkeypatch.setenv("QRAG_TEST_DATA_DIR", "/elsewhere")
    assert load_matrix(matrix_file)[1].data == "/elsewhere/squad.json"
    assert [c.id for c in select(conds, tags=["ci"])] == ["sentence-ci", "partial"]
    assert [c.id for c in select(conds, ids=["partial", "chunk"])] == ["partial", "chunk"]
    with pytest.raises(QragError, match="unknown matrix condition"):
        select(conds, ids=["nope"])


def test_planted_drop_fails(matrix_file):
    conds = load_matrix(matrix_file)[:1]
    regs = check(conds, {"chunk": {"R@1": 0.605, "R@5": 0.864}})  # R@1 two points below 62.5
    assert len(regs) == 1
    regression = regs[0]
    assert (regression.subject, regression.metric, regression.expected) == ("chunk", "R@1", 62.5)
    assert regression.measured == pytest.approx(60.5) and regression.delta == pytest.approx(-2.0)
    assert "R@1" in str(regression)


def test_within_tolerance_passes(matrix_file):
    conds = load_matrix(matrix_file)[:1]
    assert check(conds, {"chunk": {"R@1": 0.616, "R@5": 0.873}}) == []  # -0.9 and +0.9 points
    assert check(conds, {"chunk": {"R@1": 61.6, "R@5": 87.3}}, measured_scale="percent") == []
    assert check(conds, {"chunk": {"R@1": 0.615, "R@5": 0.854}}) == []  # exactly at the edge


def test_better_than_recorded_and_missing_metric(matrix_file):
    conds = load_matrix(matrix_file)[:1]
    res = compare(conds, {"chunk": {"R@1": 0.70, "R@5": 0.864}})
    assert res.passed and [i.metric for i in res.improvements] == ["R@1"]
    assert "better than recorded" in res.summary()
    # a recorded metric the runner did not report must not pass silently
    regs = check(conds, {"chunk": {"R@1": 0.625}})
    assert [(r.metric, r.measured) for r in regs] == [("R@5", None)]


def test_null_expected_is_record_only(matrix_file):
    conds = load_matrix(matrix_file)
    res = compare(conds, {"sentence-ci": {"R@1": 0.01, "R@5": 0.02},
                          "partial": {"R@1": 0.50, "R@10": 0.10}})
    assert res.passed
    assert res.record_only["sentence-ci"] == pytest.approx({"R@1": 1.0, "R@5": 2.0})
    assert res.record_only["partial"] == pytest.approx({"R@10": 10.0})
    assert res.not_run == ["chunk"]
    assert "RECORDED" in res.summary() and "PASS" in res.summary()


def test_run_matrix_with_injected_runner(matrix_file):
    seen: list[str] = []

    def runner(cond: Condition) -> dict[str, float]:
        seen.append(cond.id)
        # planted drop: 2 points below the recorded R@1
        return {"R@1": 0.605, "R@5": 0.864} if cond.id == "chunk" else {"R@1": 0.5}

    res = run_matrix(matrix_file, runner=runner)
    assert seen == ["chunk", "sentence-ci", "partial"]
    assert not res.passed
    assert [(r.subject, r.metric) for r in res.comparison.regressions] == [("chunk", "R@1")]

    res = run_matrix(matrix_file, ids=["partial"], runner=runner)
    assert res.passed and list(res.measured) == ["partial"]
    res = run_matrix(matrix_file, tags=["ci"], runner=runner)
    assert res.passed and list(res.measured) == ["sentence-ci", "partial"]
    with pytest.raises(TypeError, match="expected a mapping"):  # a runner returns the metrics, by name
        run_matrix(matrix_file, ids=["chunk"], runner=lambda c: [0.63, 0.86])


@pytest.mark.parametrize("body, msg", [
    ("- id: a\n  dataset: msmarco\n  data: x\n", "dataset must be one of"),
    ("- id: a\n  dataset: squad\n  data: x\n  representation: nope\n", "unknown representation"),
    ("- id: a\n  dataset: squad\n  data: x\n  representation: hype\n", "needs generated questions"),
    ("- id: a\n  dataset: squad\n  data: x\n  extra: {chunker: {methd: none}}\n", "chunker.methd"),
    ("- id: a\n  dataset: squad\n  data: x\n  expected: {R@1: high}\n", "must be a number"),
    ("- id: a\n  dataset: squad\n  data: x\n  colour: red\n", "unknown field"),
    ("- id: a\n  dataset: squad\n  data: x\n  offset: -3\n", "offset must be a non-negative integer"),
    ("- id: a\n  dataset: squad\n  data: x\n- id: a\n  dataset: squad\n  data: y\n", "duplicate condition id"),
    ("- id: a\n  dataset: squad\n  data: ${QRAG_SURELY_UNSET_VAR}/x\n", "not set"),
    ("[unclosed\n", "not valid YAML"),
    ("{}\n", "non-empty list"),
])
def test_bad_matrix(tmp_path, body, msg):
    path = tmp_path / "m.yaml"
    path.write_text(body)
    with pytest.raises(QragError, match=msg) as raised:
        load_matrix(path)
    assert "\n" not in str(raised.value)


def test_repo_matrix_is_valid():
    conds = {c.id: c for c in load_matrix(REPO / "eval" / "matrix.yaml")}
    assert conds["squad-dev-chunk-minilm"].expected == {"R@1": 62.5, "R@2": 75.0, "R@5": 86.4, "R@10": 91.7}
    assert conds["squad-dev-atom-sentence-minilm"].expected == {"R@1": 70.1, "R@2": 81.6, "R@5": 90.1, "R@10": 94.2}
    tagged_ci = [c for c in conds.values() if "ci" in c.tags]
    # CI slices are small subsets with measured figures to hold (a record-only CI row checks nothing)
    assert tagged_ci and all(c.subset and not c.record_only for c in tagged_ci)
    # a measurement matching the recorded figures passes; a planted 2-point drop fails
    good = {"squad-dev-chunk-minilm": {"R@1": 0.625, "R@2": 0.75, "R@5": 0.864, "R@10": 0.917}}
    assert check(list(conds.values()), good) == []
    bad = {"squad-dev-chunk-minilm": {**good["squad-dev-chunk-minilm"], "R@5": 0.844}}
    assert [r.metric for r in check(list(conds.values()), bad)] == ["R@5"]


# ------------------------------------------------------------------------------------------- report

def test_write_report(tmp_path):
    results = {
        "chunk": VariantResult(metrics={"R@1": 0.625, "R@2": 0.75, "R@5": 0.864, "R@10": 0.917, "R@20": 0.95,
                                        "T@1": 0.9, "MRR@10": 0.73, "nDCG@10": 0.77},
                               vectors=2067, chunks=2067, index_bytes=3_200_000,
                               stage_seconds={"read": 1.0, "embed": 20.5}),
        "atom-sentence": VariantResult(metrics={"R@1": 0.701, "R@2": 0.816, "R@5": 0.901, "R@10": 0.942},
                                       vectors=10000, chunks=2067, index_bytes=15_000_000,
                                       stage_seconds={"total": 60.0, "embed": 50.0}),
        "hype": VariantResult(metrics={"R@1": float("nan")}),  # missing fields render as dashes
    }
    meta = EvalMeta(dataset="squad", data="dev.json", documents=2067, queries=10570, judgments=10570, ks=[1, 5])
    paths = write_report(tmp_path / "report", EvalReport(meta=meta, representations=results))
    assert set(paths) == {"json", "md", "png"}
    for path in paths.values():
        assert path.is_file() and path.stat().st_size > 0
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = paths["md"].read_text()
    for rep in results:
        assert f"`{rep}`" in markdown
    # the best bolded; 10000/2067 vectors per chunk
    assert "| **70.1** |" in markdown and "| 62.5 |" in markdown and "4.84" in markdown
    assert "21.5" in markdown and "60.0" in markdown  # build seconds: sum of stages, or total
    assert markdown.startswith("# qrag eval: squad (2067 docs, 10570 queries)\n") and "- **queries**: 10570" in markdown
    doc = json.loads(paths["json"].read_text())
    assert doc["meta"] == {"dataset": "squad", "data": "dev.json", "subset": None, "documents": 2067,
                           "queries": 10570, "judgments": 10570, "ks": [1, 5]}  # offset 0 is not written
    assert EvalReport.model_validate(doc) == EvalReport(meta=meta, representations=results)
    assert doc["representations"]["chunk"]["metrics"]["R@1"] == 0.625
    assert doc["representations"]["chunk"]["index_mb"] == pytest.approx(3.2)
    assert doc["representations"]["hype"]["metrics"]["R@1"] is None
