"""`qrag index`: build (or append to, or delete from) a sharded question index from a corpus."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from qrag_ray.cli.app import err
from qrag_ray.errors import QragError


def register(app: typer.Typer) -> None:
    @app.command()
    def index(
        input: str | None = typer.Option(None, "--input", "-i", help="corpus file, folder or glob"),
        format: str = typer.Option("jsonl", "--format", "-f", help="jsonl|parquet|msmarco|beir|html"),
        output: str = typer.Option(..., "--output", "-o", help="index directory to publish"),
        representation: str = typer.Option(None, "--representation", "-r",
                                           help="a preset (`qrag presets` lists them; no flag: default, title-prefixed "
                                                "chunk + sentences + windows + BM25) or kinds joined by '+'"),
        shards: int = typer.Option(None, "--shards", "-s", help="number of shards (>= 1)"),
        generator: str = typer.Option(None, "--generator", "-g", help="vllm|openai|precomputed|none"),
        questions: int = typer.Option(None, "--questions", "-n", help="questions per chunk prompt"),
        config: str | None = typer.Option(None, "--config", "-c", help="YAML config (flags override it)"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing index at --output"),
        address: str | None = typer.Option(None, "--address",
                                           help="Ray cluster address (default: local Ray in-process)"),
        factory: str | None = typer.Option(None, "--factory",
                                           help="FAISS factory string, e.g. Flat, HNSW32, IVF1024,PQ48"),
        prune_tau: float | None = typer.Option(None, "--prune-tau", help="Q-Q pruning threshold"),
        chunker: str | None = typer.Option(None, "--chunker", help="token|sentence|paragraph|none"),
        chunk_size: int | None = typer.Option(None, "--chunk-size"),
        chunk_overlap: int | None = typer.Option(None, "--chunk-overlap"),
        embedder: str | None = typer.Option(None, "--embedder", help="embedder name or local folder"),
        model: str | None = typer.Option(None, "--model", help="LLM for question generation (name or local folder)"),
        prompt: str | None = typer.Option(None, "--prompt", help="prompt template name"),
        base_url: str | None = typer.Option(None, "--base-url",
                                            help="OpenAI-compatible endpoint for --generator openai"),
        cache_dir: str | None = typer.Option(None, "--cache-dir", help="question cache folder"),
        bm25: bool | None = typer.Option(None, "--bm25/--no-bm25",
                                         help="also build a BM25 index per shard (hybrid search)"),
        bm25_alpha: float | None = typer.Option(
            None, "--bm25-alpha", help="default hybrid weight of the dense score, 0..1 (implies --bm25)"),
        json_out: bool = typer.Option(False, "--json", help="print the build report as JSON"),
        append: str | None = typer.Option(None, "--append",
                                          help="add these documents to the index at --output (new version)"),
        delete_ids: str | None = typer.Option(None, "--delete-ids",
                                              help="file of document ids to remove from the index at --output"),
        keep_work: bool = typer.Option(False, "--keep-work",
                                       help="keep the checkpoints (later --append/--delete-ids reuse them)"),
    ):
        """Build a sharded question index from a corpus."""
        from qrag_ray.config.index import build_index_config
        from qrag_ray.index.build import build_index
        from qrag_ray.index.incremental import incremental_config

        if append or delete_ids:
            cfg = incremental_config(output, append, delete_ids)
        elif input is None:
            raise QragError("--input is required")
        elif shards is not None and shards < 1:
            raise QragError(f"--shards must be at least 1, got {shards}")
        else:
            cfg = build_index_config(
                config, input=input, format=format, representation=representation, shards=shards,
                **{"generator.backend": generator, "generator.questions": questions, "generator.model": model,
                   "generator.prompt": prompt, "generator.base_url": base_url, "faiss.factory": factory,
                   "filters.prune_tau": prune_tau, "chunker.method": chunker, "chunker.size": chunk_size,
                   "chunker.overlap": chunk_overlap, "embedder.model": embedder,
                   "bm25.enabled": True if bm25_alpha is not None else bm25, "search.bm25_alpha": bm25_alpha,
                   "build.keep_work": keep_work or None, "build.output": output,
                   "build.overwrite": overwrite or None, "build.address": address, "build.cache_dir": cache_dir})
        report = build_index(cfg, console=err)
        if json_out:
            print(json.dumps(report.to_dict(), indent=2, default=str))
        else:
            _print_summary(report)


def _print_summary(report) -> None:
    table = Table(title=f"index published at {report.output}", show_header=False)
    generation = report.generation
    rows = [("documents", report.documents), ("chunks", report.chunks), ("questions", report.questions),
            ("vectors (before filters)", f"{report.vectors} ({report.vectors_before_filters})"),
            ("LLM requests: cached / generated", f"{generation.cached} / {generation.generated}"),
            ("LLM tokens: prompt / output", f"{generation.prompt_tokens} / {generation.output_tokens}"),
            ("index size", f"{report.index_bytes / 1e6:.2f} MB")]
    for label, value in rows + [(f"time: {k}", f"{v:.1f}s") for k, v in report.stage_seconds.items()]:
        table.add_row(label, str(value))
    err.print(table)
