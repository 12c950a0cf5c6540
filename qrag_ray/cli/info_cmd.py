"""`qrag info`: what an index holds (representation, embedder, shards, vectors per kind, BM25, bytes,
metadata schema, build time) and a few sample chunks with the questions generated for them."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape

from qrag_ray.cli.query_cmd import clip


def register(app: typer.Typer) -> None:
    @app.command("info")
    def info(
        index: str = typer.Option(..., "--index", help="index directory"),
        sample: int = typer.Option(3, "--sample", min=0, help="sample chunks to show with their questions"),
        json_out: bool = typer.Option(False, "--json", help="print it as JSON"),
    ):
        """Describe an index: its build, vectors, BM25, bytes, metadata fields and sample chunks."""
        from qrag_ray.index.summary import summarize_index

        summary = summarize_index(index, sample)
        if json_out:
            print(json.dumps(summary, indent=2, ensure_ascii=False))
            return
        print_summary(summary)


def _size(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1000
    return str(size)


def _field_type(field) -> str:
    return field if isinstance(field, str) else str(field.get("type", field)) if isinstance(field, dict) else str(field)


def print_summary(summary: dict) -> None:
    out = Console(highlight=False)
    out.width = max(out.width, 120)  # readable when piped
    counts = summary["counts"]
    sizes = summary["bytes"]
    bm25 = summary["bm25"]
    schema = summary["metadata_schema"]
    built = f"{summary['created_at'] or 'unknown'}" + (f" in {summary['build_seconds']:.1f} s"
                                                       if summary["build_seconds"] else "")
    rows = [
        ("index", f"{summary['path']} (version {summary['index_version']}, format {summary['format_version']})"),
        ("built", built),
        ("representation", f"{summary['representation']} (preset {summary['preset'] or 'not recorded'}; kinds "
                           f"{'+'.join(summary['kinds'] or []) or '?'}; questions per "
                           f"{summary['question_granularity'] or '-'})"),
        ("embedder", f"{summary['embedder']['model']} (dim {summary['embedder']['dim']})"),
        ("faiss", f"{summary['faiss']['factory']}, {summary['faiss'].get('metric', '')}" if summary["faiss"]
         else "unknown"),
        ("shards", f"{summary['num_shards']} (chunks {', '.join(str(x['chunks']) for x in summary['shards'])})"),
        ("counts", ", ".join(f"{k} {v:,}" for k, v in counts.items()) if counts else "not recorded"),
        ("vectors per kind", ", ".join(f"{k} {v:,}" for k, v in summary["vectors_per_kind"].items()) or "none"),
        ("bm25", "none" if bm25 is None else f"{bm25['docs']:,} chunks, vocabulary {bm25['vocabulary']:,}"
                                             f" per shard at most, alpha {bm25['alpha']}"),
        ("bytes", f"{_size(sizes['total'])} (FAISS {_size(sizes['faiss'])}, rows {_size(sizes['rows'])}, chunks "
                  f"{_size(sizes['chunks'])}, BM25 {_size(sizes['bm25'])})"),
        ("metadata", "none" if not schema else ", ".join(f"{k}: {_field_type(v)}" for k, v in schema.items())),
    ]
    for name, value in rows:
        out.print(f"[bold]{name:<17}[/]{escape(value)}")
    if summary["samples"]:
        out.print(f"\n[bold]{len(summary['samples'])} sample chunks[/] (of {counts.get('chunks', '?')}) with their "
                  "generated questions:")
    for sample in summary["samples"]:
        out.print(f"\n[bold]{escape(sample['chunk_id'])}[/]  {escape(sample['title'] or '')}\n  "
                  f"{escape(clip(sample['text'], 200))}")
        for question in sample["questions"] or ["(no generated questions)"]:
            out.print(f"    - {escape(question)}")
