"""The package's shape, checked by walking its imports (top-level and function-level, with `ast`): no
import cycle, nothing outside the CLI imports the CLI, no module grows past 400 lines (a module that
big holds more than one job: split it by job), and the package stays within its line budget (a new
feature pays for itself by what it makes redundant; user documentation lives in docs/). Milliseconds;
no Ray."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "qrag_ray"
MAX_LINES = 400
PACKAGE_LINES = 10_400  # the whole package, blank lines and docstrings included


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


MODS = _modules()


def _owner(name: str) -> str | None:
    """The package module `name` refers to (a module, or the module that defines the imported name)."""
    while name and name not in MODS:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, f in MODS.items():
        pkg = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                deps.update(_owner(a.name) for a in node.names if a.name.startswith("qrag_ray"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                if base.startswith("qrag_ray"):
                    deps.update(_owner(f"{base}.{a.name}") for a in node.names)
        deps.discard(None)
        deps.discard(mod)
        graph[mod] = deps  # type: ignore[assignment]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_walker_sees_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_only_the_cli_imports_the_cli():
    bad = {m: sorted(d for d in deps if d.startswith("qrag_ray.cli"))
           for m, deps in import_graph().items() if not m.startswith("qrag_ray.cli")}
    assert {m: d for m, d in bad.items() if d} == {}


@pytest.mark.parametrize("mod", sorted(MODS))
def test_no_module_over_the_limit(mod):
    f = MODS[mod]
    lines = len(f.read_text().splitlines())
    assert lines <= MAX_LINES, f"{f.relative_to(PKG.parent)} has {lines} lines; split it by job"


def test_package_within_its_line_budget():
    lines = sum(len(f.read_text().splitlines()) for f in MODS.values())
    assert lines <= PACKAGE_LINES, f"qrag_ray has {lines} lines, over its budget of {PACKAGE_LINES}"


def test_no_issue_numbers_in_code():
    """Comments state the rule and why; where a rule came from (an issue, a run) is the commit's and
    docs/'s to say, so code, tests, scripts and configuration name no issue."""
    import re

    root = PKG.parent
    pattern = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = []
    for top in ("qrag_ray", "tests", "scripts", "benchmarks", "eval", "tools", "cluster", "k8s", "serve_configs"):
        for f in (root / top).rglob("*"):
            if f.suffix in {".py", ".sh", ".yaml", ".yml", ".toml"} and "data" not in f.relative_to(root).parts:
                found += [f"{f.relative_to(root)}:{n}" for n, line in enumerate(f.read_text().splitlines(), 1)
                          if pattern.search(line)]
    assert found == []
