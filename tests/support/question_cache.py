"""A small question cache's entries, for asserting on what builds wrote."""

from __future__ import annotations

import pyarrow.parquet as pq


def cache_entries(cache) -> dict[str, str]:
    """key -> raw over every file of `cache` (a QuestionCache)."""
    tables = [pq.read_table(f, columns=["key", "raw"]) for f in cache.files()]
    return {k: raw for t in tables for k, raw in zip(t["key"].to_pylist(), t["raw"].to_pylist(), strict=True)}
