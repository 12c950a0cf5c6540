"""Session fixtures for the serving tests: one local Ray, two real 3-shard tenant indexes, one Serve.

Everything is real (Ray, Serve over HTTP, FAISS, MiniLM) except the LLM, which is a tiny
OpenAI-compatible HTTP server (tests/fake_openai_server.py) behind the real `openai` chat backend.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from fake_openai_server import running_fake_openai
from qrag_ray.runtime.ports import free_port
from support.corpus import topic_records, write_jsonl
from support.indexes import shared_build
from support.serving_data import ALPHA_TOPICS, BETA_TOPICS, HYDE_PASSAGE, IDK_MARKER


def build_tenant_index(workdir: Path, name: str, names: list[str], shards: int = 3, metadata: bool = False,
                       **extra) -> Path:
    """`workdir/<name>-index`: an atom-sentence index of the named topics (with `metadata`: each record
    carries the topic's metadata and url), built once per run for its content and copied to each pytest
    process that asks (support/build_cache.py)."""
    corpus = write_jsonl(workdir / f"{name}.jsonl", topic_records(names, metadata))
    out = workdir / f"{name}-index"
    shared_build({"input": str(corpus), "format": "jsonl", "build.output": str(out),
                  "representation": "atom-sentence", "shards": shards, "build.overwrite": True,
                  "generator": {"backend": "none"},
                  "chunker": {"method": "token", "size": 120, "overlap": 20}, **extra})
    return out


def serving_reply(messages: list[dict]) -> str:
    """Canned replies for the serving tests: a HyDE passage, "I don't know" for the marker, else an
    answer citing [1] and [2]."""
    prompt = "\n".join(str(m.get("content", "")) for m in messages)
    if "Passage:" in prompt:
        return HYDE_PASSAGE
    if IDK_MARKER in prompt.lower():
        return "I don't know."
    return "The context manager's __exit__ method runs when the with block ends [1]. See also [2]."


@pytest.fixture(scope="session")
def tenant_indexes(local_ray, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("serving")
    alpha = build_tenant_index(workdir, "alpha", ALPHA_TOPICS)
    beta = build_tenant_index(workdir, "beta", BETA_TOPICS)
    # alpha's topics again, with a BM25 channel and hybrid search in its manifest, and document metadata
    delta = build_tenant_index(workdir, "delta", ALPHA_TOPICS, metadata=True, bm25={"enabled": True},
                               search={"bm25_alpha": 0.7})
    gamma = workdir / "gamma-index"  # alpha with shard 1's FAISS file corrupted (same size: checksum mismatch)
    shutil.copytree(alpha, gamma)
    faiss_file = gamma / "shards" / "00001.faiss"
    data = bytearray(faiss_file.read_bytes())
    data[-64:] = bytes(64)
    faiss_file.write_bytes(bytes(data))
    return {"alpha": alpha, "beta": beta, "gamma": gamma, "delta": delta, "workdir": workdir}


@pytest.fixture(scope="session")
def index_builder():
    """`build_tenant_index` for test modules (conftest helpers are not importable by name)."""
    return build_tenant_index


@pytest.fixture(scope="session")
def fake_llm():
    """The suite's one fake LLM server (tests/fake_openai_server.py) with the serving replies."""
    with running_fake_openai(serving_reply) as server:
        yield server


@pytest.fixture(scope="module")
def served(local_ray, tenant_indexes, fake_llm):
    """Serve once (the app tests live in one module): app `qrag` (tenants alpha, beta, broken gamma; fake LLM)
    at `/` (and delta, alpha with hybrid search) and app `open` (alpha as the open default tenant, no LLM) at
    `/open`."""
    import httpx
    from ray import serve

    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import add_tenant, set_admin_key

    tenants_file = tenant_indexes["workdir"] / "tenants.yaml"
    keys = {name: add_tenant(tenants_file, name, tenant_indexes[name]) for name in ("alpha", "beta", "gamma", "delta")}
    keys["admin"] = set_admin_key(tenants_file)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    small = {"ray_actor_options": {"num_cpus": 0.5}}
    options = {n: small for n in ("Router", "ShardSearcher0", "ShardSearcher1", "ShardSearcher2", "Synthesizer")}
    generator = {"backend": "openai", "base_url": fake_llm.url, "model": "fake-llm", "api_key_env": ""}
    started = time.time()
    tenants_app = compose_app({"tenants": str(tenants_file), "generator": generator}, options)
    serve.run(tenants_app, name="qrag", route_prefix="/")
    serve.run(compose_app({"index": str(tenant_indexes["alpha"])}, options), name="open", route_prefix="/open")
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=120)
    yield {"url": url, "client": client, "keys": keys, "tenants_file": tenants_file, "startup_s": time.time() - started,
           **tenant_indexes, **local_ray}
    client.close()
    serve.shutdown()
