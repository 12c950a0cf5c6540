"""The `qrag` command line: one module per command (`index_cmd`, `search_cmd`, `serve_cmd`, ...), each
a thin layer over library modules, wired into one Typer app in `app.py`. Nothing outside this package
imports from it (tests/test_structure.py walks the imports)."""

from qrag_ray.cli.app import app, main

__all__ = ["app", "main"]
