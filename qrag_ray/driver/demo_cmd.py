"""`qrag demo`: index a real corpus that ships with Python and answer a few questions from it.

The corpus is the Python language reference as bundled for `help()` (`pydoc_data.topics`, 79 topics,
~465k characters), so the demo needs no download and no data folder. The default representation
(`atom-sentence`: each chunk plus each of its sentences) needs no LLM, so the demo runs in about a
minute on a laptop; `--generator vllm` adds LLM-written questions from the bundled Qwen model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

DEMO_QUERIES = (
    "When does the else clause of a for loop run?",
    "How do I make an object usable in a with statement?",
    "What happens if an exception is raised inside a finally clause?",
)


def unwrap(text: str) -> str:
    """Join the topics' hard-wrapped lines into paragraphs, so a sentence is not cut at a line end."""
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(p for p in paras if p)


def write_pydoc_corpus(path: Path) -> int:
    """One JSONL document per help topic; returns the number written."""
    from pydoc_data.topics import topics

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for name in sorted(topics):
            text = unwrap(topics[name])
            title = text.splitlines()[0].strip() if text else name
            f.write(json.dumps({"id": name, "title": title, "text": text}) + "\n")
    return len(topics)


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        workdir: str = typer.Option("runs/demo", "--workdir", help="where the corpus and index go"),
        representation: str = typer.Option("atom-sentence", "--representation", "-r"),
        generator: str = typer.Option("none", "--generator", "-g", help="none|vllm|openai"),
        shards: int = typer.Option(2, "--shards"),
        k: int = typer.Option(3, "--k"),
        query: Optional[list[str]] = typer.Option(None, "--query", "-q", help="ask your own question(s)"),
    ):
        """Index the Python language reference (ships with Python) and answer questions from it."""
        from qrag_ray.config import build_index_config
        from qrag_ray.pipeline import build_index
        from qrag_ray.search.engine import SearchEngine

        console = Console(stderr=True)
        out = Console()
        wd = Path(workdir)
        corpus = wd / "corpus.jsonl"
        n = write_pydoc_corpus(corpus)
        console.print(f"corpus: {n} Python language reference topics -> {corpus}")
        cfg = build_index_config(
            None, input=str(corpus), format="jsonl", output=str(wd / "index"), representation=representation,
            shards=shards, overwrite=True,
            **{"generator.backend": generator, "chunker.method": "token", "chunker.size": 200,
               "chunker.overlap": 20})
        report = build_index(cfg, console=console)
        counts = report.manifest.get("counts", {})
        console.print(f"index: {counts.get('chunks')} chunks, {counts.get('vectors')} vectors, "
                      f"{cfg.shards} shards -> {cfg.output}")
        engine = SearchEngine(cfg.output)
        for q in query or DEMO_QUERIES:
            res = engine.search([q], k=k)[0]
            out.rule(f"[bold]{q}")
            for i, r in enumerate(res, 1):
                best = r["matched"][0] if r["matched"] else {}
                out.print(f"[bold]{i}. {r['doc_id']}[/]  score {r['score']:.3f}  chunk {r['chunk_id']}")
                out.print(f"   matched {best.get('kind', '?')}: [italic]{_clip(best.get('text', ''), 160)}[/]")
        out.print(f"\nsearch it yourself: qrag search --index {cfg.output} --k 5 \"your question\"")


def _clip(s: str, n: int) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"
