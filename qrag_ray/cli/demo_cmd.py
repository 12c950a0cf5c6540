"""`qrag demo`: question-based retrieval next to the chunk baseline on a corpus that ships with Python (the
language reference bundled for `help()`: no download). Topics are indexed with questions the bundled Qwen
writes per chunk and as plain chunks; each question shows both top-k lists, with the generated question
that matched each hit. The question cache makes a second run skip the LLM. Without an LLM (`QRAG_NO_LLM=1` or
no vLLM) the index `qrag index` builds by default stands in (the `default` preset needs no LLM), so the
demo still compares what we ship with the plain chunk."""

from __future__ import annotations

import importlib.util
import os
import time
from itertools import zip_longest
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from qrag_ray.cli.app import err
from qrag_ray.cli.query_cmd import clip
from qrag_ray.config.search_policy import QUESTION_KINDS
from qrag_ray.io.pydoc_corpus import DEMO_EXPECTED, DEMO_QUERIES, DEMO_TOPICS, write_pydoc_corpus

QUESTION_REPRESENTATION = "hybrid"  # chunk + its generated questions, fused by the best vector
BASELINE_REPRESENTATION = "chunk"
NO_LLM_REPRESENTATION = "default"


def llm_unavailable() -> tuple[str, str] | None:
    """Why the bundled LLM cannot generate here and how to get it (None when it can)."""
    if os.environ.get("QRAG_NO_LLM") == "1":
        return "QRAG_NO_LLM=1", "run it without QRAG_NO_LLM"
    if importlib.util.find_spec("vllm") is None:
        return ("vLLM is not installed", "let pip reach PyTorch's CPU build (download.pytorch.org/whl/cpu) "
                "and run scripts/setup.sh again")
    return None


def matched_question(result: dict) -> str | None:
    """The generated question through which a hit was found: its best-scoring question vector."""
    return next((m.get("text") for m in result.get("matched") or [] if m.get("kind") in QUESTION_KINDS), None)


def won_by(result: dict) -> str:
    """The kind of the hit's best vector ('question', 'chunk', 'sentence' ...)."""
    return (result.get("matched") or [{}])[0].get("kind", "?")


def first_rank(results: list[dict], expected: tuple[str, ...]) -> int | None:
    """1-based rank of the first hit from one of the expected topics (None: not in the list)."""
    return next((i for i, r in enumerate(results, 1) if r.get("doc_id") in expected), None)


def comparison_rows(ours: list[dict], base: list[dict], expected: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Table rows: rank, our hit (topic, score, how it matched), the baseline's hit (topic, score)."""
    def cell(result: dict | None, show_match: bool) -> str:
        if result is None:
            return ""
        mark = "[green]✓[/] " if result.get("doc_id") in expected else ""
        hit = f"{mark}[bold]{result['doc_id']}[/] {result['score']:.3f}"
        if not show_match:
            return hit
        question = matched_question(result)
        kind = won_by(result)
        if question and kind in QUESTION_KINDS:
            return f"{hit}\n  [italic]matched generated question:[/] “{clip(question, 90)}”"
        if question:
            return f"{hit}\n  [dim]matched its {kind}; best question: “{clip(question, 70)}”[/]"
        text = (result.get("matched") or [{}])[0].get("text") or result.get("text", "")
        return f"{hit}\n  [dim]matched its {kind}: {clip(text, 80)}[/]"

    return [(str(i), cell(o, True), cell(b, False)) for i, (o, b) in enumerate(zip_longest(ours, base), 1)]


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        workdir: str = typer.Option("runs/demo", "--workdir", help="where the corpus and the two indexes go"),
        representation: str | None = typer.Option(
            None, "--representation", "-r",
            help=f"the question index (default {QUESTION_REPRESENTATION}; {NO_LLM_REPRESENTATION} without the LLM)"),
        baseline: str = typer.Option(BASELINE_REPRESENTATION, "--baseline", help="the index it is compared with"),
        generator: str | None = typer.Option(None, "--generator", "-g",
                                                help="vllm|openai|none (default: vllm when installed)"),
        topics: str | None = typer.Option(None, "--topics",
                                          help="comma-separated pydoc topics (default: the statements subset)"),
        all_topics: bool = typer.Option(False, "--all-topics", help="index all 79 topics (slow with the LLM)"),
        questions: int = typer.Option(8, "--questions", "-n", help="questions the LLM writes per chunk"),
        prompt: str = typer.Option("hype-fewshot", "--prompt", help="question prompt template"),
        shards: int = typer.Option(2, "--shards"),
        k: int = typer.Option(3, "--k"),
        query: list[str] | None = typer.Option(None, "--query", "-q", help="ask your own question(s)"),
        cache_dir: str | None = typer.Option(None, "--cache-dir",
                                             help="question cache folder (default ~/.cache/qrag-ray/questions)"),
    ):
        """Question-based retrieval on the Python language reference, next to the chunk baseline."""
        from qrag_ray.config.index import build_index_config
        from qrag_ray.generation.prompts import get_prompt
        from qrag_ray.index.build import build_index
        from qrag_ray.search.engine import SearchEngine
        from qrag_ray.search.query import validate_k

        out = Console()
        validate_k(k)
        no_llm = llm_unavailable() if generator is None else None
        generator = ("none" if no_llm else "vllm") if generator is None else generator
        rep = representation or (QUESTION_REPRESENTATION if generator != "none" else NO_LLM_REPRESENTATION)
        names = None if all_topics else ([t.strip() for t in topics.split(",") if t.strip()] if topics else DEMO_TOPICS)
        folder = Path(workdir)
        common = {"input": str(folder / "corpus.jsonl"), "format": "jsonl", "shards": shards, "build.overwrite": True,
                  "build.cache_dir": cache_dir, "chunker.method": "token", "chunker.size": 200, "chunker.overlap": 20}
        # both configs are checked before anything is written or printed: a bad flag is one line
        cfg = build_index_config(None, representation=rep, **common, **{
            "build.output": str(folder / "index"), "generator.backend": generator, "generator.questions": questions,
            "generator.prompt": prompt, "generator.batch_size": 8})
        base_cfg = build_index_config(None, representation=baseline, **common,
                                      **{"build.output": str(folder / "index-baseline")})
        get_prompt(prompt)
        topic_count = write_pydoc_corpus(folder / "corpus.jsonl", names)
        asks = list(query or DEMO_QUERIES)
        if no_llm:
            err.print(f"[yellow]no LLM ({no_llm[0]}):[/] generated questions need one, so the demo compares "
                      f"{rep} (our index without an LLM) with {baseline}; for the questions, {no_llm[1]}.")
        err.print(f"corpus: {topic_count} topics of the Python language reference -> {folder / 'corpus.jsonl'}")
        err.print(f"[bold]1/2[/] {rep} index" + (f" (questions by {cfg.generator.model} on {generator})"
                                                 if generator != "none" else ""))
        started = time.perf_counter()
        report = build_index(cfg, console=err)
        t_ours = time.perf_counter() - started
        generation = report.generation
        if generation.requests:
            err.print(f"  {report.chunks} chunks, {report.questions} generated questions; LLM requests "
                      f"{generation.cached} from the question cache, {generation.generated} generated "
                      f"({generation.seconds:.0f}s)")
        err.print(f"[bold]2/2[/] {baseline} index (the baseline)")
        build_index(base_cfg, console=err)
        engines = [SearchEngine(cfg.build.output), SearchEngine(base_cfg.build.output)]
        wins = [0, 0]
        for question in asks:
            ours, base = (e.search([question], k=k)[0] for e in engines)
            expected = DEMO_EXPECTED.get(question, ())
            table = Table(title=f"[bold]{question}", title_justify="left", show_lines=True, expand=False)
            table.add_column("#", justify="right")
            table.add_column(f"{rep} (generated questions)" if generator != "none" else f"{rep} (no LLM)", ratio=3)
            table.add_column(f"{baseline} (baseline)", ratio=1)
            for row in comparison_rows(ours, base, expected):
                table.add_row(*row)
            out.print(table)
            if expected:
                rank_ours = first_rank(ours, expected)
                rank_baseline = first_rank(base, expected)
                out.print(f"  right topic ({', '.join(expected)}) first at rank: {rep} {rank_ours or f'>{k}'}, "
                          f"{baseline} {rank_baseline or f'>{k}'}\n")
                wins[0] += rank_ours == 1
                wins[1] += rank_baseline == 1
        if known := sum(q in DEMO_EXPECTED for q in asks):
            out.print(f"right topic at rank 1: {rep} {wins[0]}/{known}, {baseline} {wins[1]}/{known}")
        out.print(f"{rep} index built in {t_ours:.0f}s. Search it yourself: qrag search --index {cfg.build.output} "
                  "--k 5 \"your question\"")
