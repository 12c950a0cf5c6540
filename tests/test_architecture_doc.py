"""The docs against the code: docs/ARCHITECTURE.md's package layout names every module of qrag_ray/
and nothing else, and its manifest block lists exactly the fields of the typed Manifest (nested records
included); in README.md and every page of docs/ (not the dated logs of docs/research/) every `.py` path
exists, every dotted `qrag_ray.` name resolves and every `qrag` command written in code, with its flags,
is one the CLI has; each row of "Where to change what" names things its files define. So the pages cannot
drift from the code unnoticed. File reading and imports; no Ray."""

from __future__ import annotations

import importlib
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from qrag_ray.index.format import Manifest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "qrag_ray"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# where a bare or package-relative path may live (SERVING.md's table names serving/ modules bare)
PATH_BASES = (PKG, PKG / "serving", ROOT, ROOT / "benchmarks")
NOT_LISTED = {"__init__.py", "__main__.py"}  # package markers: listed only when they hold a job


def code_block(text: str, heading: str) -> list[str]:
    """The lines of the first fenced block after the first `## ` heading or paragraph starting with
    `heading`."""
    start = text.find(heading)
    assert start >= 0, f"docs/ARCHITECTURE.md has no {heading!r}"
    match = re.search(r"^```[^\n]*\n(.*?)^```", text[start:], re.S | re.M)
    assert match, f"no code block after {heading!r}"
    return match.group(1).splitlines()


def layout_modules(text: str) -> list[str]:
    """Module paths of the layout block, relative to qrag_ray/: the first word of each line that is
    not indented (an indented line continues the one above; `#` lines are group headings)."""
    lines = code_block(text, "## Package layout")
    return [ln.split()[0] for ln in lines if ln.strip() and not ln[0].isspace() and not ln.startswith("#")]


def code_modules() -> set[str]:
    return {str(f.relative_to(PKG)) for f in PKG.rglob("*.py") if f.name not in NOT_LISTED}


def py_paths(text: str) -> set[str]:
    """Every `something.py` path the page mentions (`cli/<command>_cmd.py` is a pattern, not a path)."""
    return set(re.findall(r"(?<![\w/<>.-])((?:[\w-]+/)*\w+\.py)\b", text))


# `name?` marks an optional field; `name {a, b?}` and `name [{a, b?}]` (one space) list a record's
# fields; after two spaces comes the description
_FIELD = re.compile(r"^(\w+)(\??)(?: \[?\{([^}]*)\}\]?)?(?:\s|$)")


def doc_fields(text: str) -> dict[str, tuple[bool, dict[str, bool] | None]]:
    """{field: (optional, {sub-field: optional} or None)} from the manifest block."""
    out = {}
    for line in code_block(text, "Manifest fields"):
        if not line.strip() or line[0].isspace():
            continue
        match = _FIELD.match(line)
        assert match, f"unparsable manifest line {line!r}"
        name, opt, inner = match.groups()
        assert name not in out, f"manifest field {name} listed twice"
        subs = None
        if inner is not None:
            subs = {s.strip().rstrip("?"): s.strip().endswith("?") for s in inner.split(",") if s.strip()}
        out[name] = (opt == "?", subs)
    return out


def _record(annotation) -> type[BaseModel] | None:
    """The record model inside an annotation (`EmbedderInfo`, `FaissInfo | None`, `list[ShardEntry]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _record(arg)
        if found is not None:
            return found
    return None


def model_fields(model: type[BaseModel]) -> dict[str, tuple[bool, dict[str, bool] | None]]:
    """The declared fields a manifest.json holds (a field excluded from dumps is never written)."""
    out = {}
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        rec = _record(field.annotation)
        subs = None if rec is None else {n: not g.is_required() for n, g in rec.model_fields.items() if not g.exclude}
        out[name] = (not field.is_required(), subs)
    return out


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_layout_lists_every_module_once(doc):
    listed = layout_modules(doc)
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({m for m in listed if listed.count(m) > 1})}"
    missing_in_code = sorted(m for m in listed if not (PKG / m).is_file())
    missing_in_doc = sorted(code_modules() - set(listed))
    assert missing_in_code == [], f"docs/ARCHITECTURE.md lists modules that are not in qrag_ray/: {missing_in_code}"
    assert missing_in_doc == [], f"modules of qrag_ray/ that docs/ARCHITECTURE.md does not list: {missing_in_doc}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_the_page_names_exists(page):
    gone = sorted(p for p in py_paths(page.read_text(encoding="utf-8"))
                  if not any((base / p).is_file() for base in PATH_BASES))
    assert gone == [], f"{page.name} names files that do not exist: {gone}"


def _resolves(dotted: str) -> bool:
    """`qrag_ray.a.b.name`: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_dotted_name_the_page_names_resolves(page):
    names = set(re.findall(r"\bqrag_ray(?:\.\w+)+", page.read_text(encoding="utf-8")))
    gone = sorted(n for n in names if not _resolves(n))
    assert gone == [], f"{page.name} names modules or attributes that do not exist: {gone}"


def _defined_in(name: str, files: list[Path]) -> bool:
    """`Name`, `Name.attr` or `name`: a class, function, constant or attribute the files define."""
    last = name.split(".")[-1]
    pat = re.compile(rf"^\s*(?:(?:async\s+)?def|class)\s+{re.escape(last)}\b|^\s*(?:self\.)?{re.escape(last)}\s*[:=]",
                     re.M)
    return any(pat.search(f.read_text()) for f in files)


def test_where_to_change_what_names_what_its_files_define(doc):
    table = doc[doc.index("## Where to change what"):]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| to add")]
    assert len(rows) >= 10
    for row in rows:
        change = row.split("|")[2]
        files = [PKG / p for p in py_paths(change) if (PKG / p).is_file()]
        files += [f for pat in re.findall(r"`([\w/]*<\w+>[\w]*\.py)`", change)  # `dir/<name>.py`: any module there
                  for f in PKG.glob(re.sub(r"<\w+>", "*", pat))]
        names = [n for n in re.findall(r"`([A-Za-z_][\w.]*)`", change) if not n.endswith(".py")]
        assert files, f"row names no file of qrag_ray/: {row}"
        missing = [n for n in names if not _defined_in(n, files)]
        assert missing == [], f"{missing} not defined in {[str(f.relative_to(PKG)) for f in files]}: {row}"


def test_manifest_fields_are_the_typed_manifest(doc):
    listed = doc_fields(doc)
    declared = model_fields(Manifest)
    extra = sorted(set(listed) - set(declared))
    missing = sorted(set(declared) - set(listed))
    assert extra == [], f"docs/ARCHITECTURE.md lists manifest fields that Manifest does not declare: {extra}"
    assert missing == [], f"Manifest declares fields that docs/ARCHITECTURE.md does not list: {missing}"
    for name, (optional, subs) in declared.items():
        code = (optional, subs)
        assert listed[name] == code, f"manifest field {name}: doc says {listed[name]}, code {code}"


def test_the_parsers_see_a_change():
    """A dropped layout line or manifest field, or a path that is gone, is found (not parsed away)."""
    text = DOC.read_text(encoding="utf-8")
    first = layout_modules(text)[0]
    cut = "\n".join(ln for ln in text.splitlines() if not ln.startswith(first + " "))
    assert first not in layout_modules(cut)
    assert "files" in doc_fields(text)
    assert "files" not in doc_fields(text.replace("\nfiles  ", "\nfilez  "))
    assert "embedder" in doc_fields(text) and doc_fields(text)["embedder"][1] == {"model": False, "dim": False,
                                                                                   "normalize": True}
    assert py_paths("see `serving/nowhere.py` and pipeline.py, not cli/<command>_cmd.py") == {"serving/nowhere.py",
                                                                                            "pipeline.py"}


def code_spans(text: str) -> list[str]:
    """The page's code: each line of a fenced block (a line ending in `\\` joined to the next) and each
    inline `span`."""
    out: list[str] = []
    for i, part in enumerate(re.split(r"^```[^\n]*$", text, flags=re.M)):
        if i % 2:
            out += re.sub(r"\\\n\s*", " ", part).splitlines()
        else:
            out += re.findall(r"`([^`\n]+)`", part)
    return out


# `qrag [-v] <command> [<subcommand>] ...`: the words up to a comment, a pipe or a redirect are its arguments
# (`kubectl -n qrag ...` names a namespace)
_QRAG = re.compile(r"(?:^|(?<!-n)[\s(;&$])qrag((?:\s+-v+)*)\s+([a-z][\w-]*)([^#|>]*)")


def qrag_commands(text: str) -> list[tuple[str, list[str]]]:
    """(`command [subcommand]`, [--flag, ...]) for every qrag command line the page's code holds."""
    found = []
    for span in code_spans(text):
        for match in _QRAG.finditer(span):
            words = match.group(3).split()
            sub = [words[0]] if words and re.fullmatch(r"[a-z][\w-]*", words[0]) else []
            flags = [w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w)]
            found.append((" ".join([match.group(2), *sub]), flags))
    return found


@pytest.fixture(scope="module")
def cli():
    """{command: its option names}, a group's subcommands as `group sub`."""
    import typer

    from qrag_ray.cli.app import app, register_commands

    register_commands()
    out = {}
    for name, cmd in typer.main.get_command(app).commands.items():
        for sub, command in [(name, cmd), *((f"{name} {s}", c) for s, c in getattr(cmd, "commands", {}).items())]:
            out[sub] = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    return out


def _unknown(found: list[tuple[str, list[str]]], cli: dict[str, set[str]]) -> list[str]:
    bad = []
    for words, flags in found:
        cmd = words if words in cli else words.split()[0]
        if cmd not in cli:
            bad.append(f"qrag {words}")
        bad += [f"qrag {cmd} {f}" for f in flags if f not in cli.get(cmd, ())]
    return sorted(set(bad))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_qrag_command_the_page_shows_exists(page, cli):
    bad = _unknown(qrag_commands(page.read_text(encoding="utf-8")), cli)
    assert bad == [], f"{page.name} shows qrag commands or flags the CLI does not have: {bad}"


def test_the_command_parser_sees_a_change(cli):
    text = ("```bash\nqrag index --input x \\\n  --shards 4   # --not-a-flag\nkubectl -n qrag get pods\n```\n"
            "and `qrag tenants add --name a`")
    assert qrag_commands(text) == [("index", ["--input", "--shards"]), ("tenants add", ["--name"])]
    assert _unknown(qrag_commands(text), cli) == []
    assert _unknown(qrag_commands("`qrag index --shardz 4` and `qrag indx`"), cli) == ["qrag index --shardz",
                                                                                       "qrag indx"]
