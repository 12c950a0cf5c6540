"""`qrag tenants`: add, rotate, remove and list the tenants of a tenants file, and set its admin key."""

from __future__ import annotations

from pathlib import Path

import typer

from qrag_ray.cli.app import err
from qrag_ray.errors import QragError


def register(app: typer.Typer) -> None:
    tenants_app = typer.Typer(help="Manage the tenants file (API keys are stored as sha256 only).",
                              no_args_is_help=True)
    app.add_typer(tenants_app, name="tenants")

    @tenants_app.command("add")
    def tenants_add(
        file: str = typer.Option(..., "--file", help="tenants YAML (created if missing)"),
        name: str = typer.Option(..., "--name", help="tenant name (also the index name in requests)"),
        index: str = typer.Option(..., "--index", help="the tenant's index directory or versioned root"),
        rps: float | None = typer.Option(None, "--rps", help="rate limit: requests per second per Router replica"),
        burst: int | None = typer.Option(None, "--burst", help="rate limit burst (default 2 x rps)"),
        scope: str = typer.Option("read", "--scope", help="read (search, fetch) or write (read + add, replace and "
                                                          "delete documents through the API)"),
    ):
        """Add a tenant (or replace its entry) and print its new API key once."""
        from pydantic import ValidationError

        from qrag_ray.config.index import format_validation_error
        from qrag_ray.index.versions import resolve_index
        from qrag_ray.serving.tenants import add_tenant

        resolve_index(index)
        if burst is not None and rps is None:
            raise QragError("--burst needs --rps")
        _check_scope(scope)
        limit = None if rps is None else {"rps": rps, "burst": burst if burst is not None else max(1, int(2 * rps))}
        try:
            key = add_tenant(file, name, index, rate_limit=limit, scope=scope)
        except ValidationError as error:
            raise QragError(format_validation_error(error)) from None
        _print_key(f"tenant '{name}' -> {Path(index).resolve()} in {file}; its {scope} API key (shown once, stored as "
                   "sha256):", key)

    @tenants_app.command("rotate")
    def tenants_rotate(
        file: str = typer.Option(..., "--file", help="tenants YAML"),
        name: str = typer.Option(..., "--name", help="tenant whose key to replace"),
        scope: str | None = typer.Option(None, "--scope", help="the new key's scope: read or write (default: the "
                                                               "old key's)"),
    ):
        """Give a tenant a new API key (printed once); running servers refuse the old one within seconds."""
        from qrag_ray.serving.tenants import rotate_key

        if scope is not None:
            _check_scope(scope)
        _print_key(f"tenant '{name}': new API key (shown once; the old key stops working at the servers' next reload):",
                   rotate_key(file, name, scope))

    @tenants_app.command("remove")
    def tenants_remove(
        file: str = typer.Option(..., "--file", help="tenants YAML"),
        name: str = typer.Option(..., "--name", help="tenant to remove"),
    ):
        """Remove a tenant; running servers refuse its key within seconds. Its index is left on disk."""
        from qrag_ray.serving.tenants import remove_tenant

        remove_tenant(file, name)
        err.print(f"tenant '{name}' removed from {file}")

    @tenants_app.command("admin-key")
    def tenants_admin_key(file: str = typer.Option(..., "--file", help="tenants YAML")):
        """Set (or replace) the admin key of GET /v1/admin/status and print it once."""
        from qrag_ray.serving.tenants import set_admin_key

        _print_key(f"admin key for {file} (shown once, stored as sha256):", set_admin_key(file))

    @tenants_app.command("list")
    def tenants_list(file: str = typer.Option(..., "--file", help="tenants YAML")):
        """List tenants and their indexes (never keys)."""
        from qrag_ray.serving.tenants import load_tenants

        for tenant in load_tenants(file).by_name.values():
            lim = f"\t{tenant.rate_limit.rps:g} rps, burst {tenant.rate_limit.burst}" if tenant.rate_limit else ""
            print(f"{tenant.name}\t{tenant.index}\t{tenant.scope}{lim}")


def _check_scope(scope: str) -> None:
    from qrag_ray.serving.tenants import SCOPES

    if scope not in SCOPES:
        raise QragError(f"--scope must be one of {', '.join(SCOPES)}, not {scope!r}")


def _print_key(note: str, key: str) -> None:
    """A new secret: what it is on stderr, the key alone on stdout (so a script can capture it)."""
    err.print(note)
    print(key)
