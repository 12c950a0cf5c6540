"""What the evaluation measured, typed from the driver to the files: `VariantResult` (one variant of `qrag
eval`, a row of results.json), `EvalMeta` and `EvalReport` (results.json itself), `EvalRun` (what
`run_eval` returns), and the suite's `SuiteCell` (one configuration on one dataset) and `SuiteReport`
(suite.json). Files written by earlier releases read back: keys a model does not declare are ignored and
every field but the metrics has a default. Metrics are fractions; a figure that is not finite is None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, computed_field, field_validator

from qrag_ray.evaluation.regression import finite_number


class _Read(BaseModel):
    # a file of another release: what this one does not know is left out, not an error
    model_config = ConfigDict(extra="ignore")


class _Measured(_Read):
    metrics: dict[str, float | None]

    @field_validator("metrics")
    @classmethod
    def _finite(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        return {k: finite_number(x) for k, x in value.items()}


class HydeCost(_Read):
    """What the HyDE baseline's LLM cost at query time."""

    llm_seconds: float
    generated: int
    output_tokens: int
    llm_seconds_per_query: float | None = None


class VariantResult(_Measured):
    """One variant as `qrag eval` measured it: retrieval metrics, the index's counts and what it cost."""

    vectors: int | None = None
    chunks: int | None = None
    questions: int | None = None
    vectors_before_filters: int | None = None
    index_bytes: int | None = None
    stage_seconds: dict[str, float] = {}  # the build's stages (a reused index: the build that made it), search
    query_ms: float | None = None
    generation: dict[str, Any] = {}  # the manifest's record of the build's LLM requests
    leaked_queries: int = 0  # generated questions equal to an evaluation query
    leaked_examples: list[str] = []
    index_reused: bool = False
    index_dir: str | None = None
    config: dict[str, Any] = {}  # the index's recorded config, with the search policy the variant ranked with
    hyde: HydeCost | None = None

    @computed_field
    @property
    def vectors_per_chunk(self) -> float | None:
        return self.vectors / self.chunks if self.vectors is not None and self.chunks else None

    @computed_field
    @property
    def build_seconds(self) -> float | None:
        """The build's `total` when recorded, else the sum of its stages."""
        if (total := finite_number(self.stage_seconds.get("total"))) is not None:
            return total
        vals = [v for v in map(finite_number, self.stage_seconds.values()) if v is not None]
        return sum(vals) if vals else None

    @computed_field
    @property
    def index_mb(self) -> float | None:
        return self.index_bytes / 1e6 if self.index_bytes is not None else None

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        if self.hyde is None:
            del data["hyde"]
        return data


class EvalMeta(_Read):
    """The evaluation set a run read: the dataset, its slice, its sizes and the cut-offs."""

    dataset: str
    data: str
    subset: int | None = None
    offset: int = 0
    documents: int
    queries: int
    judgments: int
    ks: list[int]

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        if not self.offset:  # the first slice, as it was always written
            del data["offset"]
        return data


class EvalReport(_Read):
    """results.json: the run's meta and every variant's result, by label."""

    meta: EvalMeta
    representations: dict[str, VariantResult]

    @property
    def title(self) -> str:
        meta = self.meta
        return f"qrag eval: {meta.dataset} ({meta.documents} docs, {meta.queries} queries)"

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta.to_json(),
                "representations": {k: r.to_json() for k, r in self.representations.items()}}

    @classmethod
    def read(cls, path: Path) -> "EvalReport | None":
        """results.json at `path`, or None when it is missing or not one."""
        try:
            return cls.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            return None


_PARTIAL = TypeAdapter(dict[str, VariantResult])


def write_partial(path: Path, results: Mapping[str, VariantResult]) -> None:
    """partial.json: the variants an interrupted run finished, by label."""
    path.write_text(json.dumps({k: r.to_json() for k, r in results.items()}, indent=2))


def read_partial(path: Path) -> dict[str, VariantResult]:
    try:
        return _PARTIAL.validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return {}


@dataclass
class EvalRun:
    """What `run_eval` returns: the report it wrote and where."""

    report: EvalReport
    paths: dict[str, Path]

    @property
    def results(self) -> dict[str, VariantResult]:
        return self.report.representations

    @property
    def leaks(self) -> dict[str, int]:
        """Variants whose generated questions equal evaluation queries: label -> how many."""
        return {k: r.leaked_queries for k, r in self.results.items() if r.leaked_queries}


_COST = ("vectors_per_chunk", "build_seconds")


class SuiteCell(_Measured):
    """One configuration on one dataset as the suite keeps it: the metrics and what its index cost."""

    vectors_per_chunk: float | None = None
    build_seconds: float | None = None  # a reused index reports the build that made it

    @classmethod
    def from_result(cls, result: VariantResult) -> "SuiteCell":
        return cls(metrics=result.metrics, vectors_per_chunk=result.vectors_per_chunk,
                   build_seconds=result.build_seconds)

    def to_json(self) -> dict[str, Any]:
        """suite.json's form: the metrics with the costs beside them (those known)."""
        return dict(self.metrics) | {k: v for k in _COST if (v := getattr(self, k)) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SuiteCell":
        return cls(metrics={k: v for k, v in data.items() if k not in _COST},
                   **{k: finite_number(data.get(k)) for k in _COST})


@dataclass
class SuiteMatrix:
    """The regression-matrix conditions a suite slice ran (suite.json's "matrix")."""

    file: str
    tags: list[str]
    measured: Any  # the matrix's measured figures, as its runner returned them
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "tags": self.tags, "measured": self.measured, "summary": self.summary}


@dataclass
class SuiteReport:
    """suite.json (`to_json`), with where the files went and the markdown table."""

    slice: str
    metric: str
    datasets: list[str]
    table: dict[str, dict[str, float]]  # config -> dataset (and "mean") -> percent
    metrics: dict[str, dict[str, SuiteCell]]  # dataset -> config -> what was measured
    cost: dict[str, dict[str, float]]  # config -> "vectors/chunk", "build s"
    configs: dict[str, dict[str, Any]]
    skipped: dict[str, list[str]]
    regressions: list[str]
    better: list[str]
    matrix: SuiteMatrix | None = None
    paths: dict[str, str] = field(default_factory=dict)
    markdown: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"slice": self.slice, "metric": self.metric, "datasets": self.datasets, "table": self.table,
                "metrics": {ds: {c: cell.to_json() for c, cell in row.items()} for ds, row in self.metrics.items()},
                "cost": self.cost, "configs": self.configs, "skipped": self.skipped,
                "regressions": self.regressions, "better": self.better,
                **({"matrix": self.matrix.to_json()} if self.matrix else {})}


def read_suite_json(path: Path) -> dict[str, Any]:
    """suite.json as data ({} when missing or unreadable); `SuiteCell.from_json` reads its cells."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}

