"""Percentiles, a printed table and the JSON report every benchmark writes."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path


def pct(values: list[float], p: float) -> float:
    """The p-th percentile by nearest rank (NaN for no values)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[rank]


def latency(values_ms: list[float]) -> dict:
    """p50, p99 and mean of latencies in ms."""
    return {"n": len(values_ms), "p50_ms": pct(values_ms, 50), "p99_ms": pct(values_ms, 99),
            "mean_ms": statistics.mean(values_ms) if values_ms else float("nan")}


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and fmt:
        return format(value, fmt)
    return str(value)


def print_table(columns: list[tuple[str, str, str]], rows: list[dict], title: str | None = None) -> None:
    """Rows as aligned columns: each column is (header, the row's key, number format, e.g. '.1f')."""
    cells = [[header for header, _, _ in columns]]
    cells += [[_cell(row.get(key), fmt) for _, key, fmt in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    if title:
        print(f"\n{title}")
    for n, line in enumerate(cells):
        padded = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        print("  ".join(padded))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def write_json(report: dict, out: str | Path) -> Path:
    """The report as JSON at `out` (folders made), and a line saying where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {path}")
    return path
