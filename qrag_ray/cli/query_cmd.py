"""`qrag query`: ask a running qrag server and print its results for a person (or the raw JSON)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from qrag_ray.errors import QragError


def register(app: typer.Typer) -> None:
    @app.command("query")
    def query_cmd(
        text: str = typer.Argument(..., help="the question"),
        url: str = typer.Option("http://127.0.0.1:8000", "--url", help="server URL"),
        key: str | None = typer.Option(None, "--key", envvar="QRAG_API_KEY", help="API key (or $QRAG_API_KEY)"),
        k: int = typer.Option(5, "--k", "-k", help="number of distinct chunks"),
        mode: str = typer.Option("default", "--mode", help="default|hyde"),
        min_score: float | None = typer.Option(None, "--min-score"),
        bm25_alpha: float | None = typer.Option(
            None, "--bm25-alpha", help="hybrid search with this dense weight, 0..1 (index built with BM25)"),
        answer: bool = typer.Option(False, "--answer", help="ask /v1/answer for a cited answer"),
        filter_json: str | None = typer.Option(
            None, "--filter", help='metadata filter as JSON, e.g. \'{"type": "eq", "key": "lang", "value": "en"}\' '
                                   "(docs/SERVING.md)"),
        doc_id: list[str] = typer.Option([], "--doc-id", help="only chunks of this document (repeatable)"),
        json_out: bool = typer.Option(False, "--json", help="print the raw JSON response"),
    ):
        """Query a running qrag server and print the results for a person."""
        from qrag_client import QragClient, QragClientError
        from qrag_client.models import parse_filter

        try:
            filt = parse_filter(filter_json)
        except ValueError as error:
            raise QragError(str(error)) from None
        try:
            with QragClient(url, api_key=key, timeout=120) as client:
                ask = client.answer if answer else client.search
                resp = ask(text, k, mode=mode, min_score=min_score, bm25_alpha=bm25_alpha, filter=filt,
                           doc_ids=doc_id or None)
        except QragClientError as error:  # the API's error (HTTP status, kind, message) or the transport's, one line
            raise QragError(str(error)) from None
        data = resp.model_dump(mode="json", exclude_unset=True)  # the body's fields as the server sent them
        if json_out:
            print(json.dumps(data, indent=2, ensure_ascii=False))
            return
        print_results(data, text, answer)


def print_results(data: dict, query: str, answer: bool = False) -> None:
    out = Console()
    if answer:
        out.rule(f"[bold]{query}")
        out.print(data.get("answer", ""))
        for citation in data.get("citations", []):
            out.print(f"  [{citation['n']}] {citation['chunk_id']}")
    table = Table(show_lines=True, title=f"{len(data.get('results', []))} results from '{data.get('index')}' (index "
                                         f"{str(data.get('index_version', ''))[:12]}, {data.get('took_ms', 0):.0f} ms)")
    for col in ("#", "score", "chunk", "matched", "text"):
        table.add_column(col, justify="right" if col in ("#", "score") else "left")
    for rank, result in enumerate(data.get("results", []), 1):
        best = result["matched"][0] if result.get("matched") else {}
        table.add_row(str(rank), f"{result['score']:.3f}", result["chunk_id"],
                      f"{best.get('kind', '')}: {clip(best.get('text', ''), 100)}", clip(result.get("text", ""), 200))
    out.print(table)


def clip(text: str, width: int) -> str:
    """`text` on one line, cut to at most `width` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"
