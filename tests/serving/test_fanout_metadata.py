"""A fanned-out tenant (every shard searched by the ShardSearcher replicas) with document metadata, over real
HTTP on a local Ray: k=1000 pages with metadata to 16 concurrent clients, grouped shards so that one reply
carries all of a query batch's pages (several MB), filtered pages ranked as in process, and the fetch
routes on the ShardSearcher path with tenant keys."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import httpx
import pytest

from qrag_ray.runtime.ports import free_port
from support.corpus import write_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.soak]  # a 1,200-chunk index of its own and a Serve app, 16 clients

N_DOCS = 1200
QUERIES = ["When does the else clause of a for loop run?", "How are integers compared with floats?",
           "What does the global statement do?", "How do I make an object usable in a with statement?"]


def wide_records() -> list[dict]:
    """N_DOCS documents of ~3 KB (windows over the Python reference topics), each with metadata."""
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    text = " ".join(unwrap(topics[t]) for t in sorted(topics))
    names = sorted(topics)
    records = []
    for i in range(N_DOCS):
        start = (i * 997) % (len(text) - 3200)
        metadata = {"topic": names[i % len(names)], "n": i, "even": i % 2 == 0,
                    "day": f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}", "tags": [f"t{i % 10}", f"u{i % 7}"]}
        records.append({"id": f"w{i}", "title": f"Window {i}", "text": f"Part {i}. " + text[start:start + 3000],
                        "url": f"https://example.org/w/{i}", "metadata": metadata})
    return records


@pytest.fixture(scope="module")
def fanned(local_ray, tenant_indexes, index_root):
    from ray import serve

    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import add_tenant
    from support.indexes import build

    corpus = write_jsonl(index_root / "wide.jsonl", wide_records())
    out = index_root / "wide-index"
    build({"input": str(corpus), "build.output": str(out), "representation": "chunk", "shards": 3,
           "chunker.method": "none", "bm25.enabled": True, "build.overwrite": True,
           # the pages carry the whole 3 KB texts; the vectors need not read all of them
           "embedder.max_seq_length": 64})
    serve.shutdown()
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    tenants_file = index_root / "wide-tenants.yaml"
    keys = {"wide": add_tenant(tenants_file, "wide", out),
            "alpha": add_tenant(tenants_file, "alpha", tenant_indexes["alpha"])}
    small = {"ray_actor_options": {"num_cpus": 0.5}}
    # one ShardSearcher for all three shards: one reply per query batch carries every shard's pages
    app_args = {"tenants": str(tenants_file), "local_search_max_bytes": 0, "shards_per_searcher": 3,
                "request_timeout_s": 120}
    serve.run(compose_app(app_args, {"Router": small, "ShardSearcher0": small}), name="wide", route_prefix="/wide")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}/wide", timeout=300) as client:
        yield {"client": client, "index": out, "url": f"http://127.0.0.1:{port}/wide",
               "headers": {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}}
    serve.shutdown()


def test_k1000_with_metadata_to_16_concurrent_clients(fanned):
    bodies = [{"query": QUERIES[i % len(QUERIES)] + f" ({i})", "k": 1000} for i in range(32)]
    bodies[1::4] = [{**b, "filter": {"type": "eq", "key": "even", "value": True}} for b in bodies[1::4]]

    def one(body):
        with httpx.Client(base_url=fanned["url"], timeout=300) as client:
            return body, client.post("/v1/search", json=body, headers=fanned["headers"]["wide"])

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, bodies))
    for body, response in got:
        assert response.status_code == 200, response.text[:500]
        results = response.json()["results"]
        assert response.json()["timings"]["path"] == "shards"
        assert len(results) == len({x["chunk_id"] for x in results}) == (N_DOCS // 2 if "filter" in body else 1000)
        assert all(x["metadata"]["topic"] and x["url"].startswith("https://example.org/w/") for x in results)
        if "filter" in body:
            assert all(x["metadata"]["even"] for x in results)
    assert max(r.json()["timings"]["search_batch"] for _, r in got) > 1  # the replies carried batches


@pytest.mark.parametrize("filter_spec", [
    {"type": "in", "key": "tags", "value": ["t3", "u5"]},
    {"type": "and", "filters": [{"type": "lt", "key": "n", "value": 40},
                                {"type": "gte", "key": "day", "value": "2024-03-01"}]},
], ids=["tags", "n-and-day"])
def test_filtered_pages_on_the_shard_replicas_rank_as_in_process(fanned, filter_spec):
    from qrag_ray.search.engine import SearchEngine

    engine = SearchEngine(fanned["index"])
    for query in QUERIES[:2]:
        for alpha in (None, 1.0):
            body = {"query": query, "k": 20, "filter": filter_spec, **({} if alpha is None else {"bm25_alpha": alpha})}
            got = fanned["client"].post("/v1/search", json=body, headers=fanned["headers"]["wide"]).json()
            if alpha is None:
                ranking_engine = engine
            else:
                ranking_engine = SearchEngine(fanned["index"], policy=engine.policy.with_bm25_alpha(alpha))
            want = ranking_engine.search([query], k=20, filter=filter_spec)[0]
            assert got["timings"]["path"] == "shards"
            assert len(want) == 20
            assert [x["chunk_id"] for x in got["results"]] == [x["chunk_id"] for x in want]
            assert [x["metadata"] for x in got["results"]] == [x["metadata"] for x in want]


def test_fetch_on_the_shard_replicas_obeys_tenant_keys(fanned):
    client = fanned["client"]
    headers = fanned["headers"]
    response = client.get(f"/v1/chunks/{quote('w7#0', safe='')}", headers=headers["wide"])
    assert response.status_code == 200, response.text
    chunk = response.json()
    assert chunk["doc_id"] == "w7" and chunk["metadata"]["n"] == 7 and chunk["url"].endswith("/w/7")
    doc = client.get("/v1/documents/w7", headers=headers["wide"]).json()
    assert [x["chunk_id"] for x in doc["chunks"]] == ["w7#0"] and doc["metadata"]["tags"] == ["t7", "u0"]
    assert client.get(f"/v1/chunks/{quote('w7#0', safe='')}", headers=headers["alpha"]).status_code == 404
    response = client.get(f"/v1/chunks/{quote('w7#0', safe='')}?index=wide", headers=headers["alpha"])
    assert response.status_code == 403 and response.json()["error"] == "forbidden"
    response = client.get("/v1/documents/w7?index=alpha", headers=headers["wide"])
    assert response.status_code == 403
