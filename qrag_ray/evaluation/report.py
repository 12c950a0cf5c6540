"""Side-by-side evaluation report of an EvalReport (qrag_ray.evaluation.results): results.json, results.md
and recall.png. A missing figure shows as "–", metrics as percentages. The plot uses matplotlib's Agg
canvas (no pyplot, no global backend switch), so it works headless and in Ray workers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from qrag_ray.evaluation.regression import finite_number
from qrag_ray.evaluation.results import EvalReport, VariantResult

COLUMNS = ("R@1", "R@2", "R@5", "R@10", "R@20", "T@1", "MRR@10", "nDCG@10")
_RECALL = re.compile(r"^R@(\d+)$")
_DASH = "–"


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    number = finite_number(value)
    return _DASH if number is None else format(scale * number, spec)


def markdown_table(results: Mapping[str, VariantResult]) -> str:
    """The side-by-side table (metrics in percent), best value per metric column in bold."""
    header = ["representation", "vectors", "vectors/chunk", *COLUMNS, "build s", "index MB"]
    cols = {c: [v for e in results.values() if (v := e.metrics.get(c)) is not None] for c in COLUMNS}
    best = {c: max(vals) for c, vals in cols.items() if len(vals) > 1}
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    for rep, entry in results.items():
        cells = [f"`{rep}`", _DASH if entry.vectors is None else f"{entry.vectors:,}",
                 _fmt(entry.vectors_per_chunk, ".2f")]
        for col in COLUMNS:
            cell = _fmt(entry.metrics.get(col), ".1f", 100.0)
            cells.append(f"**{cell}**" if col in best and entry.metrics.get(col) == best[col] else cell)
        cells += [_fmt(entry.build_seconds, ".1f"), _fmt(entry.index_mb, ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(path: Path, results: Mapping[str, VariantResult], title: str | None) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), dpi=110)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    reps = list(results)
    for rep, entry in results.items():
        pts = sorted((int(m.group(1)), 100.0 * v) for key, v in entry.metrics.items()
                     if (m := _RECALL.match(key)) and v is not None)
        if pts:
            ax1.plot(*zip(*pts, strict=True), marker="o", label=rep)
    ax1.set_xscale("log", base=2)
    cutoffs = sorted({int(m.group(1)) for e in results.values() for key in e.metrics if (m := _RECALL.match(key))})
    if cutoffs:
        ax1.set_xticks(cutoffs, [str(k) for k in cutoffs])
    ax1.set(xlabel="k (distinct chunks)", ylabel="recall@k (%)", title="recall@k")
    ax1.grid(True, alpha=0.3)
    if any(ax1.get_lines()):
        ax1.legend(fontsize=8)
    vpc = [results[r].vectors_per_chunk for r in reps]
    ax2.bar(range(len(reps)), [v if v is not None else 0.0 for v in vpc], color="tab:gray")
    ax2.set_xticks(range(len(reps)), reps, rotation=30, ha="right", fontsize=8)
    ax2.set(ylabel="vectors per chunk", title="index size")
    for i, value in enumerate(vpc):
        if value is not None:
            ax2.annotate(f"{value:.1f}", (i, value), ha="center", va="bottom", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)


def write_report(output_dir: str | Path, report: EvalReport) -> dict[str, Path]:
    """Write results.json, results.md and recall.png into output_dir; the meta (dataset, query count, ...)
    is listed above the table. Returns {"json": path, "md": path, "png": path}."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "md": out / "results.md", "png": out / "recall.png"}
    doc = report.to_json()
    paths["json"].write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    results = report.representations
    title = report.title
    markdown = [f"# {title}", "", *(f"- **{k}**: {v}" for k, v in doc["meta"].items()), "", markdown_table(results),
                "Metrics in percent (R@k = recall@k over distinct chunks = context accuracy C@k with one gold "
          "chunk; T@1 = title accuracy). Best per column in bold.", "", "![recall@k](recall.png)"]
    paths["md"].write_text("\n".join(markdown) + "\n", encoding="utf-8")
    _plot(paths["png"], results, title)
    return paths
