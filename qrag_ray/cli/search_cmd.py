"""`qrag search`: search an index in-process, no server (the same engine the Serve shards run)."""

from __future__ import annotations

import json

import typer

from qrag_ray.errors import QragError


def register(app: typer.Typer) -> None:
    @app.command()
    def search(
        query: str = typer.Argument(..., help="the question"),
        index: str = typer.Option(..., "--index", help="index directory"),
        k: int = typer.Option(10, "--k", "-k", help="number of distinct chunks"),
        min_score: float | None = typer.Option(None, "--min-score"),
        bm25_alpha: float | None = typer.Option(
            None, "--bm25-alpha", help="hybrid search with this dense weight (0..1; the index needs a BM25 channel)"),
    ):
        """Search an index in-process (no server) and print JSON results."""
        from qrag_ray.index.format import load_manifest
        from qrag_ray.search.engine import SearchEngine
        from qrag_ray.search.query import validate_k

        validate_k(k)
        if not query.strip():
            raise QragError("query must be a non-empty string")
        engine = SearchEngine(index, policy=None if bm25_alpha is None else
                              load_manifest(index).search_policy.with_bm25_alpha(bm25_alpha))
        results = engine.search([query], k=k, min_score=min_score)[0]
        print(json.dumps({"results": results, "index_version": engine.manifest.index_version}, indent=2,
                         ensure_ascii=False))
