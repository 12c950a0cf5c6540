"""`qrag` command line. Thin: parse flags, call library functions, print results.

User mistakes end with one line on stderr and exit code 2, never a traceback; that includes errors
raised inside Ray tasks, which arrive wrapped and are unwrapped here.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from qrag_ray.errors import QragError, find_user_error  # noqa: F401 - re-exported for callers of the CLI module

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Question-based retrieval indexed with Ray Data and served with Ray Serve.")
err = Console(stderr=True)


@app.callback()
def _global_options(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True,
                                help="show third-party logs and warnings (Ray, Ray Data, transformers, vLLM); -vv debug"),
):
    """Question-based retrieval indexed with Ray Data and served with Ray Serve."""
    from qrag_ray.logs import filter_native_stderr, set_verbosity

    set_verbosity(verbose)
    filter_native_stderr()


@app.command()
def index(
    input: Optional[str] = typer.Option(None, "--input", "-i", help="corpus file, folder or glob"),
    format: str = typer.Option("jsonl", "--format", "-f", help="jsonl|parquet|msmarco|beir|html"),
    output: str = typer.Option(..., "--output", "-o", help="index directory to publish"),
    representation: str = typer.Option(None, "--representation", "-r",
                                       help="default (no flag: title-prefixed chunk + BM25)|chunk|hype|quote|quote-onedoc|atom-sentence|atom-question|hybrid|atom-hybrid|atom-hybrid-bm25|kind+kind"),
    shards: int = typer.Option(None, "--shards", "-s", help="number of shards (>= 1)"),
    generator: str = typer.Option(None, "--generator", "-g", help="vllm|openai|precomputed|none"),
    questions: int = typer.Option(None, "--questions", "-n", help="questions per chunk prompt"),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="YAML config (flags override it)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing index at --output"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: local Ray in-process)"),
    factory: Optional[str] = typer.Option(None, "--factory", help="FAISS factory string, e.g. Flat, HNSW32, IVF1024,PQ48"),
    prune_tau: Optional[float] = typer.Option(None, "--prune-tau", help="Q-Q pruning threshold"),
    chunker: Optional[str] = typer.Option(None, "--chunker", help="token|sentence|paragraph|none"),
    chunk_size: Optional[int] = typer.Option(None, "--chunk-size"),
    chunk_overlap: Optional[int] = typer.Option(None, "--chunk-overlap"),
    embedder: Optional[str] = typer.Option(None, "--embedder", help="embedder name or local folder"),
    model: Optional[str] = typer.Option(None, "--model", help="LLM for question generation (name or local folder)"),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="prompt template name"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint for --generator openai"),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="question cache folder"),
    bm25: Optional[bool] = typer.Option(None, "--bm25/--no-bm25", help="also build a BM25 index per shard (hybrid search)"),
    bm25_alpha: Optional[float] = typer.Option(
        None, "--bm25-alpha", help="default hybrid weight of the dense score, 0..1 (implies --bm25)"),
    json_out: bool = typer.Option(False, "--json", help="print the build report as JSON"),
    append: Optional[str] = typer.Option(None, "--append", help="add these documents to the index at --output (new version)"),
    delete_ids: Optional[str] = typer.Option(None, "--delete-ids", help="file of document ids to remove from the index at --output"),
    keep_work: bool = typer.Option(False, "--keep-work", help="keep the checkpoints (later --append/--delete-ids reuse them)"),
):
    """Build a sharded question index from a corpus."""
    from qrag_ray.config import build_index_config
    from qrag_ray.pipeline import build_index

    if append or delete_ids:
        from qrag_ray.index.incremental import incremental_config

        report = build_index(incremental_config(output, append, delete_ids), console=Console(stderr=True))
        print(json.dumps(report.to_dict(), indent=2, default=str)) if json_out else _print_summary(report, Console(stderr=True))
        return
    if input is None:
        raise QragError("--input is required")

    if shards is not None and shards < 1:
        raise QragError(f"--shards must be at least 1, got {shards}")
    cfg = build_index_config(
        config, input=input, format=format, output=output, representation=representation, shards=shards,
        overwrite=overwrite or None, address=address, cache_dir=cache_dir,
        **{"generator.backend": generator, "generator.questions": questions, "generator.model": model,
           "generator.prompt": prompt, "generator.base_url": base_url, "index.factory": factory,
           "filters.prune_tau": prune_tau, "chunker.method": chunker, "chunker.size": chunk_size,
           "chunker.overlap": chunk_overlap, "embedder.model": embedder,
           "bm25.enabled": True if bm25_alpha is not None else bm25, "search.bm25_alpha": bm25_alpha,
           "build.keep_work": keep_work or None},
    )
    out = Console(stderr=True)
    report = build_index(cfg, console=out)
    if json_out:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        _print_summary(report, out)


def _print_summary(report, console: Console) -> None:
    from rich.table import Table

    t = Table(title=f"index published at {report.output}", show_header=False)
    g = report.generation
    rows = [("documents", report.documents), ("chunks", report.chunks), ("questions", report.questions),
            ("vectors (before filters)", f"{report.vectors} ({report.vectors_before_filters})"),
            ("LLM requests: cached / generated", f"{g.cached} / {g.generated}"),
            ("LLM tokens: prompt / output", f"{g.prompt_tokens} / {g.output_tokens}"),
            ("index size", f"{report.index_bytes / 1e6:.2f} MB")]
    rows += [(f"time: {k}", f"{v:.1f}s") for k, v in report.stage_seconds.items()]
    for k, v in rows:
        t.add_row(k, str(v))
    console.print(t)


@app.command()
def search(
    query: str = typer.Argument(..., help="the question"),
    index: str = typer.Option(..., "--index", help="index directory"),
    k: int = typer.Option(10, "--k", "-k", help="number of distinct chunks"),
    min_score: Optional[float] = typer.Option(None, "--min-score"),
    bm25_alpha: Optional[float] = typer.Option(
        None, "--bm25-alpha", help="hybrid search with this dense weight (0..1; the index needs a BM25 channel)"),
):
    """Search an index in-process (no server) and print JSON results."""
    from qrag_ray.index.format import load_manifest
    from qrag_ray.search.engine import SearchEngine, validate_k
    from qrag_ray.search.merge import FusionPolicy

    validate_k(k)
    if not query.strip():
        raise QragError("query must be a non-empty string")
    policy = None
    if bm25_alpha is not None:
        policy = FusionPolicy.from_manifest(load_manifest(index)).with_bm25_alpha(bm25_alpha)
    engine = SearchEngine(index, policy=policy)
    results = engine.search([query], k=k, min_score=min_score)[0]
    print(json.dumps({"results": results, "index_version": engine.manifest.index_version}, indent=2,
                     ensure_ascii=False))


@app.command("prepare-models")
def prepare_models(llm: bool = typer.Option(True, "--llm/--no-llm", help="also prepare the bundled Qwen LLM")):
    """Check the bundled embedder and convert the bundled LLM once (cached)."""
    from qrag_ray.embedding import load_sentence_transformer
    from qrag_ray.models.registry import resolve_embedder, resolve_llm

    st = load_sentence_transformer("all-MiniLM-L6-v2", device="cpu")
    err.print(f"embedder all-MiniLM-L6-v2: {resolve_embedder('all-MiniLM-L6-v2')} (dim {st.get_sentence_embedding_dimension()})")
    if llm:
        err.print(f"LLM qwen2.5-coder-0.5b-instruct: {resolve_llm('qwen2.5-coder-0.5b-instruct')}")


def _register_optional_commands() -> None:
    """Sub-apps living in their own modules (serving, evaluation, demo) register themselves."""
    import importlib

    for mod in ("qrag_ray.driver.serve_cmd", "qrag_ray.driver.eval_cmd", "qrag_ray.driver.demo_cmd",
                "qrag_ray.driver.cache_cmd"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        m.register(app)


def _click_modules() -> list:
    """click itself and the copy recent typer vendors as `typer._click`: usage errors come from the
    one typer runs on, and catching only the other lets a missing option escape as a traceback."""
    import importlib

    mods = []
    for name in ("typer._click", "click"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            pass
    return mods


def _usage_error(e) -> int:
    """A click usage error as one line ('error: Missing option ... (see qrag index --help)'); a bare
    `qrag` or a group without its command still gets the help it asks for."""
    ctx = getattr(e, "ctx", None)
    if type(e).__name__ == "NoArgsIsHelpError":
        e.show()
        return e.exit_code or 2
    where = f" (see {ctx.command_path} --help)" if ctx is not None and getattr(ctx, "command_path", None) else ""
    msg = " ".join(e.format_message().split())
    err.print(f"[red]error:[/] {escape(msg)}{escape(where)}", highlight=False, markup=True, soft_wrap=True)
    return e.exit_code or 2


def main(argv: list[str] | None = None) -> int:
    mods = _click_modules()
    aborts = tuple(a for m in mods for a in [getattr(m.exceptions, "Abort", None)] if a is not None)
    aborts += (typer.Abort,) if hasattr(typer, "Abort") else ()
    usage = tuple(m.exceptions.ClickException for m in mods)

    _register_optional_commands()
    cmd = typer.main.get_command(app)
    try:
        cmd.main(args=argv, prog_name="qrag", standalone_mode=False)
        return 0
    except aborts:
        err.print("aborted")
        return 130
    except usage as e:
        return _usage_error(e)
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BaseException as e:  # noqa: BLE001 - map user errors to one line, keep bugs loud
        ue = find_user_error(e)
        if ue is None:
            raise
        msg = " ".join(str(ue).split())  # one line whatever the message holds
        err.print(f"[red]error:[/] {escape(msg)}", highlight=False, markup=True, soft_wrap=True)
        return ue.exit_code


if __name__ == "__main__":
    sys.exit(main())
