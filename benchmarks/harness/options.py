"""The benchmarks' command line: one parser per script from its docstring, the options every script shares
(--out, --tiny, --queries, --rounds, --concurrency, --baseline-ref, --workdir), a script's full and tiny
sizes, and the command line a report records."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "runs"


def int_list(text: str) -> list[int]:
    """`1,8,32` -> [1, 8, 32] (argparse type of a comma list)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None


def parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser: the docstring's first paragraph is the description, the rest the epilog."""
    head, _, rest = doc.strip().partition("\n\n")
    return argparse.ArgumentParser(prog=f"python -m benchmarks.{Path(sys.argv[0]).stem}", description=head, epilog=rest,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_common(parser: argparse.ArgumentParser, name: str, *, queries: bool = False, rounds: bool = False,
               concurrency: bool = False, baseline: bool = False, workdir: bool = False) -> None:
    """The shared options a script takes. A size option left unset takes the script's full or tiny size
    (`sized`): --tiny is a smoke-sized run of the same code path, well under a minute where the script
    starts no LLM and no cluster."""
    parser.add_argument("--out", default=str(RUNS / f"{name}.json"), help="the JSON report (default: %(default)s)")
    parser.add_argument("--tiny", action="store_true", help="smoke size: a small index, few queries, one round")
    if queries:
        parser.add_argument("--queries", type=int, help="queries (requests) per block")
    if rounds:
        parser.add_argument("--rounds", type=int, help="times each block runs, the apps alternating")
    if concurrency:
        parser.add_argument("--concurrency", type=int_list, help="comma list of concurrencies, e.g. 1,8,32")
    if baseline:
        parser.add_argument("--baseline-ref", metavar="REF",
                        help="also run the code of git ref REF (checked out into a temporary worktree) side by "
                             "side with this tree's, in the same run; no default")
    if workdir:
        parser.add_argument("--workdir", default=str(RUNS / name),
                        help="where indexes and models are built once and reused (default: %(default)s)")


def sized(args: argparse.Namespace, full: dict, tiny: dict) -> argparse.Namespace:
    """Every option of `full` left unset (None) takes its full size, or with --tiny its tiny size."""
    sizes = tiny if getattr(args, "tiny", False) else full
    for name, value in full.items():
        if getattr(args, name, None) is None:
            setattr(args, name, sizes.get(name, value))
    return args


def command() -> str:
    """This run's command line, as `python -m benchmarks.<script> ...` (recorded in every report)."""
    return " ".join(["python", "-m", f"benchmarks.{Path(sys.argv[0]).stem}", *sys.argv[1:]])
