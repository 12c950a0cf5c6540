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
        filter: str | None = typer.Option(
            None, "--filter", help='metadata filter as JSON, e.g. \'{"type": "eq", "key": "lang", "value": "en"}\' '
                                   "(docs/SERVING.md, Filters)"),
        doc_id: list[str] = typer.Option([], "--doc-id", help="only chunks of this document (repeatable)"),
    ):
        """Search an index in-process (no server) and print JSON results."""
        from qrag_client.models import parse_filter
        from qrag_ray.index.format import load_manifest
        from qrag_ray.search.engine import SearchEngine
        from qrag_ray.search.query import validate_k

        validate_k(k)
        if not query.strip():
            raise QragError("query must be a non-empty string")
        try:  # the client's check of the text (qrag query's too); the grammar and fields are the engine's
            spec = parse_filter(filter)
        except ValueError as error:
            raise QragError(str(error)) from None
        engine = SearchEngine(index, policy=None if bm25_alpha is None else
                              load_manifest(index).search_policy.with_bm25_alpha(bm25_alpha))
        results = engine.search([query], k=k, min_score=min_score, filter=spec, doc_ids=doc_id or None)[0]
        print(json.dumps({"results": results, "index_version": engine.manifest.index_version}, indent=2,
                         ensure_ascii=False))
