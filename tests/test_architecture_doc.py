"""docs/ARCHITECTURE.md against the code: its package layout names every module of qrag_ray/ and
nothing else, every `.py` path it mentions exists, and its manifest block lists exactly the fields of
the typed Manifest (nested records included), so the page cannot drift from the code unnoticed.
Pure file reading; milliseconds."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from qrag_ray.index.format import Manifest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "qrag_ray"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
NOT_LISTED = {"__init__.py", "__main__.py"}  # package markers: listed only when they hold a job


def code_block(text: str, heading: str) -> list[str]:
    """The lines of the first fenced block after the first `## ` heading or paragraph starting with
    `heading`."""
    start = text.find(heading)
    assert start >= 0, f"docs/ARCHITECTURE.md has no {heading!r}"
    m = re.search(r"^```[^\n]*\n(.*?)^```", text[start:], re.S | re.M)
    assert m, f"no code block after {heading!r}"
    return m.group(1).splitlines()


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
    for ln in code_block(text, "Manifest fields"):
        if not ln.strip() or ln[0].isspace():
            continue
        m = _FIELD.match(ln)
        assert m, f"unparsable manifest line {ln!r}"
        name, opt, inner = m.groups()
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
    for name, f in model.model_fields.items():
        if f.exclude:
            continue
        rec = _record(f.annotation)
        subs = None if rec is None else {n: not g.is_required() for n, g in rec.model_fields.items() if not g.exclude}
        out[name] = (not f.is_required(), subs)
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


def test_every_path_the_page_names_exists(doc):
    gone = sorted(p for p in py_paths(doc) if not any((base / p).is_file() for base in (PKG, ROOT)))
    assert gone == [], f"docs/ARCHITECTURE.md names files that do not exist: {gone}"


def test_manifest_fields_are_the_typed_manifest(doc):
    listed, declared = doc_fields(doc), model_fields(Manifest)
    extra, missing = sorted(set(listed) - set(declared)), sorted(set(declared) - set(listed))
    assert extra == [], f"docs/ARCHITECTURE.md lists manifest fields that Manifest does not declare: {extra}"
    assert missing == [], f"Manifest declares fields that docs/ARCHITECTURE.md does not list: {missing}"
    for name, (optional, subs) in declared.items():
        assert listed[name] == (optional, subs), f"manifest field {name}: doc says {listed[name]}, code {(optional, subs)}"


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
