"""The multi-dataset suite: every configuration on every dataset, one table, one mean, held against the
figures recorded in the YAML (keys: docs/EVALUATION.md), so a default is chosen across query styles.
Configurations that build the same vectors share one index per dataset (`qrag eval` reuses an index of
the same qrag_ray.config.index.index_identity), so a search policy costs no build. A slice may also name
regression matrix conditions by tag (`matrix: {tags: [ci]}`, from the matrix YAML beside the suite's unless
`file` says another), run in the same process after its datasets and held against the matrix's figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from qrag_ray.config.index import REPRESENTATIONS, deep_update, index_config, load_yaml
from qrag_ray.errors import QragError
from qrag_ray.evaluation.driver import Variant, evaluate_condition, run_eval
from qrag_ray.evaluation.loaders import EVAL_KINDS, load_eval_set
from qrag_ray.evaluation.matrix import Condition, load_matrix, resolve_data_path, run_matrix, select
from qrag_ray.evaluation.regression import Comparison, Figure, compare_figures
from qrag_ray.evaluation.results import EvalReport, SuiteCell, SuiteMatrix, SuiteReport, read_partial, read_suite_json

FULL = "full"


@dataclass
class SuiteDataset:
    name: str
    kind: str
    data: str
    subset: int | None = None
    offset: int = 0
    split: str = "test"

    def sliced(self, slice_spec: dict[str, Any] | None) -> "SuiteDataset | None":
        """This dataset as a slice reads it (None: the full dataset); None when the slice leaves it out."""
        if slice_spec is None or self.name not in (slice_spec.get("datasets") or {}):
            return self if slice_spec is None else None
        override = slice_spec["datasets"][self.name] or {}
        return SuiteDataset(self.name, self.kind, self.data, override.get("subset"), int(override.get("offset", 0)),
                            self.split)


@dataclass
class Suite:
    metric: str
    tolerance: float
    base: dict[str, Any]
    datasets: list[SuiteDataset]
    configs: dict[str, dict[str, Any]]
    slices: dict[str, dict[str, Any]]
    expected: dict[str, dict[str, dict[str, float]]]  # slice -> dataset -> config -> percent


def load_suite(path: str | Path) -> Suite:
    """Parse and validate a suite YAML (every configuration checked as an IndexConfig up front)."""
    file = Path(path)
    raw = load_yaml(file)
    where = str(file)
    base = raw.get("base") or {}
    if not isinstance(base, dict):
        raise QragError(f"{where}: 'base' must be a mapping of index config overrides")
    dsets = []
    for name, dataset_spec in (raw.get("datasets") or {}).items():
        if (not isinstance(dataset_spec, dict) or dataset_spec.get("kind") not in EVAL_KINDS
                or not isinstance(dataset_spec.get("data"), str)):
            raise QragError(f"{where}: dataset {name!r} needs kind ({', '.join(EVAL_KINDS)}) and data")
        dsets.append(SuiteDataset(str(name), dataset_spec["kind"], resolve_data_path(dataset_spec["data"], file.parent),
                                  dataset_spec.get("subset"), int(dataset_spec.get("offset", 0)),
                                  str(dataset_spec.get("split", "test"))))
    configs = raw.get("configs") or {}
    if not dsets or not isinstance(configs, dict) or not configs:
        raise QragError(f"{where}: needs at least one dataset and one config")
    for name, config in configs.items():
        if not isinstance(config, dict) or not config.get("representation"):
            raise QragError(f"{where}: config {name!r} needs a representation")
        index_config(deep_update(base, config), f"{where}: config {name!r}: ")
    slices = raw.get("slices") or {}
    for slice_name, spec in slices.items():
        if slice_name == FULL or not isinstance(spec, dict) or not isinstance(spec.get("datasets"), dict):
            raise QragError(f"{where}: slice {slice_name!r} needs a 'datasets' mapping "
                            f"(and may not be named {FULL!r})")
        bad = [x for x in spec["datasets"] if x not in {d.name for d in dsets}]
        bad += [x for x in spec.get("configs") or [] if x not in configs]
        for dataset_name, skipped_configs in (spec.get("skip") or {}).items():
            bad += [x for x in [dataset_name] if x not in spec["datasets"]]
            bad += [x for x in skipped_configs or [] if x not in configs]
        if bad:
            raise QragError(f"{where}: slice {slice_name!r} names unknown dataset(s) or config(s): "
                            f"{', '.join(map(str, bad))}")
        if "matrix" in spec:
            spec["matrix"] = _slice_matrix(spec["matrix"], file.parent, f"{where}: slice {slice_name!r}")
    expected = raw.get("expected") or {}
    for slice_name, table in expected.items():
        for dataset_name, row in (table or {}).items():
            if (unknown := set(row or {}) - set(configs)) or dataset_name not in {d.name for d in dsets}:
                raise QragError(f"{where}: expected.{slice_name}.{dataset_name} names an unknown dataset or config "
                                f"{sorted(unknown)}")
    return Suite(raw.get("metric", "nDCG@10"), float(raw.get("tolerance", 1.0)), base, dsets,
                 {str(k): dict(v) for k, v in configs.items()}, {str(k): dict(v) for k, v in slices.items()},
                 {str(s): {str(d): dict(r or {}) for d, r in (t or {}).items()} for s, t in expected.items()})


def _slice_matrix(spec: Any, here: Path, where: str) -> dict[str, Any]:
    """A slice's `matrix: {tags: [...], file: ...}`: the file resolved beside the suite, its conditions
    checked now (a typo fails before any build)."""
    tags = spec.get("tags") if isinstance(spec, dict) else None
    if not isinstance(tags, list) or not tags or not all(isinstance(t, str) for t in tags):
        raise QragError(f"{where}: 'matrix' needs a list of condition tags (matrix: {{tags: [ci]}})")
    path = here / str(spec.get("file") or "matrix.yaml")
    if not select(load_matrix(path), tags=tags):
        raise QragError(f"{where}: no condition of {path} carries the tag(s) {', '.join(tags)}")
    return {"file": str(path), "tags": tags}


def with_mean(table: Mapping[str, Mapping[str, float]], datasets: list[str]) -> dict[str, dict[str, float]]:
    """{config: {dataset: value}} plus a "mean" over `datasets` (only for configs measured on all)."""
    out = {cfg: dict(row) for cfg, row in table.items()}
    for measured in out.values():
        vals = [measured[d] for d in datasets if measured.get(d) is not None]
        if datasets and len(vals) == len(datasets):
            measured["mean"] = sum(vals) / len(vals)
    return out


def format_table(table: Mapping[str, Mapping[str, float]], datasets: list[str], metric: str,
                 mark: str | None = None, cost: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """Markdown: one row per configuration, one column per dataset and the mean, then what its index costs
    (`cost`: vectors per chunk, build seconds); the best figure of each column in bold, `mark` (the
    default) with a star."""
    cols = datasets + ["mean"]
    extra = ["vectors/chunk", "build s"] if cost else []
    best = {c: max((r.get(c) for r in table.values() if r.get(c) is not None), default=None) for c in cols}
    lines = [f"| {metric} | " + " | ".join(cols + extra) + " |", "|---|" + "---:|" * len(cols + extra)]
    for cfg, row in table.items():
        spent = (cost or {}).get(cfg, {})
        cells = ["–" if (v := row.get(c)) is None else f"**{v:.1f}**" if abs(v - best[c]) < 0.05 else f"{v:.1f}"
                 for c in cols]
        cells += ["–" if (v := spent.get(c)) is None else f"{v:.0f}" if c == "build s" else f"{v:.1f}" for c in extra]
        lines.append(f"| {cfg}{' ★' if cfg == mark else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare_expected(table: Mapping[str, Mapping[str, float]], expected: Mapping[str, Mapping[str, float]],
                     metric: str, tolerance: float) -> Comparison:
    """The table (config -> dataset -> percent) against the recorded figures (dataset -> config ->
    percent) through the one regression check (qrag_ray.evaluation.regression)."""
    return compare_figures(Figure(f"{ds} / {cfg}", metric, exp, table.get(cfg, {}).get(ds), tolerance)
                           for ds, row in expected.items() for cfg, exp in row.items())


def plot(table: Mapping[str, Mapping[str, float]], datasets: list[str], metric: str, path: Path) -> Path | None:
    """Grouped horizontal bars, one group per configuration (datasets and the mean), Agg canvas only."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    cols = datasets + ["mean"]
    cfgs = list(table)
    fig = Figure(figsize=(9, 0.45 * len(cfgs) * max(1, len(cols)) / 2 + 1.5))
    FigureCanvasAgg(fig)
    axes = fig.add_subplot(111)
    bar_height = 0.8 / len(cols)
    for j, column in enumerate(cols):
        axes.barh([i + j * bar_height for i in range(len(cfgs))], [table[cfg].get(column) or 0.0 for cfg in cfgs],
                  height=bar_height, label=column, color="black" if column == "mean" else None)
    axes.set_yticks([i + 0.4 - bar_height / 2 for i in range(len(cfgs))], cfgs, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel(metric)
    axes.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def without_titles(cfg: dict[str, Any]) -> dict[str, Any]:
    """A configuration on a corpus with no titles: the title prefix and the `title` kind add nothing there,
    so they are dropped and it shares the index of its untitled twin instead of embedding the same texts."""
    out = dict(cfg)
    if out.get("title_prefix") or REPRESENTATIONS.get(out["representation"], {}).get("title_prefix"):
        out["title_prefix"] = False
    kinds = out["representation"].split("+")
    if "title" in kinds and len(kinds) > 1:
        out["representation"] = "+".join(k for k in kinds if k != "title")
    return out


def _evaluate_dataset(dataset: SuiteDataset, suite: Suite, configs: list[str], out: Path,
                      console=None) -> dict[str, SuiteCell]:
    eval_set = load_eval_set(dataset.kind, dataset.data, dataset.subset, dataset.split, dataset.offset)
    titled = any(d["title"] for d in eval_set.corpus)
    variants = [Variant(c, dict(suite.configs[c]) if titled else without_titles(suite.configs[c])) for c in configs]
    res = run_eval(dataset.kind, dataset.data, variants, out / dataset.name, subset=dataset.subset, ks=[1, 10],
                   base_overrides=suite.base, console=console, split=dataset.split, offset=dataset.offset)
    return {c: SuiteCell.from_result(r) for c, r in res.results.items()}


def _costs(raw: Mapping[str, Mapping[str, SuiteCell]], config: str) -> dict[str, float]:
    """A configuration's vectors per chunk (the mean over the datasets) and build seconds (their sum)."""
    runs = [ds[config] for ds in raw.values() if config in ds]
    vpc = [r.vectors_per_chunk for r in runs if r.vectors_per_chunk is not None]
    secs = [r.build_seconds for r in runs if r.build_seconds is not None]
    return ({"vectors/chunk": sum(vpc) / len(vpc)} if vpc else {}) | ({"build s": sum(secs)} if secs else {})


def _previous(out: Path, slice_name: str, suite: Suite) -> dict[str, dict[str, SuiteCell]]:
    """{dataset: {config: cell}} measured earlier in `out` for this slice: each dataset folder's `qrag
    eval` reports (results.json of the same slice, partial.json of an interrupted run; taken by name), then
    suite.json, whose stored definitions must equal the current ones (a changed one is measured again)."""
    slice_spec = suite.slices.get(slice_name)
    prev: dict[str, dict[str, SuiteCell]] = {}
    for dataset in filter(None, (d.sliced(slice_spec) for d in suite.datasets)):
        rep = EvalReport.read(out / dataset.name / "results.json")
        row = {}
        if rep is not None and rep.meta.subset == dataset.subset and rep.meta.offset == dataset.offset:
            row |= {c: SuiteCell.from_result(r) for c, r in rep.representations.items()}
        row |= {c: SuiteCell.from_result(r) for c, r in read_partial(out / dataset.name / "partial.json").items()}
        prev[dataset.name] = row
    old = read_suite_json(out / "suite.json")
    if old.get("slice") == slice_name:
        stored = old.get("configs") or {}
        now = suite.configs
        for dataset_name, row in (old.get("metrics") or {}).items():
            prev.setdefault(dataset_name, {}).update({c: SuiteCell.from_json(m) for c, m in row.items()
                                                      if stored.get(c, now.get(c)) == now.get(c)})
    return {name: {c: m for c, m in row.items() if c in suite.configs} for name, row in prev.items()}


def run_suite(suite: Suite, out: str | Path, slice_name: str = FULL, datasets: list[str] | None = None,
              configs: list[str] | None = None, console=None,
              runner: Callable[..., Mapping[str, SuiteCell]] | None = None, resume: bool = False,
              matrix_runner: Callable[[Condition], Mapping] | None = None) -> SuiteReport:
    """Run the selected configurations on the selected datasets (as `slice_name` reads them), write
    suite.json, suite.md and suite.png under `out`, and compare with the slice's recorded figures; then
    the matrix conditions the slice names (the whole slice only: not with `datasets` or `configs`), their
    `qrag eval` output under out/matrix, their regressions counted with the suite's.
    `runner(dataset, suite, configs, out, console) -> {config: SuiteCell}` and `matrix_runner(condition) ->
    metrics` are injectable. `resume` keeps the figures an earlier run of the slice wrote to `out` for
    unchanged configurations, measuring the rest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    unknown = [d for d in datasets or [] if d not in {x.name for x in suite.datasets}]
    unknown += [c for c in configs or [] if c not in suite.configs]
    if unknown:
        raise QragError(f"unknown suite dataset(s) or config(s): {', '.join(unknown)}")
    if slice_name != FULL and slice_name not in suite.slices:
        raise QragError(f"unknown suite slice {slice_name!r} (known: {', '.join([FULL, *suite.slices])})")
    slice_spec = suite.slices.get(slice_name)
    cfgs = configs or list((slice_spec or {}).get("configs") or suite.configs)
    prev = _previous(out, slice_name, suite) if resume else {}
    skip = (slice_spec or {}).get("skip") or {}
    # a resumed run that measures a few configurations still shows the figures it kept for the others,
    # so a table assembled over several runs is whole in suite.json, suite.md and the plot
    others = {c for row in prev.values() for c in row} - set(cfgs)
    shown = [c for c in suite.configs if c in cfgs or c in others] if others else cfgs
    table: dict[str, dict[str, float]] = {c: {} for c in shown}
    raw: dict[str, dict[str, SuiteCell]] = {}
    done: list[str] = []
    for dataset in filter(None, (d.sliced(slice_spec) for d in suite.datasets)):
        # a dataset left out of this run keeps the figures an earlier run of the slice wrote (resume)
        selected = not datasets or dataset.name in datasets
        if not selected and not prev.get(dataset.name):
            continue
        if console and selected:
            console.rule(f"suite: {dataset.name} ({slice_name})")
        kept = {c: m for c, m in prev.get(dataset.name, {}).items() if c in shown}
        todo = [c for c in cfgs if c not in kept and c not in (skip.get(dataset.name) or [])] if selected else []
        cells = kept | ((runner or _evaluate_dataset)(dataset, suite, todo, out, console) if todo else {})
        raw[dataset.name] = cells = {c: cells[c] for c in shown if c in cells}
        for config in shown:
            if config in cells and (value := cells[config].metrics.get(suite.metric)) is not None:
                table[config][dataset.name] = 100.0 * value
        done.append(dataset.name)
    if not done:
        raise QragError(f"no suite dataset has slice {slice_name!r}")
    table = with_mean(table, done)
    checked = compare_expected(table, suite.expected.get(slice_name, {}), suite.metric, suite.tolerance)
    spent = {c: _costs(raw, c) for c in shown}
    report = SuiteReport(slice_name, suite.metric, done, table, raw, spent, {c: suite.configs[c] for c in shown},
                         skip, [str(r) for r in checked.regressions], [str(b) for b in checked.improvements])
    if (matrix := (slice_spec or {}).get("matrix")) and not datasets and not configs:
        if console:
            console.rule(f"suite: matrix conditions tagged {', '.join(matrix['tags'])}")
        condition_runner = matrix_runner or partial(evaluate_condition, root=out / "matrix")
        res = run_matrix(matrix["file"], tags=matrix["tags"], runner=condition_runner)
        report.matrix = SuiteMatrix(matrix["file"], matrix["tags"], res.measured, res.comparison.summary())
        report.regressions += [f"matrix {r}" for r in res.comparison.regressions]
    (out / "suite.json").write_text(json.dumps(report.to_json(), indent=2))
    report.markdown = format_table(table, done, suite.metric, mark="default" if "default" in table else None,
                                   cost=spent)
    (out / "suite.md").write_text(report.markdown + "\n")
    png = plot(table, done, suite.metric, out / "suite.png")
    report.paths = {"json": str(out / "suite.json"), "md": str(out / "suite.md"), **({"png": str(png)} if png else {})}
    return report


def recorded_yaml(table: Mapping[str, Mapping[str, float]], datasets: list[str], slice_name: str) -> str:
    """The measured table as an `expected:` block to paste into the suite YAML."""
    lines = [f"  {slice_name}:"]
    for dataset in datasets:
        cells = ", ".join(f"{c}: {row[dataset]:.1f}" for c, row in table.items() if row.get(dataset) is not None)
        lines.append(f"    {dataset}: {{{cells}}}")
    return "\n".join(lines)
