"""`qrag compact`: fold a served index root's written documents (deltas and deletions) into a new version."""

from __future__ import annotations

import json

import typer

from qrag_ray.cli.app import err


def register(app: typer.Typer) -> None:
    @app.command("compact")
    def compact_cmd(
        root: str = typer.Argument(..., help="the versioned index root a tenant writes to"),
        address: str | None = typer.Option(None, "--address", help="Ray cluster address to build on (default: "
                                                                   "$RAY_ADDRESS, else a local Ray)"),
        keep: int = typer.Option(2, "--keep", help="published versions to keep (>= 2)"),
    ):
        """Build a new index version from the root's current one plus every write applied so far (the
        incremental build: only new documents are embedded), publish it under load, and reset the writes
        onto it. Writes go on meanwhile; the Writer also compacts by size or age."""
        from qrag_ray.errors import QragError
        from qrag_ray.index.compaction import compact
        from qrag_ray.index.versions import is_versioned_root

        if not is_versioned_root(root):
            raise QragError(f"{root} is not a versioned index root (writes and compaction need one: qrag publish "
                            "IDX --root ROOT)")
        summary = compact(root, address=address, keep=keep, console=err)
        if summary["compacted"]:
            err.print(f"{root}: CURRENT -> {summary['index_version']} (folded {summary['deltas_folded']} deltas up to "
                      f"write {summary['generation']}; {summary['vectors_embedded']} vectors embedded, "
                      f"{summary['vectors_reused']} reused)")
        else:
            err.print(f"{root}: nothing to compact")
        print(json.dumps(summary))
