"""The write routes over HTTP on a real Serve app (Router + Writer + ShardSearchers, real MiniLM and
FAISS): a write key's batch is acknowledged (202, durable), applied by the Writer and its status goes to
searchable; a read key gets 403, another tenant's writes are not found, a plain index directory is 409;
bounds, bad records and bodies nested thousands of levels deep are documented 4xx answers; schemathesis
finds nothing on the new routes. Integration tier: one Serve app for the module."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, settings

from qrag_ray.runtime.ports import free_port
from support.corpus import topic_records, write_jsonl
from support.indexes import shared_build
from support.serving_data import ALPHA_TOPICS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def app(local_ray, tmp_path_factory):
    import httpx
    from ray import serve

    from qrag_ray.index.versions import publish_version
    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import add_tenant

    folder = tmp_path_factory.mktemp("writes-app")
    corpus = write_jsonl(folder / "base.jsonl", topic_records(ALPHA_TOPICS[:8], metadata=True))
    shared_build({"input": str(corpus), "format": "jsonl", "build.output": str(folder / "base"), "shards": 2,
                  "chunker": {"method": "token", "size": 120, "overlap": 20}})
    root = folder / "root"
    publish_version(root, folder / "base")
    tenants_file = folder / "tenants.yaml"
    keys = {"acme": add_tenant(tenants_file, "acme", root, scope="write"),
            "reader": add_tenant(tenants_file, "reader", folder / "base"),
            "plain": add_tenant(tenants_file, "plain", folder / "base", scope="write")}
    port = free_port()
    serve.shutdown()  # a Serve left in this session's Ray would keep its own port and ignore ours
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}/w", timeout=120)
    try:  # Serve goes with the module even when its set-up fails: the next module starts its own
        small = {"ray_actor_options": {"num_cpus": 0.25}}
        options = {name: small for name in ("Router", "ShardSearcher0", "ShardSearcher1", "Writer")}
        serve.run(compose_app({"tenants": str(tenants_file), "writes": {"scan_s": 1.0}}, options), name="writes",
                  route_prefix="/w")
        deadline = time.time() + 180
        while client.get("/readyz").status_code != 200:
            assert time.time() < deadline, "the app did not get ready"
            time.sleep(1)
        yield {"client": client, "keys": keys, "root": root, "url": f"http://127.0.0.1:{port}/w"}
    finally:
        client.close()
        serve.shutdown()


def H(app, tenant: str) -> dict:
    return {"Authorization": f"Bearer {app['keys'][tenant]}"}


def _doc(i: int, **kw) -> dict:
    return {"id": f"new-{i}", "text": f"Written document {i}: a context manager's __exit__ runs at the end.",
            "title": f"Written {i}", **kw}


def _until_searchable(app, write_id: str, tenant: str = "acme", timeout: float = 120.0) -> dict:
    deadline = time.time() + timeout
    while True:
        r = app["client"].get(f"/v1/writes/{write_id}", headers=H(app, tenant))
        assert r.status_code == 200, r.text
        body = r.json()
        if body["status"] in ("searchable", "failed") or time.time() > deadline:
            return body
        time.sleep(0.2)


def test_a_write_is_acknowledged_then_applied(app):
    c = app["client"]
    r = c.post("/v1/documents", json={"documents": [_doc(1, metadata={"area": "loops"}), _doc(2)]},
               headers=H(app, "acme"))
    assert r.status_code == 202, r.text
    receipt = r.json()
    assert receipt["status"] == "queued" and receipt["operation"] == "upsert" and receipt["documents"] == 2
    assert receipt["index"] == "acme"
    body = _until_searchable(app, receipt["write_id"])
    assert body["status"] == "searchable" and body["chunks"] >= 2 and body["searchable_at"] >= body["submitted_at"]
    r = c.request("DELETE", "/v1/documents", json={"ids": ["new-2"]}, headers=H(app, "acme"))
    assert r.status_code == 202 and r.json()["operation"] == "delete" and r.json()["documents"] == 1
    assert _until_searchable(app, r.json()["write_id"])["status"] == "searchable"
    r = c.request("DELETE", "/v1/documents", json={"filter": {"type": "eq", "key": "area", "value": "loops"}},
                  headers=H(app, "acme"))
    assert r.status_code == 202 and r.json()["documents"] is None
    done = _until_searchable(app, r.json()["write_id"])
    assert done["status"] == "searchable" and done["documents"] >= 2  # new-1 and the base's loops topics

    from qrag_ray.index.write_state import load_write_state

    st = load_write_state(app["root"])
    assert st.generation >= 3 and "new-1" in st.tombstones and "new-1" not in st.hashes


def test_a_batch_no_router_announced_is_applied_by_the_writers_scan(app):
    """What a Writer restarted after a crash does: a logged batch nobody nudged it for (appended here, as
    a Router that died after its fsync would leave it) is found by its timer and applied."""
    from qrag_ray.index.write_log import WriteLog
    from qrag_ray.serving.writes import check_documents

    records = check_documents([_doc(9)], {})
    entry = WriteLog(app["root"]).append("upsert", {"records": records})
    assert _until_searchable(app, entry.write_id, timeout=60)["status"] == "searchable"


def test_keys_and_tenants_are_kept_apart(app):
    c = app["client"]
    mine = c.post("/v1/documents", json={"documents": [_doc(3)]}, headers=H(app, "acme")).json()["write_id"]
    r = c.post("/v1/documents", json={"documents": [_doc(4)]}, headers=H(app, "reader"))
    assert r.status_code == 403 and r.json()["error"] == "forbidden" and "read key" in r.json()["message"]
    r = c.request("DELETE", "/v1/documents", json={"ids": ["x"]}, headers=H(app, "reader"))
    assert r.status_code == 403
    assert c.post("/v1/documents", json={"documents": [_doc(4)]}).status_code == 401
    r = c.post("/v1/documents", json={"documents": [_doc(4)], "index": "reader"}, headers=H(app, "acme"))
    assert r.status_code == 403  # another tenant's index
    r = c.get(f"/v1/writes/{mine}", headers=H(app, "reader"))
    assert r.status_code == 404 and r.json()["error"] == "not_found"  # another tenant's write is not there
    assert c.get(f"/v1/writes/{mine}", headers=H(app, "acme")).status_code == 200  # a read of its own: any key
    r = c.post("/v1/documents", json={"documents": [_doc(5)]}, headers=H(app, "plain"))
    assert r.status_code == 409 and r.json()["error"] == "not_writable" and "--root" in r.json()["message"]


def test_bad_batches_are_documented_4xx_and_nothing_is_logged(app):
    from qrag_ray.index.write_log import WriteLog

    c = app["client"]
    before = WriteLog(app["root"]).last_seq()
    r = c.post("/v1/documents", json={"documents": [_doc(i) for i in range(1001)]}, headers=H(app, "acme"))
    assert r.status_code == 413 and r.json()["error"] == "too_large" and "at most 1000" in r.json()["message"]
    r = c.post("/v1/documents", json={"documents": [_doc(7), _doc(8, metadata={"order": "first"})]},
               headers=H(app, "acme"))
    body = r.json()
    assert r.status_code == 422 and body["error"] == "invalid_document"
    assert body["message"].startswith("record 1, field 'metadata.order'") and "a number" in body["message"]
    assert body["detail"][0]["loc"] == ["documents", 1, "metadata", "order"]
    r = c.post("/v1/documents", json={"documents": [_doc(7), {"id": "x"}]}, headers=H(app, "acme"))
    assert r.status_code == 422 and r.json()["error"] == "invalid_document"
    assert r.json()["detail"][0]["loc"] == ["documents", 1, "text"]
    r = c.request("DELETE", "/v1/documents", json={"ids": ["a"], "filter": {"type": "eq", "key": "area", "value": 1}},
                  headers=H(app, "acme"))
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"
    r = c.request("DELETE", "/v1/documents", json={"filter": {"type": "gt", "key": "statement", "value": True}},
                  headers=H(app, "acme"))
    assert r.status_code == 422 and r.json()["error"] == "invalid_filter"
    assert WriteLog(app["root"]).last_seq() == before


@pytest.mark.parametrize("route", ["/v1/documents", "/v1/search"])
def test_a_body_nested_3000_levels_deep_is_a_documented_400(app, route):
    body = '{"documents": ' + "[" * 3000 + "]" * 3000 + "}"
    r = app["client"].post(route, content=body, headers={**H(app, "acme"), "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "malformed_json" and "nested" in r.json()["message"]


def _search(app, query: str, k: int = 3, **extra) -> list[dict]:
    response = app["client"].post("/v1/search", json={"query": query, "k": k, **extra}, headers=H(app, "acme"))
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_a_write_is_searchable_within_seconds_and_a_deletion_gone_within_one(app):
    client = app["client"]
    doc = {"id": "fresh-1", "text": "Zebra-striped semaphores guard the write path of a qrag tenant.", "title": "",
           "metadata": {"area": "writes"}}
    receipt = client.post("/v1/documents", json={"documents": [doc]}, headers=H(app, "acme")).json()
    started = time.time()
    query = "What guards the write path of a qrag tenant?"
    while time.time() - started < 5:
        if any(hit["doc_id"] == "fresh-1" for hit in _search(app, query)):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"write {receipt['write_id']} not searchable within 5 s")
    # the written document is a document like the others: filtered on, fetched by id
    filtered = _search(app, query, filter={"type": "eq", "key": "area", "value": "writes"})
    assert [hit["doc_id"] for hit in filtered] == ["fresh-1"]
    assert filtered[0]["metadata"] == {"area": "writes"} and "Zebra-striped" in filtered[0]["text"]
    fetched = client.get("/v1/documents/fresh-1", headers=H(app, "acme"))
    assert fetched.status_code == 200 and fetched.json()["chunks"][0]["text"].startswith("Zebra-striped")
    chunk = client.get(f"/v1/chunks/{fetched.json()['chunks'][0]['chunk_id'].replace('#', '%23')}",
                       headers=H(app, "acme"))
    assert chunk.status_code == 200 and chunk.json()["doc_id"] == "fresh-1"
    client.request("DELETE", "/v1/documents", json={"ids": ["fresh-1"]}, headers=H(app, "acme"))
    started = time.time()
    while time.time() - started < 1:
        hits = _search(app, query)
        if hits and not any(hit["doc_id"] == "fresh-1" for hit in hits):
            break
    else:
        pytest.fail("a deleted document still found after 1 s")
    assert client.get("/v1/documents/fresh-1", headers=H(app, "acme")).status_code == 404


def test_a_replaced_document_shows_only_its_new_content(app):
    """A base document replaced through the API: its new text is found, its old chunks are left out of every
    shard's search (a tombstone), and the page still has k distinct chunks."""
    client = app["client"]
    base_hits = _search(app, "When does the else clause of a for loop run?", k=5)
    old = base_hits[0]
    assert len(base_hits) == 5
    new_text = "Replaced: this document now only talks about quartz clocks and their tick rates."
    receipt = client.post("/v1/documents", json={"documents": [{"id": old["doc_id"], "text": new_text,
                                                                "title": old["title"]}]},
                          headers=H(app, "acme")).json()
    assert _until_searchable(app, receipt["write_id"])["status"] == "searchable"
    after = _search(app, "When does the else clause of a for loop run?", k=5)
    assert len(after) == 5 and all(hit["chunk_id"] != old["chunk_id"] or "quartz" in hit["text"] for hit in after)
    assert not any(old["text"] == hit["text"] for hit in after)
    quartz = _search(app, "quartz clocks tick rates", k=1)
    assert quartz and quartz[0]["doc_id"] == old["doc_id"] and "quartz" in quartz[0]["text"]


def _schema():
    import schemathesis

    from qrag_ray.serving.router import app as fastapi_app

    return schemathesis.openapi.from_dict(fastapi_app.openapi()).include(path_regex="^/v1/(documents|writes)")


_SCHEMA = _schema()


@_SCHEMA.parametrize()
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_openapi_fuzz_of_the_write_routes_finds_nothing(case, app):
    """schemathesis with a write key on a writable tenant: every answer is one the schema documents."""
    case.call_and_validate(base_url=app["url"], headers=H(app, "acme"))
