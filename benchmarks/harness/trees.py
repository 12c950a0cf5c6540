"""Code trees side by side: this checkout and a baseline git ref checked out into a temporary worktree, each
run from its own folder on PYTHONPATH (a Serve app's runtime_env, or a subprocess's environment). A tree
is used only through its public entry points (the Serve builder, `build_index`, `SearchEngine`), so an
older tree serves beside this one as it is, without a shim.

Ray puts the driver's working directory on every worker's import path ahead of the app's PYTHONPATH, so a
script that serves two trees changes into its work folder before Ray starts (`leave_the_tree`): run from
the repository root as `python -m benchmarks.<script>`, nothing else of this tree reaches the workers."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness.options import ROOT

# every process of a benchmark: no hub downloads, no tokenizer threads beside the replicas'
ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# the Serve builder's module, newest first: the module's older name still serves an older tree
BUILDERS = ("qrag_ray.serving.application:build_app", "qrag_ray.serving.app:build_app")


class BaselineError(Exception):
    """A --baseline-ref that is not a commit of this repository (the script prints it and exits 2)."""


def baseline_tree(ref: str) -> Path:
    """`ref` checked out (detached) into a new temporary folder; the worktree is removed when the process
    ends."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise BaselineError(f"--baseline-ref {ref}: not a commit of this repository")
    folder = Path(tempfile.mkdtemp(prefix="qrag-baseline-"))
    tree = folder / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), found.stdout.strip()],
                   check=True, capture_output=True)
    atexit.register(_remove_worktree, tree)
    return tree


def _remove_worktree(tree: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    shutil.rmtree(tree.parent, ignore_errors=True)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


def trees(baseline_ref: str | None) -> dict[str, Path]:
    """{"base": the baseline's worktree (with a ref), "new": this checkout}: the apps a script serves."""
    if not baseline_ref:
        return {"new": ROOT}
    return {"base": baseline_tree(baseline_ref), "new": ROOT}


def index_builder(apps: dict[str, Path]) -> Path:
    """The tree that builds an index both apps serve: a newer qrag reads the formats an older one writes, not
    the other way round, so the baseline when it is an ancestor of this checkout, else this tree."""
    base = apps.get("base")
    if base is None:
        return ROOT
    commit = subprocess.run(["git", "-C", str(base), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    older = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", commit, "HEAD"]).returncode == 0
    return base if older else ROOT


def builder(tree: Path) -> str:
    """The import path of `tree`'s Serve builder (the first of BUILDERS whose module the tree has)."""
    for path in BUILDERS:
        module = path.split(":")[0]
        if (tree / (module.replace(".", "/") + ".py")).is_file():
            return path
    raise BaselineError(f"{tree} has none of the Serve builders {BUILDERS}")


def tree_env(tree: Path, extra_path: tuple[Path, ...] = ()) -> dict[str, str]:
    """The environment variables of a process that runs `tree`'s qrag_ray (its folder first on PYTHONPATH)."""
    return {**ENV, "PYTHONPATH": os.pathsep.join(str(p) for p in (tree, *extra_path))}


def runtime_env(tree: Path) -> dict:
    """A Serve app's runtime_env for `tree` (its replicas import qrag_ray from it)."""
    return {"env_vars": tree_env(tree)}


def run_python(tree: Path, code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -c code args` with `tree`'s qrag_ray, in `cwd` (outside the trees); fails on a non-zero exit."""
    env = {**os.environ, **tree_env(tree)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=str(cwd), env=env, check=True)


def leave_the_tree(workdir: Path) -> None:
    """Change into `workdir` before Ray starts (see the module's docstring); it is made if missing."""
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)


def check_trees(apps: dict[str, Path]) -> None:
    """Each app's runtime_env imports qrag_ray from its own tree: a Ray task with that runtime_env says
    where it found the package (a wrong tree fails the run, not its figures)."""
    import ray

    @ray.remote(num_cpus=0)
    def qrag_ray_file() -> str:
        """Where this worker imports qrag_ray from."""
        import qrag_ray

        return qrag_ray.__file__

    for name, tree in apps.items():
        found = Path(ray.get(qrag_ray_file.options(runtime_env=runtime_env(tree)).remote()))
        if found.resolve() != (tree / "qrag_ray" / "__init__.py").resolve():
            raise RuntimeError(f"app {name} with PYTHONPATH={tree} imports qrag_ray from {found}")
