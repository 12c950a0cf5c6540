"""Regression matrix (pyserini's "two-click reproduction"): `eval/matrix.yaml` lists conditions, one
dataset + one index configuration each with the figures it must reproduce (fields: docs/EVALUATION.md).
`run_matrix` measures them through an injected runner (`qrag matrix` passes the driver's
`evaluate_condition`); `compare` / `check` hold them against the recorded figures: `expected` and
`tolerance` in percent points, measured values fractions (`measured_scale="percent"` when they are not).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

from qrag_ray.config.index import deep_update, index_config
from qrag_ray.config.yaml_file import read_yaml
from qrag_ray.errors import QragError
from qrag_ray.evaluation.loaders import EVAL_KINDS, check_slice
from qrag_ray.evaluation.regression import Comparison, Figure, compare_figures, finite_number

DEFAULT_TOLERANCE = 1.0


@dataclass
class Condition:
    id: str
    dataset: str
    data: str
    subset: int | None = None
    offset: int = 0
    representation: str = "chunk"
    embedder: dict[str, Any] = field(default_factory=dict)
    generator: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, float | None] | None = None
    tolerance: float = DEFAULT_TOLERANCE
    tags: list[str] = field(default_factory=list)
    split: str = "test"
    notes: str = ""

    @property
    def record_only(self) -> bool:
        """True when no metric has a recorded figure (nothing can fail)."""
        return not self.expected or all(v is None for v in self.expected.values())

    def index_overrides(self) -> dict[str, Any]:
        """The index configuration for `qrag_ray.config.index.index_config` (the driver fills in input and output)."""
        cfg = {"representation": self.representation, "embedder": dict(self.embedder),
               "generator": dict(self.generator)}
        return deep_update({k: v for k, v in cfg.items() if v}, self.extra)


_FIELDS = {f.name for f in fields(Condition)}


@dataclass
class MatrixComparison(Comparison):
    """The regression check of the conditions run, the figures of record-only metrics, the conditions not run."""

    record_only: dict[str, dict[str, float]] = field(default_factory=dict)  # condition -> percent figures
    not_run: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = self.lines()
        for cid, figs in self.record_only.items():
            vals = ", ".join(f'"{m}": {v:.1f}' for m, v in figs.items())
            lines.append(f"RECORDED    {cid}: {{{vals}}}")
        if self.not_run:
            lines.append(f"NOT RUN     {', '.join(self.not_run)}")
        lines.append(f"{'FAIL' if self.regressions else 'PASS'}: {len(self.regressions)} regression(s), "
                     f"{len(self.improvements)} better than recorded, {len(self.within)} within tolerance")
        return "\n".join(lines)


@dataclass
class MatrixResult:
    measured: dict[str, dict[str, float]]
    comparison: MatrixComparison

    @property
    def passed(self) -> bool:
        return self.comparison.passed


def _number(value: Any, where: str) -> float:
    if (number := finite_number(value)) is None:
        raise QragError(f"{where} must be a number, got {value!r}")
    return number


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_data_path(data: str, base: Path | None = None) -> str:
    """Expand `${NAME}` / `${NAME:-default}` and `~`; a relative result is taken relative to `base`
    (the matrix file's folder)."""
    def _sub(match: re.Match) -> str:
        val = os.environ.get(match.group(1)) or match.group(2)
        if val is not None:
            return val
        raise QragError(f"data path {data!r} uses ${{{match.group(1)}}}, which is not set")

    resolved = Path(os.path.expanduser(_VAR.sub(_sub, data)))
    return str(resolved if resolved.is_absolute() or base is None else base / resolved)


def _parse_condition(raw: Any, idx: int, src: str, base: Path | None = None) -> Condition:
    if not isinstance(raw, dict):
        raise QragError(f"{src}: condition #{idx + 1} must be a mapping")
    cid = raw.get("id")
    if not isinstance(cid, str) or not cid.strip():
        raise QragError(f"{src}: condition #{idx + 1} needs a non-empty string 'id'")
    where = f"{src}: condition '{cid}'"
    if unknown := sorted(set(raw) - _FIELDS):
        raise QragError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_FIELDS))})")
    dataset = raw.get("dataset")
    if dataset not in EVAL_KINDS:
        raise QragError(f"{where}: dataset must be one of {', '.join(EVAL_KINDS)}, got {dataset!r}")
    if not isinstance(raw.get("data"), str) or not raw["data"]:
        raise QragError(f"{where}: 'data' must be a path")
    data = resolve_data_path(raw["data"], base)
    subset = raw.get("subset")
    offset = raw.get("offset", 0)
    check_slice(subset, offset, f"{where}: ", "null")

    def _component(name: str, key: str) -> dict[str, Any]:
        value = raw.get(name)
        if value is not None and not isinstance(value, (str, dict)):
            raise QragError(f"{where}: '{name}' must be a name or a mapping")
        return {key: value} if isinstance(value, str) else dict(value or {})

    embedder = _component("embedder", "model")
    generator = _component("generator", "backend")
    extra = raw.get("extra") or {}
    if not isinstance(extra, dict):
        raise QragError(f"{where}: 'extra' must be a mapping of index config overrides")
    expected = raw.get("expected")
    if expected is not None and not isinstance(expected, dict):
        raise QragError(f"{where}: 'expected' must be a mapping of metric -> percent, or null")
    if expected is not None:
        expected = {str(m): None if v is None else _number(v, f"{where}: expected {m}") for m, v in expected.items()}
    tolerance = _number(raw.get("tolerance", DEFAULT_TOLERANCE), f"{where}: tolerance")
    if tolerance < 0:
        raise QragError(f"{where}: tolerance must be >= 0")
    tags = raw.get("tags") or []
    tags = [tags] if isinstance(tags, str) else tags
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise QragError(f"{where}: 'tags' must be a list of strings")
    cond = Condition(id=cid, dataset=dataset, data=data, subset=subset, offset=offset,
                     representation=str(raw.get("representation") or "chunk"), embedder=embedder,
                     generator=generator, extra=extra, expected=expected, tolerance=tolerance, tags=tags,
                     split=str(raw.get("split") or "test"), notes=str(raw.get("notes") or ""))
    # typos in representation / embedder / generator / extra fail here
    index_config(cond.index_overrides(), f"{where}: ")
    return cond


def load_matrix(path: str | Path) -> list[Condition]:
    """Parse and validate a matrix YAML file (a list of conditions, or {conditions: [...]})."""
    file = Path(path)
    raw = read_yaml(file, "matrix file")
    if isinstance(raw, dict) and "conditions" in raw:
        raw = raw["conditions"]
    if not isinstance(raw, list) or not raw:
        raise QragError(f"matrix file {file} must hold a non-empty list of conditions")
    conds = [_parse_condition(c, i, str(file), file.parent) for i, c in enumerate(raw)]
    ids = [c.id for c in conds]
    if (dup := next((cid for i, cid in enumerate(ids) if cid in ids[:i]), None)) is not None:
        raise QragError(f"{file}: duplicate condition id '{dup}'")
    return conds


def select(conditions: list[Condition], ids: Iterable[str] | None = None,
           tags: Iterable[str] | None = None) -> list[Condition]:
    """Conditions by id (in the order given) and/or carrying any of `tags`; unknown ids are an error."""
    ids = None if ids is None else list(ids)
    by_id = {c.id: c for c in conditions}
    if missing := [i for i in ids or [] if i not in by_id]:
        raise QragError(f"unknown matrix condition(s): {', '.join(missing)} (known: {', '.join(by_id)})")
    out = list(conditions) if ids is None else [by_id[i] for i in ids]
    tagset = None if tags is None else set(tags)
    return out if tagset is None else [c for c in out if tagset & set(c.tags)]


_METRIC = re.compile(r"^[A-Za-z]+@\d+$")


def compare(conditions: list[Condition], measured: Mapping[str, Mapping[str, float]],
            measured_scale: Literal["fraction", "percent"] = "fraction") -> MatrixComparison:
    """Hold measurements against recorded figures (regression.compare_figures). Conditions absent
    from `measured` are `not_run`; a null expected figure is recorded, never failed."""
    if measured_scale not in ("fraction", "percent"):
        raise ValueError(f"measured_scale must be 'fraction' or 'percent', got {measured_scale!r}")
    figures = []
    record_only = {}
    not_run = []
    scale = 100.0 if measured_scale == "fraction" else 1.0
    for condition in conditions:
        if condition.id not in measured:
            not_run.append(condition.id)
            continue
        got = {m: None if (n := finite_number(v)) is None else n * scale for m, v in measured[condition.id].items()}
        expected = condition.expected or {}
        opened = ([m for m in got if _METRIC.match(m)] if condition.record_only
                  else [m for m, v in expected.items() if v is None])
        if figs := {m: got[m] for m in opened if got.get(m) is not None}:
            record_only[condition.id] = figs
        figures += [Figure(condition.id, m, exp, got.get(m), condition.tolerance) for m, exp in expected.items()]
    checked = compare_figures(figures)
    return MatrixComparison(checked.regressions, checked.improvements, checked.within, record_only, not_run)


def check(conditions: list[Condition], measured: Mapping[str, Mapping[str, float]],
          measured_scale: Literal["fraction", "percent"] = "fraction") -> list[Figure]:
    """The regressions of `compare` (measured below `expected - tolerance`, or missing); empty = pass."""
    return compare(conditions, measured, measured_scale).regressions


def run_matrix(path: str | Path, ids: Iterable[str] | None = None, *,
               runner: Callable[[Condition], Mapping[str, float]], tags: Iterable[str] | None = None) -> MatrixResult:
    """Load the matrix, run the selected conditions (all, `ids`, and/or those tagged with `tags`) through
    `runner(condition) -> {metric: value}` (fractions) and compare."""
    conds = select(load_matrix(path), ids, tags)
    if not conds:
        raise QragError(f"no matrix condition selected from {path}")
    measured: dict[str, dict[str, float]] = {}
    for condition in conds:
        got = runner(condition)
        if not isinstance(got, Mapping):
            raise TypeError(f"runner returned {type(got).__name__} for condition '{condition.id}', expected a mapping")
        measured[condition.id] = dict(got)
    return MatrixResult(measured, compare(conds, measured))
