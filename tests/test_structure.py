"""The package's shape: its imports keep the contracts of pyproject.toml's [tool.importlinter] (the
dependency direction of docs/ARCHITECTURE.md, no import cycle, nothing outside the CLI imports the
CLI), no module grows past 400 lines (a module that big holds more than one job: split it by job), and
the folders are the layers: the package's top level holds only its entry and the modules whose job is the
whole package (docs/ARCHITECTURE.md says which). Seconds; no Ray."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "qrag_ray"
MAX_LINES = 400
# the package's entry and the one module whose job is the whole package (its user-error type)
TOP_LEVEL = {"__init__.py", "errors.py"}


def _modules() -> dict[str, Path]:
    mods = {}
    for file in PKG.rglob("*.py"):
        parts = list(file.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = file
    return mods


MODS = _modules()


def lint_imports(package_root: Path) -> subprocess.CompletedProcess:
    """import-linter over the `qrag_ray` under `package_root`, with pyproject.toml's contracts."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=package_root,
                          env={**os.environ, "PYTHONPATH": str(package_root)}, timeout=120)


def test_import_contracts_hold():
    """pyproject.toml's [tool.importlinter]: the layers of docs/ARCHITECTURE.md, io and models free of
    the config, no import cycle in any package, nothing outside the CLI importing it."""
    report = lint_imports(ROOT)
    assert report.returncode == 0, report.stdout + report.stderr


def test_import_contracts_catch_what_they_forbid(tmp_path):
    """Each contract on a copy of the package with one import that breaks it: none holds vacuously."""
    shutil.copytree(PKG, tmp_path / "qrag_ray", ignore=shutil.ignore_patterns("__pycache__"))
    breaks = (("config/roles", "qrag_ray.io.readers"),  # layers
              ("config/roles", "qrag_ray.config.presets"),  # config-layers
              ("runtime/progress", "qrag_ray.runtime.progress_ray"),  # runtime-layers
              ("search/engine", "qrag_ray.index.build"),  # build-driven-from-above
              ("models/bundled", "qrag_ray.config.search_policy"),  # io-models-take-values
              ("text/sentences", "qrag_ray.text.chunking"),  # no-cycles
              ("runtime/ports", "qrag_ray.cli.app"))  # cli-on-top
    for mod, imp in breaks:
        with open(tmp_path / "qrag_ray" / f"{mod}.py", "a") as file:
            file.write(f"import {imp}\n")
    report = lint_imports(tmp_path)
    assert report.returncode != 0 and "Contracts: 0 kept, 7 broken." in report.stdout, report.stdout + report.stderr


# the package's modules and the rest of the repository's code (not the tests) under one bound: a benchmark or
# a deployment tool is read and changed for years as the package is
SCRIPT_DIRS = ("benchmarks", "cluster", "tools", "clients", "scripts", "eval")
CODE = {**MODS, **{str(f.relative_to(ROOT)): f for top in SCRIPT_DIRS for f in (ROOT / top).rglob("*.py")}}


@pytest.mark.parametrize("mod", sorted(CODE))
def test_no_module_over_the_limit(mod):
    path = CODE[mod]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it by job"


def test_the_folders_are_the_layers():
    """A module at the package's top level belongs to no layer: each lives in the folder of its layer."""
    loose = sorted(f.name for f in PKG.glob("*.py") if f.name not in TOP_LEVEL)
    assert loose == [], f"top-level modules of qrag_ray/ outside any layer's folder: {loose}"


def test_no_issue_numbers_in_code():
    """Comments state the rule and why; where a rule came from (an issue, a run) is the commit's and
    docs/'s to say, so code, tests, scripts and configuration name no issue."""
    import re

    root = PKG.parent
    pattern = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = []
    for top in ("qrag_ray", "tests", "scripts", "benchmarks", "eval", "tools", "cluster", "k8s", "serve_configs"):
        for file in (root / top).rglob("*"):
            if file.suffix in {".py", ".sh", ".yaml", ".yml", ".toml"} and "data" not in file.relative_to(root).parts:
                found += [f"{file.relative_to(root)}:{n}" for n, line in enumerate(file.read_text().splitlines(), 1)
                          if pattern.search(line)]
    assert found == []


# Short names the package may bind: loop indices and counts (i, j, k, n), a list of k values (ks), BM25's
# parameters (k1, b), the index rows' question-number column (qn), the conventional module aliases (np, pa,
# pq, pc) and words of two letters.
SHORT_NAMES_ALLOWED = {"_", "i", "j", "k", "n", "ks", "k1", "b", "qn", "np", "pa", "pq", "pc", "dt", "ok", "id", "ip",
                       "up"}


def _target_names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _target_names(element)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []


def _bound_names(node: ast.AST) -> list[str]:
    """The names `node` binds in a function or module body (a class's fields are the API's names)."""
    if isinstance(node, ast.Assign):
        return [name for target in node.targets for name in _target_names(target)]
    if isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
        return _target_names(node.target)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        arguments = node.args
        every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
        every += [arg for arg in (arguments.vararg, arguments.kwarg) if arg is not None]
        return [arg.arg for arg in every]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [name for item in node.items if item.optional_vars is not None
                for name in _target_names(item.optional_vars)]
    return []


def test_no_short_names_outside_comprehensions():
    """One name per thing, named for what it holds: no name of one or two letters is bound outside a
    comprehension or a lambda (where the expression beside it says what it is), but for the few above."""
    found = []
    for file in sorted(PKG.rglob("*.py")):
        tree = ast.parse(file.read_text())
        inside_expressions = {id(sub) for node in ast.walk(tree)
                              if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                                                   ast.Lambda))
                              for sub in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in inside_expressions:
                continue
            found += [f"{file.relative_to(ROOT)}:{node.lineno}: {name}" for name in _bound_names(node)
                      if len(name) <= 2 and name not in SHORT_NAMES_ALLOWED]
    assert found == []


def test_the_short_names_check_finds_what_it_forbids():
    tree = ast.parse("def f(x):\n    for ab in x:\n        pass\n    return [c for c in ab]\n")
    names = [name for node in ast.walk(tree) for name in _bound_names(node)]
    assert "x" in names and "ab" in names and "c" not in names
