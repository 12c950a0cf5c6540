"""Ray Data wiring for generation: requests -> (cache | backend) -> parsed outputs.

Backends see only requests that are not cached, write straight into the cache while they run, and the
outputs reach their chunks through a join on the cache key. Backends know nothing about caching or
parsing, so every backend gets both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from qrag_ray.config.llm import GeneratorConfig
from qrag_ray.generation.backends import get_backend
from qrag_ray.generation.cache import QuestionCache
from qrag_ray.runtime.stage_plan import StagePlan


@dataclass
class GenerationStats:
    requests: int = 0
    cached: int = 0
    generated: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    by_stage: dict = field(default_factory=dict)

    def add(self, other: "GenerationStats", name: str) -> None:
        for field_name in ("requests", "cached", "generated", "prompt_tokens", "output_tokens", "seconds"):
            setattr(self, field_name, getattr(self, field_name) + getattr(other, field_name))
        self.by_stage[name] = other.__dict__ | {"by_stage": {}}


def _missing_keys(requests, cache: QuestionCache):
    """Distinct request keys not in the cache, with their messages."""
    import numpy as np

    parts = _parts(requests)  # count blocks before projecting: only a MaterializedDataset knows them
    reqs = requests.select_columns(["key", "messages"])
    cached = cache.dataset()
    if cached is None:
        return reqs
    hits = cached.select_columns(["key"]).map_batches(
        lambda b: {"key": b["key"], "hit": np.ones(len(b["key"]), dtype=bool)}, batch_format="numpy")
    joined = reqs.join(hits, join_type="left_outer", on=("key",), num_partitions=parts)
    return joined.filter(lambda r: not r["hit"]).select_columns(["key", "messages"])


def _parts(dataset) -> int:
    try:
        blocks = dataset.num_blocks()
    except (AttributeError, NotImplementedError):
        blocks = 4
    return max(1, min(32, blocks))


def generate(requests, cfg: GeneratorConfig, cache: QuestionCache, model_path: str | None, stage: StagePlan):
    """(requests joined with their raw outputs, GenerationStats). `stage`: the generate stage of the build's
    resource plan (the backend's actors and their resources).

    `requests`: materialized, with key, messages and payload columns; the result keeps the payload and adds
    `raw` (None where the backend gave nothing). A text repeated in several chunks may be generated more
    than once in a first run; the consumer dedups per (chunk, unit)."""
    import pyarrow.parquet as pq

    started = time.perf_counter()
    stats = GenerationStats(requests=requests.count())
    missing = _missing_keys(requests, cache).materialize()
    n_missing = missing.count()
    if n_missing:
        run_dir = cache.new_run_dir()
        # Blocks of about 4 engine batches: each finished block lands in the cache right away, so a
        # long run (the full SQuAD dev set) shows progress and an interrupted one resumes from there.
        # A small run gets blocks of one engine batch, so its progress moves more than once.
        per_block = max(cfg.batch_size, min(4 * cfg.batch_size, -(-n_missing // 8)))
        missing = missing.repartition(max(1, -(-n_missing // per_block)))
        out = get_backend(cfg.backend)(missing, cfg, model_path, stage=stage).select_columns(
            ["key", "raw", "prompt_tokens", "output_tokens"])
        # Engine start plus a first batch of long prompts on a busy CPU can outlast Ray Data's "no
        # progress" watchdog; progress shows in the cache run dir instead.
        out.context.execution_no_progress_timeout_s = -1
        out.write_parquet(run_dir)
        for file in sorted(Path(run_dir).glob("*.parquet")):
            table = pq.read_table(file, columns=["prompt_tokens", "output_tokens"])
            stats.generated += table.num_rows
            stats.prompt_tokens += sum(x or 0 for x in table["prompt_tokens"].to_pylist())
            stats.output_tokens += sum(x or 0 for x in table["output_tokens"].to_pylist())
    stats.cached = stats.requests - n_missing
    cached = cache.dataset()
    if cached is None:
        raise RuntimeError("generation produced no output")
    joined = requests.drop_columns(["messages"]).join(
        cached.select_columns(["key", "raw"]), join_type="left_outer", on=("key",),
        num_partitions=_parts(requests)).materialize()
    stats.seconds = time.perf_counter() - started
    return joined, stats
