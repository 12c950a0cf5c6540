"""`qrag cache`: inspect and compact the question cache (shared by every build that points at it)."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    cache_app = typer.Typer(no_args_is_help=True, help="The question cache (cache_dir, QRAG_QUESTION_CACHE).")

    @cache_app.command("stats")
    def stats(cache_dir: str | None = typer.Option(None, "--cache-dir", help="question cache folder")):
        """Files and rows in the cache."""
        from qrag_ray.generation.cache import QuestionCache

        cache = QuestionCache(cache_dir)
        print(json.dumps({"root": str(cache.root), "files": len(cache.files()), "rows": len(cache)}))

    @cache_app.command("compact")
    def compact(cache_dir: str | None = typer.Option(None, "--cache-dir", help="question cache folder"),
                buckets: int = typer.Option(16, "--buckets", help="output files (keys split by hash)")):
        """Merge the cache's run files into a few files with one row per key."""
        from qrag_ray.errors import QragError
        from qrag_ray.generation.cache import QuestionCache

        if buckets < 1:
            raise QragError(f"--buckets must be at least 1, got {buckets}")
        cache = QuestionCache(cache_dir)
        print(json.dumps({"root": str(cache.root), **cache.compact(buckets)}))

    app.add_typer(cache_app, name="cache")
