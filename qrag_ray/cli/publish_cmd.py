"""`qrag publish`: publish an index as the next version under a versioned root, or roll the root back."""

from __future__ import annotations

import typer

from qrag_ray.cli.app import err


def register(app: typer.Typer) -> None:
    @app.command("publish")
    def publish_cmd(
        index: str = typer.Argument(..., help="a built index directory (qrag index --output)"),
        root: str = typer.Option(..., "--root", help="the versioned root a tenant's `index:` names"),
        keep: int = typer.Option(2, "--keep", help="published versions to keep (>= 2)"),
        rollback: str | None = typer.Option(None, "--rollback", help="instead: point the root back at this version"),
    ):
        """Publish an index as the next version under a root: checked, copied, then CURRENT moves.
        Servers load it on every shard before sending it traffic."""
        from qrag_ray.index import versions

        if rollback:
            versions.rollback(root, rollback)
            err.print(f"{root}: CURRENT -> {rollback}")
            return
        info = versions.publish_version(root, index, keep=keep)
        err.print(
            f"{root}: CURRENT -> {info['index_version']} ({info['num_shards']} shards, {info['vectors']} vectors; "
            f"was {info['previous'] or 'nothing'}; removed {', '.join(info['removed']) or 'none'})")
        print(info["index_version"])
