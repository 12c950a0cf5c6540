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

        s = summarize_index(index, sample)
        if json_out:
            print(json.dumps(s, indent=2, ensure_ascii=False))
            return
        print_summary(s)


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return str(n)


def _field_type(v) -> str:
    return v if isinstance(v, str) else str(v.get("type", v)) if isinstance(v, dict) else str(v)


def print_summary(s: dict) -> None:
    out = Console(highlight=False)
    out.width = max(out.width, 120)  # readable when piped
    c, b, bm25, schema = s["counts"], s["bytes"], s["bm25"], s["metadata_schema"]
    built = f"{s['created_at'] or 'unknown'}" + (f" in {s['build_seconds']:.1f} s" if s["build_seconds"] else "")
    rows = [
        ("index", f"{s['path']} (version {s['index_version']}, format {s['format_version']})"),
        ("built", built),
        ("representation", f"{s['representation']} (preset {s['preset'] or 'not recorded'}; kinds "
                           f"{'+'.join(s['kinds'] or []) or '?'}; questions per {s['question_granularity'] or '-'})"),
        ("embedder", f"{s['embedder']['model']} (dim {s['embedder']['dim']})"),
        ("faiss", f"{s['faiss']['factory']}, {s['faiss'].get('metric', '')}" if s["faiss"] else "unknown"),
        ("shards", f"{s['num_shards']} (chunks {', '.join(str(x['chunks']) for x in s['shards'])})"),
        ("counts", ", ".join(f"{k} {v:,}" for k, v in c.items()) if c else "not recorded"),
        ("vectors per kind", ", ".join(f"{k} {v:,}" for k, v in s["vectors_per_kind"].items()) or "none"),
        ("bm25", "none" if bm25 is None else f"{bm25['docs']:,} chunks, vocabulary {bm25['vocabulary']:,}"
                                             f" per shard at most, alpha {bm25['alpha']}"),
        ("bytes", f"{_size(b['total'])} (FAISS {_size(b['faiss'])}, rows {_size(b['rows'])}, chunks "
                  f"{_size(b['chunks'])}, BM25 {_size(b['bm25'])})"),
        ("metadata", "none" if not schema else ", ".join(f"{k}: {_field_type(v)}" for k, v in schema.items())),
    ]
    for name, value in rows:
        out.print(f"[bold]{name:<17}[/]{escape(value)}")
    if s["samples"]:
        out.print(f"\n[bold]{len(s['samples'])} sample chunks[/] (of {c.get('chunks', '?')}) with their generated "
                  "questions:")
    for x in s["samples"]:
        out.print(f"\n[bold]{escape(x['chunk_id'])}[/]  {escape(x['title'] or '')}\n  {escape(clip(x['text'], 200))}")
        for q in x["questions"] or ["(no generated questions)"]:
            out.print(f"    - {escape(q)}")
