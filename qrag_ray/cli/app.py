"""The `qrag` app and its entry point: parse flags, call library functions, print results. A user mistake
ends with one line on stderr and exit code 2, never a traceback, also when raised inside a Ray task."""

from __future__ import annotations

import functools
import importlib
import importlib.util

import typer
from rich.console import Console
from rich.markup import escape

from qrag_ray.errors import find_user_error
from qrag_ray.runtime.logs import filter_native_stderr, set_verbosity

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Question-based retrieval indexed with Ray Data and served with Ray Serve.")
err = Console(stderr=True)


@app.callback()
def _global_options(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True,
                                help="show third-party logs and warnings (Ray, Ray Data, transformers, vLLM); "
                                     "-vv debug"),
):
    set_verbosity(verbose)
    filter_native_stderr()


COMMAND_MODULES = ("index_cmd", "search_cmd", "show_cmd", "info_cmd", "presets_cmd", "models_cmd", "serve_cmd",
                   "query_cmd", "docs_cmd", "mcp_cmd", "tenants_cmd", "publish_cmd", "compact_cmd", "eval_cmd",
                   "demo_cmd",
                   "cache_cmd")


@functools.cache
def register_commands() -> None:
    """Each command module registers itself, in help order; once per process (`main` runs many times)."""
    for name in COMMAND_MODULES:
        importlib.import_module(f"qrag_ray.cli.{name}").register(app)


def _error_line(msg: str) -> None:
    err.print(f"[red]error:[/] {escape(' '.join(msg.split()))}", highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    # click itself and the copy recent typer vendors as `typer._click`: usage errors come from the one
    # typer runs on, and catching only the other lets a missing option escape as a traceback
    mods = [importlib.import_module(n) for n in ("typer._click", "click") if importlib.util.find_spec(n)]
    aborts = tuple(a for m in [typer, *(c.exceptions for c in mods)] if (a := getattr(m, "Abort", None)))
    register_commands()
    try:
        typer.main.get_command(app).main(args=argv, prog_name="qrag", standalone_mode=False)
        return 0
    except (*aborts, KeyboardInterrupt) as error:
        err.print("interrupted" if isinstance(error, KeyboardInterrupt) else "aborted")
        return 130
    except tuple(m.exceptions.ClickException for m in mods) as error:
        # one line ('error: Missing option ... (see qrag index --help)'); a bare `qrag` or a group without
        # its command still gets the help it asks for
        if type(error).__name__ == "NoArgsIsHelpError":
            error.show()
        else:
            ctx = getattr(error, "ctx", None)
            _error_line(error.format_message() + (f" (see {ctx.command_path} --help)" if ctx is not None else ""))
        return error.exit_code or 2
    except BaseException as error:  # map user errors to one line, keep bugs loud
        user_error = find_user_error(error)
        if user_error is None:
            raise
        _error_line(str(user_error))
        return user_error.exit_code
