"""The `qrag` app and its entry point. Thin: parse flags, call library functions, print results.

User mistakes end with one line on stderr and exit code 2, never a traceback; that includes errors
raised inside Ray tasks, which arrive wrapped and are unwrapped here.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from qrag_ray.errors import find_user_error

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Question-based retrieval indexed with Ray Data and served with Ray Serve.")
err = Console(stderr=True)


@app.callback()
def _global_options(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True,
                                help="show third-party logs and warnings (Ray, Ray Data, transformers, vLLM); -vv debug"),
):
    """Question-based retrieval indexed with Ray Data and served with Ray Serve."""
    from qrag_ray.logs import filter_native_stderr, set_verbosity

    set_verbosity(verbose)
    filter_native_stderr()


COMMAND_MODULES = ("index_cmd", "search_cmd", "presets_cmd", "models_cmd", "serve_cmd", "eval_cmd", "demo_cmd", "cache_cmd")
_registered = False


def register_commands() -> None:
    """Each command lives in its own module of this package and registers itself (in help order).
    Idempotent: tests and the deploy validator call `main` many times in one process."""
    import importlib

    global _registered
    if _registered:
        return
    _registered = True
    for name in COMMAND_MODULES:
        mod = f"qrag_ray.cli.{name}"
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        m.register(app)


def _click_modules() -> list:
    """click itself and the copy recent typer vendors as `typer._click`: usage errors come from the
    one typer runs on, and catching only the other lets a missing option escape as a traceback."""
    import importlib

    mods = []
    for name in ("typer._click", "click"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            pass
    return mods


def _usage_error(e) -> int:
    """A click usage error as one line ('error: Missing option ... (see qrag index --help)'); a bare
    `qrag` or a group without its command still gets the help it asks for."""
    ctx = getattr(e, "ctx", None)
    if type(e).__name__ == "NoArgsIsHelpError":
        e.show()
        return e.exit_code or 2
    where = f" (see {ctx.command_path} --help)" if ctx is not None and getattr(ctx, "command_path", None) else ""
    msg = " ".join(e.format_message().split())
    err.print(f"[red]error:[/] {escape(msg)}{escape(where)}", highlight=False, markup=True, soft_wrap=True)
    return e.exit_code or 2


def main(argv: list[str] | None = None) -> int:
    mods = _click_modules()
    aborts = tuple(a for m in mods for a in [getattr(m.exceptions, "Abort", None)] if a is not None)
    aborts += (typer.Abort,) if hasattr(typer, "Abort") else ()
    usage = tuple(m.exceptions.ClickException for m in mods)

    register_commands()
    cmd = typer.main.get_command(app)
    try:
        cmd.main(args=argv, prog_name="qrag", standalone_mode=False)
        return 0
    except aborts:
        err.print("aborted")
        return 130
    except usage as e:
        return _usage_error(e)
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BaseException as e:  # noqa: BLE001 - map user errors to one line, keep bugs loud
        ue = find_user_error(e)
        if ue is None:
            raise
        msg = " ".join(str(ue).split())  # one line whatever the message holds
        err.print(f"[red]error:[/] {escape(msg)}", highlight=False, markup=True, soft_wrap=True)
        return ue.exit_code


if __name__ == "__main__":
    sys.exit(main())
