"""The `qrag` command line: one thin module per command (`index_cmd`, `serve_cmd`, ...), wired into one
Typer app in `app.py`. Nothing outside this package imports from it (tests/test_structure.py checks)."""

from qrag_ray.cli.app import app, main

__all__ = ["app", "main"]
