"""`qrag prepare-models`: load the bundled embedder and convert the bundled LLM once (both offline)."""

from __future__ import annotations

import typer

from qrag_ray.cli.app import err


def register(app: typer.Typer) -> None:
    @app.command("prepare-models")
    def prepare_models(llm: bool = typer.Option(True, "--llm/--no-llm", help="also prepare the bundled Qwen LLM")):
        """Check the bundled embedder and convert the bundled LLM once (cached)."""
        from qrag_ray.embedding import load_sentence_transformer
        from qrag_ray.models.bundled import resolve_embedder, resolve_llm

        model = load_sentence_transformer("all-MiniLM-L6-v2", device="cpu")
        err.print(f"embedder all-MiniLM-L6-v2: {resolve_embedder('all-MiniLM-L6-v2')} "
                  f"(dim {model.get_sentence_embedding_dimension()})")
        if llm:
            err.print(f"LLM qwen2.5-coder-0.5b-instruct: {resolve_llm('qwen2.5-coder-0.5b-instruct')}")
