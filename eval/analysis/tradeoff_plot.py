"""The quality-per-vector trade-off of a suite run: each configuration's mean over the datasets against its
vectors per chunk (and, beside it, against its build seconds), from the suite.json that `qrag suite` wrote.

Why: a representation with more vectors per chunk costs embedding time at build (on CPU the vector count
is the build time) and memory at serve time; the curve shows what each step up in vectors buys.

  python eval/analysis/tradeoff_plot.py runs/suite-quick/suite.json -o docs/img/suite-tradeoff.png
Configurations that read the same index (BM25 alone, fusion variants) sit at its vector count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def points(report: dict) -> list[tuple[str, float, float, float | None]]:
    """(config, vectors per chunk, mean, build seconds) for every configuration measured on all datasets."""
    cost = report.get("cost") or {}
    table = report["table"]
    return [(c, cost[c]["vectors/chunk"], row["mean"], cost[c].get("build s")) for c, row in table.items()
            if "mean" in row and "vectors/chunk" in cost.get(c, {})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite_json")
    parser.add_argument("-o", "--output", default="suite-tradeoff.png")
    args = parser.parse_args()
    report = json.loads(Path(args.suite_json).read_text())
    pts = points(report)
    if not pts:
        raise SystemExit(f"{args.suite_json}: no configuration with vectors per chunk (written by qrag suite since "
                         "it reports what each index costs)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5))
    FigureCanvasAgg(fig)
    for i, (x_of, label) in enumerate(((1, "vectors per chunk (mean over the datasets)"),
                                       (3, "build seconds (sum over the datasets, one run)"))):
        axes = fig.add_subplot(1, 2, i + 1)
        shown = [p for p in pts if p[x_of] is not None]
        axes.scatter([p[x_of] for p in shown], [p[2] for p in shown])
        for point in shown:
            axes.annotate(point[0], (point[x_of], point[2]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        axes.set_xscale("log")
        axes.set_xlabel(label)
        axes.set_ylabel(f"{report.get('metric', 'nDCG@10')}, mean over {', '.join(report['datasets'])}")
        axes.grid(alpha=0.3)
    fig.tight_layout()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")
    for config, per_chunk, mean, seconds in sorted(pts, key=lambda p: p[1]):
        build = f"  build {seconds:7.1f} s" if seconds is not None else ""
        print(f"{config:28s} {per_chunk:6.2f} vectors/chunk  mean {mean:5.2f}{build}")


if __name__ == "__main__":
    main()
