"""The multi-dataset suite: loading and validating the YAML, the table with its mean, the default's
rule, the check against recorded figures and the files written (runner injected; the real runs are
`qrag suite --slice ci` in `make test`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qrag_ray.errors import QragError
from qrag_ray.evaluation.results import SuiteCell, VariantResult
from qrag_ray.evaluation.suite import compare_expected, format_table, load_suite, run_suite, with_mean


def cell(ndcg: float, **cost) -> SuiteCell:
    return SuiteCell(metrics={"nDCG@10": ndcg}, **cost)

SUITE = """
metric: nDCG@10
base: {bm25: {enabled: true}}
datasets:
  a: {kind: squad, data: a.json}
  b: {kind: beir, data: bdir}
configs:
  chunk: {representation: chunk}
  bm25: {representation: chunk, search: {bm25_alpha: 0.0}}
  mix: {representation: chunk, search: {bm25_alpha: 0.5, bm25_norm: zscore}}
slices:
  ci: {configs: [chunk, mix], datasets: {b: {subset: 10}}}
expected:
  ci: {b: {chunk: 50.0, mix: 60.0}}
"""


def _write(tmp_path: Path, text: str = SUITE) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


def test_load_resolves_paths_and_slices(tmp_path):
    suite = load_suite(_write(tmp_path))
    assert [d.name for d in suite.datasets] == ["a", "b"] and suite.datasets[1].data == str(tmp_path / "bdir")
    assert list(suite.configs) == ["chunk", "bm25", "mix"]
    assert suite.datasets[1].sliced(suite.slices["ci"]).subset == 10
    assert suite.datasets[0].sliced(suite.slices["ci"]) is None


@pytest.mark.parametrize("edit, msg", [
    (("bm25_norm: zscore", "bm25_norm: median"), "config 'mix'"),
    (("kind: beir", "kind: trec"), "dataset 'b' needs kind"),
    (("configs: [chunk, mix]", "configs: [chunk, nope]"), "unknown dataset(s) or config(s): nope"),
    (("b: {chunk: 50.0", "c: {chunk: 50.0"), "expected.ci.c"),
])
def test_bad_suites_are_one_line_errors(tmp_path, edit, msg):
    with pytest.raises(QragError, match=None) as raised:
        load_suite(_write(tmp_path, SUITE.replace(*edit)))
    assert msg in str(raised.value) and "\n" not in str(raised.value)


def test_mean_only_over_configs_measured_everywhere():
    table = with_mean({"x": {"a": 10.0, "b": 20.0}, "y": {"a": 30.0}}, ["a", "b"])
    assert table["x"]["mean"] == 15.0 and "mean" not in table["y"]


def test_compare_expected_flags_drops_missing_and_gains():
    res = compare_expected({"chunk": {"b": 48.5}, "mix": {"b": 62.0}},
                           {"b": {"chunk": 50.0, "mix": 60.0, "bm25": 40.0}}, "nDCG@10", tolerance=1.0)
    assert [(r.subject, r.measured) for r in res.regressions] == [("b / chunk", 48.5), ("b / bm25", None)]
    assert "not measured" in str(res.regressions[1]) and [i.subject for i in res.improvements] == ["b / mix"]


def test_run_suite_writes_table_json_and_plot(tmp_path):
    loaded = load_suite(_write(tmp_path))
    seen = []

    def runner(dataset, suite, cfgs, out, console):
        seen.append((dataset.name, dataset.subset, tuple(cfgs)))
        return {"chunk": cell(0.495), "mix": cell(0.61)}

    rep = run_suite(loaded, tmp_path / "out", "ci", runner=runner)
    assert seen == [("b", 10, ("chunk", "mix"))]
    assert rep.table["chunk"] == {"b": pytest.approx(49.5), "mean": pytest.approx(49.5)}
    assert rep.regressions == [] and rep.better == []
    data = json.loads(Path(rep.paths["json"]).read_text())
    assert data["datasets"] == ["b"] and Path(rep.paths["png"]).stat().st_size > 1000
    assert data["metrics"] == {"b": {"chunk": {"nDCG@10": 0.495}, "mix": {"nDCG@10": 0.61}}}
    assert "| mix | **61.0** | **61.0** |" in format_table(rep.table, ["b"], "nDCG@10")
    rep = run_suite(loaded, tmp_path / "out2", "ci", runner=lambda *a: {"chunk": cell(0.40)})
    assert len(rep.regressions) == 2  # chunk fell 10 points; mix was not measured
    with pytest.raises(QragError, match="unknown suite slice 'nightly'"):
        run_suite(loaded, tmp_path / "out3", "nightly", runner=runner)


MATRIX = """
- {id: small-ci, dataset: squad, data: a.json, subset: 5, representation: chunk, expected: {"R@1": 50.0}, tags: [ci]}
- {id: big, dataset: squad, data: a.json, representation: chunk, expected: {"R@1": 60.0}, tags: [full]}
"""


def test_a_slice_runs_the_matrix_conditions_it_names_in_the_same_run(tmp_path):
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    loaded = load_suite(_write(tmp_path, SUITE.replace("datasets: {b: {subset: 10}}}",
                                                       "datasets: {b: {subset: 10}}, matrix: {tags: [ci]}}")))
    assert loaded.slices["ci"]["matrix"] == {"file": str(tmp_path / "matrix.yaml"), "tags": ["ci"]}
    ran = []

    def matrix_runner(cond):
        ran.append(cond.id)
        return {"R@1": 0.40}  # 10 points under the recorded 50

    def runner(dataset, suite, cfgs, out, console):
        return {"chunk": cell(0.50), "mix": cell(0.60)}

    rep = run_suite(loaded, tmp_path / "out", "ci", runner=runner, matrix_runner=matrix_runner)
    assert ran == ["small-ci"] and rep.matrix.measured == {"small-ci": {"R@1": 0.40}}
    assert rep.regressions == ["matrix small-ci: R@1 40.00 vs recorded 50.0 (-10.00 points, tolerance 1)"]
    assert "FAIL: 1 regression(s)" in rep.matrix.summary
    assert json.loads((tmp_path / "out" / "suite.json").read_text())["matrix"]["tags"] == ["ci"]
    # a partial run of the slice (some configs) leaves the matrix out
    rep = run_suite(loaded, tmp_path / "out2", "ci", configs=["chunk"], runner=runner, matrix_runner=matrix_runner)
    assert ran == ["small-ci"] and rep.matrix is None and "matrix" not in rep.to_json()


@pytest.mark.parametrize("matrix, msg", [
    ("{tags: ci}", "'matrix' needs a list of condition tags"),
    ("{tags: [nightly]}", "carries the tag(s) nightly"),
])
def test_a_slices_matrix_is_checked_when_the_suite_loads(tmp_path, matrix, msg):
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    with pytest.raises(QragError) as raised:
        load_suite(_write(tmp_path, SUITE.replace("datasets: {b: {subset: 10}}}",
                                                  f"datasets: {{b: {{subset: 10}}}}, matrix: {matrix}}}")))
    assert msg in str(raised.value) and "\n" not in str(raised.value)


def test_the_table_reports_what_each_index_costs(tmp_path):
    built = SuiteCell.from_result(VariantResult(metrics={"nDCG@10": 0.5}, vectors=30, chunks=10,
                                       stage_seconds={"embed": 9.0, "total": 12.5}))
    assert (built.vectors_per_chunk, built.build_seconds) == (3.0, 12.5)
    empty = SuiteCell.from_result(VariantResult(metrics={}, vectors=0, chunks=0))
    assert (empty.vectors_per_chunk, empty.build_seconds) == (None, None)
    suite = load_suite(_write(tmp_path))
    rep = run_suite(suite, tmp_path / "out", "ci", runner=lambda *a: {
        "chunk": cell(0.5, vectors_per_chunk=1.0, build_seconds=10.0),
        "mix": cell(0.6, vectors_per_chunk=7.5, build_seconds=41.0)})
    assert rep.cost == {"chunk": {"vectors/chunk": 1.0, "build s": 10.0},
                        "mix": {"vectors/chunk": 7.5, "build s": 41.0}}
    assert "| nDCG@10 | b | mean | vectors/chunk | build s |" in rep.markdown
    assert "| mix | **60.0** | **60.0** | 7.5 | 41 |" in rep.markdown
    # a resumed run reads the costs back from suite.json
    rep = run_suite(suite, tmp_path / "out", "ci", runner=lambda *a: {}, resume=True)
    assert rep.cost["mix"] == {"vectors/chunk": 7.5, "build s": 41.0}


def test_title_options_drop_out_on_an_untitled_corpus():
    from qrag_ray.evaluation.suite import without_titles

    assert without_titles({"representation": "chunk", "title_prefix": True}) == {"representation": "chunk",
                                                                                 "title_prefix": False}
    assert without_titles({"representation": "chunk+title", "search": {"fusion": "sum"}}) == {
        "representation": "chunk", "search": {"fusion": "sum"}}
    assert without_titles({"representation": "atom-sentence"}) == {"representation": "atom-sentence"}


def test_an_index_is_reused_by_what_it_holds_not_by_the_preset_name():
    from qrag_ray.config.index import index_identity

    with_titles = {"representation": "atom-sentence", "bm25": {"enabled": True}, "search": {"bm25_alpha": 0.5}}
    untitled = {"representation": "sentence", "bm25": {"enabled": True}}
    assert index_identity(with_titles) == index_identity(untitled)
    assert index_identity(with_titles) != index_identity({**untitled, "representation": "chunk"})


def test_resume_keeps_unchanged_figures_and_skip_leaves_pairs_out(tmp_path):
    text = SUITE.replace("datasets: {b: {subset: 10}}}", "datasets: {a: {}, b: {subset: 10}}, skip: {a: [mix]}}")
    loaded = load_suite(_write(tmp_path, text))
    calls = []

    def runner(dataset, suite, cfgs, out, console):
        calls.append((dataset.name, tuple(cfgs)))
        return {c: cell(0.5) for c in cfgs}

    rep = run_suite(loaded, tmp_path / "o", "ci", runner=runner)
    assert calls == [("a", ("chunk",)), ("b", ("chunk", "mix"))] and "mix" not in rep.metrics["a"]
    assert "mean" not in rep.table["mix"]  # not measured on every dataset
    calls.clear()
    loaded.configs["mix"] = {**loaded.configs["mix"], "search": {"bm25_alpha": 0.7}}  # a changed definition runs again
    run_suite(loaded, tmp_path / "o", "ci", runner=runner, resume=True)
    assert calls == [("b", ("mix",))]


def test_resume_with_other_configs_writes_the_whole_table(tmp_path):
    """Measured in pieces (`--configs A`, then `--resume --configs B`): suite.json and suite.md hold
    A's figures as well as B's, and A is not measured again."""
    loaded = load_suite(_write(tmp_path))
    calls = []

    def runner(dataset, suite, cfgs, out, console):
        calls.append((dataset.name, tuple(cfgs)))
        return {c: cell(0.5 if c == "chunk" else 0.6) for c in cfgs}

    run_suite(loaded, tmp_path / "o", "ci", configs=["chunk"], runner=runner)
    rep = run_suite(loaded, tmp_path / "o", "ci", configs=["mix"], runner=runner, resume=True)
    assert calls == [("b", ("chunk",)), ("b", ("mix",))]
    assert rep.table["chunk"]["b"] == 50.0 and rep.table["mix"]["b"] == 60.0
    on_disk = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert set(on_disk["table"]) == {"chunk", "mix"}
    assert "| chunk |" in (tmp_path / "o" / "suite.md").read_text()
    # without --resume the output is this run's configurations only
    rep = run_suite(loaded, tmp_path / "o", "ci", configs=["mix"], runner=runner)
    assert set(rep.table) == {"mix"}


def test_resume_with_other_datasets_keeps_the_datasets_left_out(tmp_path):
    """Measured in pieces by dataset (`--datasets a`, then `--resume --datasets b`): the second run keeps
    a's figures in the table and its mean, and does not measure a again."""
    text = SUITE.replace("datasets: {b: {subset: 10}}}", "datasets: {a: {}, b: {subset: 10}}}")
    loaded = load_suite(_write(tmp_path, text))
    calls = []

    def runner(dataset, suite, cfgs, out, console):
        calls.append((dataset.name, tuple(cfgs)))
        return {c: cell(0.4 if dataset.name == "a" else 0.6) for c in cfgs}

    run_suite(loaded, tmp_path / "o", "ci", datasets=["a"], runner=runner)
    rep = run_suite(loaded, tmp_path / "o", "ci", datasets=["b"], runner=runner, resume=True)
    assert calls == [("a", ("chunk", "mix")), ("b", ("chunk", "mix"))]
    assert rep.datasets == ["a", "b"] and rep.table["chunk"] == {"a": 40.0, "b": 60.0, "mean": 50.0}
    # without --resume a run of one dataset reports that dataset only
    rep = run_suite(loaded, tmp_path / "o", "ci", datasets=["b"], runner=runner)
    assert rep.datasets == ["b"]


def test_resume_reads_the_eval_reports_an_earlier_release_wrote(tmp_path):
    """A dataset folder's results.json as `qrag eval` has written it since its first release (the summary
    fields beside the figures): a resumed suite takes its figures and costs instead of measuring again."""
    loaded = load_suite(_write(tmp_path))
    (tmp_path / "o" / "b").mkdir(parents=True)
    (tmp_path / "o" / "b" / "results.json").write_text(json.dumps({
        "meta": {"dataset": "beir", "data": "bdir", "subset": 10, "documents": 5, "queries": 3, "judgments": 3,
                 "ks": [1, 10]},
        "representations": {"chunk": {
            "metrics": {"R@1": 0.5, "nDCG@10": 0.52}, "vectors": 5, "chunks": 5, "questions": 0,
            "vectors_before_filters": 5, "index_bytes": 1000, "stage_seconds": {"embed": 1.5, "total": 2.0},
            "query_ms": 1.0, "generation": {}, "leaked_queries": 0, "leaked_examples": [], "index_reused": False,
            "index_dir": "o/b/indexes/chunk", "config": {}, "vectors_per_chunk": 1.0, "build_seconds": 2.0,
            "index_mb": 0.001}}}))
    calls = []

    def runner(dataset, suite, cfgs, out, console):
        calls.append(tuple(cfgs))
        return {c: cell(0.6) for c in cfgs}

    rep = run_suite(loaded, tmp_path / "o", "ci", runner=runner, resume=True)
    assert calls == [("mix",)]
    assert rep.table["chunk"]["b"] == pytest.approx(52.0)
    assert rep.cost["chunk"] == {"vectors/chunk": 1.0, "build s": 2.0}
