"""`qrag presets`: the named index presets (`--representation NAME`), their versions and what each is for."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from qrag_ray.config.presets import PRESETS


def register(app: typer.Typer) -> None:
    @app.command("presets")
    def presets(json_out: bool = typer.Option(False, "--json", help="print them as JSON")):
        """List the index presets: vector kinds, LLM or not, BM25 weight, calibration, purpose."""
        if json_out:
            print(json.dumps([{"name": p.name, "id": p.id, "purpose": p.purpose, "kinds": list(p.kinds),
                               "needs_llm": p.needs_llm, "granularity": p.granularity,
                               "bm25_alpha": p.search.get("bm25_alpha"), "calibrated_for": p.calibrated_for,
                               "source": p.source} for p in PRESETS.values()], indent=2))
            return
        table = Table(title="index presets (qrag index --representation NAME; 'kind+kind' for your own)")
        for col in ("preset", "kinds", "LLM", "BM25 α", "calibrated for"):
            table.add_column(col, no_wrap=True)
        table.add_column("what it is for", ratio=1, min_width=30)
        for preset in PRESETS.values():
            alpha = preset.search.get("bm25_alpha")
            table.add_row(preset.id, "+".join(preset.kinds), f"per {preset.granularity}" if preset.needs_llm else "no",
                          "-" if alpha is None else f"{alpha:g}", preset.calibrated_for or "-", preset.purpose)
        console = Console()
        console.width = max(console.width, 140)  # a readable table when piped, too
        console.print(table)
