"""What every stage of a build is given: the plan the driver fixed before the stream started, and
the clock that times the named stages (qrag_ray.index.build)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from qrag_ray.config.index import IndexConfig
from qrag_ray.config.search_policy import QUESTION_KINDS
from qrag_ray.index.resource_plan import ResourcePlan
from qrag_ray.runtime.progress import stage
from qrag_ray.runtime.stage_plan import StagePlan


@dataclass(frozen=True)
class BuildPlan:
    """A build's config and the decisions drawn from it; nothing here changes once the build starts."""

    cfg: IndexConfig
    out: Path  # the index directory to publish
    work: Path  # the checkpoints (qrag_ray.index.workdir)
    run: str  # this run's id: the chunk parts and row keys it registers
    kinds: list[str]  # vector kinds to store
    granularity: str | None  # questions per chunk or per atom; None: no LLM questions
    aux_questions: bool  # questions embedded only to filter (stored or not)
    inputs: str  # fingerprint of the input files and deletions: a finished stream is reused only for the same
    deleted: frozenset  # document ids to leave out (--delete-ids)
    resources: ResourcePlan  # every stage's actors or tasks, CPUs, GPUs and batch (index/resource_plan.py)

    def stage(self, name: str) -> StagePlan:
        return self.resources.stages[name]

    @property
    def question_kind(self) -> str | None:
        """The kind whose rows count as questions in the report."""
        if self.aux_questions:
            return "question"
        return next((k for k in QUESTION_KINDS if k in self.kinds), None)


@dataclass
class StageClock:
    """Seconds per named stage, each shown on the console while it runs (qrag_ray.runtime.progress)."""

    console: object = None
    seconds: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            with stage(self.console, name):
                yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0) + time.perf_counter() - started, 3)

    def total(self) -> float:
        return round(time.perf_counter() - self.started, 3)
