"""The indexes and queries the serving benchmarks search: the Python language reference (it ships with
Python) as the corpus, built by a tree's own `build_index` in a subprocess, and questions about it. With a
baseline, the baseline's tree builds the index: a newer qrag reads the formats an older one writes, not
the other way round, so both apps serve the same files."""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.harness.trees import run_python

# the `qrag demo` corpus's index (every topic), and the tiny run's: the demo's 16 topics, one vector per chunk
DEMO_INDEX = {"representation": "atom-sentence", "shards": 3, "generator.backend": "none", "chunker.method": "token",
              "chunker.size": 200, "chunker.overlap": 20}
TINY_INDEX = {**DEMO_INDEX, "representation": "chunk", "shards": 2}

# run by the tree's own Python in a subprocess: only that tree's public build entry points
BUILD = """import json, sys
from qrag_ray.config.index import build_index_config
from qrag_ray.index.build import build_index
for spec in json.loads(sys.argv[1]):
    build_index(build_index_config(None, **spec))
"""


def write_corpus(path: Path, topics: tuple[str, ...] | list[str] | None = None) -> Path:
    """The language reference as JSONL, one document per help topic (all, or `topics`); kept once written."""
    from qrag_ray.io.pydoc_corpus import write_pydoc_corpus

    if not path.is_file():
        write_pydoc_corpus(path, topics)
    return path


def built(index: Path) -> bool:
    """Whether `index` holds a published index."""
    return (index / "manifest.json").is_file()


def build_indexes(tree: Path, specs: list[dict], cwd: Path) -> None:
    """Build every spec (`build_index_config` overrides, `build.output` among them) whose output has no
    index yet, with `tree`'s qrag_ray, in one subprocess (one local Ray for all of them)."""
    todo = [s for s in specs if not built(Path(s["build.output"]))]
    if todo:
        run_python(tree, BUILD, json.dumps([{**s, "build.overwrite": True} for s in todo]), cwd=cwd)


def demo_index(workdir: Path, tree: Path, tiny: bool, label: str = "") -> Path:
    """The demo corpus's index under `workdir` (tiny: the demo's topics), built once by `tree`; `label` (the
    baseline ref) keeps a baseline's build apart from this tree's."""
    from qrag_ray.io.pydoc_corpus import DEMO_TOPICS

    suffix = re.sub(r"[^\w.-]", "_", label)
    name = "index" + ("-tiny" if tiny else "") + (f"-{suffix}" if label else "")
    out = workdir / name
    corpus = write_corpus(workdir / ("corpus-tiny.jsonl" if tiny else "corpus.jsonl"), DEMO_TOPICS if tiny else None)
    spec = TINY_INDEX if tiny else DEMO_INDEX
    build_indexes(tree, [{"input": str(corpus), "format": "jsonl", **spec, "build.output": str(out)}], workdir)
    return out


def manifest(index: Path) -> dict:
    """The index's manifest.json (its documented fields: num_shards, counts, embedder, ...)."""
    return json.loads((index / "manifest.json").read_text())


def make_queries(n: int) -> list[str]:
    """`n` questions: the demo's three, then one per help topic ("How does X work in Python?"), repeated."""
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import DEMO_QUERIES

    questions = list(DEMO_QUERIES) + [f"How does {name.replace('-', ' ')} work in Python?" for name in sorted(topics)]
    return (questions * (n // len(questions) + 1))[:n]
