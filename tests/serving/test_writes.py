"""The write routes' work in a Router replica (qrag_ray/serving/writes.py), without Serve: a batch checked
before anything is logged (the record and field named, the bounds), logged as one entry, and a write's
status read back from the log, the write state and the applier's records. Unit tier: files only (the
index is a manifest; nothing is embedded)."""

from __future__ import annotations

import json

import pytest

from qrag_ray.index.write_log import WriteLog
from qrag_ray.index.write_state import WriteState, publish_state
from qrag_ray.serving.api_errors import ApiError
from qrag_ray.serving.config import WriteSettings
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.writes import TenantWrites, applying_path, check_documents, receipt, status_dir


def _manifest(d, schema=None, config=None):
    d.mkdir(parents=True)
    m = {"format_version": 2, "index_version": "v1", "num_shards": 0, "shards": [], "files": {},
         "embedder": {"model": "all-MiniLM-L6-v2", "dim": 384}, "representation": "default",
         "kinds": ["chunk", "title", "sentence", "window"]}
    if schema:
        m["metadata_schema"] = schema
    if config:
        m["config"] = config
    (d / "manifest.json").write_text(json.dumps(m))
    return d


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    _manifest(r / "versions" / "v1", {"year": "number", "lang": "string"})
    (r / "CURRENT").write_text("v1\n")
    return r


def _tenant(path, scope="write") -> Tenant:
    return Tenant(name="acme", index=str(path), key_sha256="0" * 64, scope=scope)


def _doc(i, **kw):
    return {"id": f"d{i}", "text": f"Document {i} says something.", "title": "", "url": None, "metadata": {}, **kw}


def _error(call) -> ApiError:
    with pytest.raises(ApiError) as e:
        call()
    return e.value


# ------------------------------------------------------------------------------------ the checks
def test_records_become_log_records_with_a_content_hash():
    recs = check_documents([_doc(1, metadata={"year": 2021, "tags": ["a"]}, url="https://x"), _doc(2)],
                           {"year": "number"})
    assert [r["doc_id"] for r in recs] == ["d1", "d2"]
    assert recs[0]["metadata"] == {"year": 2021, "tags": ["a"]} and recs[0]["url"] == "https://x"
    assert recs[1]["url"] == "" and recs[1]["metadata"] == {}
    again = check_documents([_doc(1, metadata={"tags": ["a"], "year": 2021}, url="https://x")], {})
    assert again[0]["hash"] == recs[0]["hash"] != recs[1]["hash"]  # key order aside, the same content
    changed = check_documents([_doc(1, metadata={"year": 2022, "tags": ["a"]}, url="https://x")], {})
    assert changed[0]["hash"] != recs[0]["hash"]


@pytest.mark.parametrize("docs,record,field,message", [
    ([_doc(0), _doc(1, metadata={"year": "2021"})], 1, "metadata.year",
     "metadata field 'year' is a string, but the index has it as a number"),
    ([_doc(0, metadata={"pages": 3}), _doc(1, metadata={"pages": True})], 1, "metadata.pages",
     "metadata field 'pages' is a bool, but record 0 has it as a number"),
    ([_doc(0), _doc(0)], 1, "id", "id 'd0' repeats record 0"),
    ([_doc(0, metadata={"when": "2024-13-40"})], 0, "metadata.when", "is not a valid ISO-8601 date"),
    ([_doc(0, metadata={"tags": ["a", 3]})], 0, "metadata.tags", "values must be a string, number"),
])
def test_a_bad_record_is_named_with_its_field(docs, record, field, message):
    e = _error(lambda: check_documents(docs, {"year": "number"}))
    assert e.status == 422 and e.kind == "invalid_document"
    assert e.message.startswith(f"record {record}, field '{field}': ") and message in e.message
    assert e.detail[0]["loc"] == ["documents", record, *field.split(".")]


# ------------------------------------------------------------------------------------ logging a batch
def test_a_batch_is_logged_whole_and_its_status_is_queued(root):
    writes = TenantWrites(WriteSettings())
    t = _tenant(root)
    entry = writes.upsert(t, [_doc(1, metadata={"year": 2020}), _doc(2)], 300)
    assert entry.seq == 1 and entry.documents == 2
    assert receipt(t, entry) == {"write_id": entry.write_id, "index": "acme", "operation": "upsert",
                                 "status": "queued", "documents": 2}
    logged = WriteLog(root).read(1)
    assert [r["doc_id"] for r in logged.records] == ["d1", "d2"] and logged.records[0]["hash"]
    st = writes.status(t, entry.write_id)
    assert st["status"] == "queued" and st["documents"] == 2 and st["searchable_at"] is None
    gone = writes.delete(t, ["d1", "d1", "d9"], None, 40)
    assert gone.seq == 2 and WriteLog(root).read(2).ids == ["d1", "d9"]
    by_filter = writes.delete(t, None, {"type": "eq", "key": "lang", "value": "en"}, 40)
    assert receipt(t, by_filter)["documents"] is None


def test_nothing_of_a_bad_batch_is_logged(root):
    writes = TenantWrites(WriteSettings())
    e = _error(lambda: writes.upsert(_tenant(root), [_doc(0), _doc(1, metadata={"lang": 7})], 100))
    assert e.kind == "invalid_document" and "record 1, field 'metadata.lang'" in e.message
    e = _error(lambda: writes.delete(_tenant(root), None, {"type": "gt", "key": "lang", "value": 3}, 50))
    assert e.status == 422 and e.kind == "invalid_filter"
    e = _error(lambda: writes.delete(_tenant(root), None, {"type": "eq", "key": "nope", "value": 3}, 50))
    assert e.kind == "invalid_filter" and "unknown metadata field 'nope'" in e.message
    assert WriteLog(root).numbers() == []


def test_bounds_answer_413_and_a_backlog_429(root):
    writes = TenantWrites(WriteSettings(max_documents=3, max_bytes=2000, max_queued_bytes=1024))
    t = _tenant(root)
    e = _error(lambda: writes.upsert(t, [_doc(i) for i in range(4)], 100))
    assert e.status == 413 and e.kind == "too_large" and "at most 3" in e.message
    e = _error(lambda: writes.upsert(t, [_doc(0)], 2001))
    assert e.status == 413 and "at most 2000" in e.message
    e = _error(lambda: writes.delete(t, [f"d{i}" for i in range(4)], None, 100))
    assert e.status == 413
    big = {"x": "y" * 900}
    writes.upsert(t, [_doc(0, metadata=big)], 1000)  # the first batch of an empty queue always fits
    e = _error(lambda: writes.upsert(t, [_doc(1, metadata=big)], 1000))
    assert e.status == 429 and e.kind == "write_backlog" and e.headers["Retry-After"] == "5"
    # once the applier has passed it, the queue is empty again
    publish_state(WriteState(root=root, generation=1, base_version="v1"))
    assert writes.upsert(t, [_doc(1, metadata=big)], 1000).seq == 2


def test_an_index_that_cannot_take_writes_is_409(tmp_path, root):
    writes = TenantWrites(WriteSettings())
    plain = _manifest(tmp_path / "plain")
    e = _error(lambda: writes.upsert(_tenant(plain), [_doc(0)], 10))
    assert e.status == 409 and e.kind == "not_writable" and f"qrag publish {plain} --root" in e.message
    llm = tmp_path / "llm-root"
    _manifest(llm / "versions" / "v1", config={"generator": {"backend": "vllm"}, "representation": "hype"})
    (llm / "CURRENT").write_text("v1\n")
    e = _error(lambda: writes.upsert(_tenant(llm), [_doc(0)], 10))
    assert e.status == 409 and "LLM generator" in e.message
    assert WriteLog(plain).numbers() == [] and WriteLog(llm).numbers() == []


def test_a_read_key_may_not_write():
    e = _error(lambda: _tenant("/x", scope="read").require_write())
    assert e.status == 403 and e.kind == "forbidden" and "--scope write" in e.message
    _tenant("/x").require_write()


# ------------------------------------------------------------------------------------ status
def test_status_follows_a_write_from_queued_to_searchable_or_failed(root):
    writes = TenantWrites(WriteSettings())
    t = _tenant(root)
    a = writes.upsert(t, [_doc(1)], 100)
    b = writes.upsert(t, [_doc(2)], 100)
    applying_path(root).write_text(json.dumps({"first": 1, "last": 2, "chunks": 4, "indexed": 1}))
    st = writes.status(t, b.write_id)
    assert (st["status"], st["chunks"], st["indexed"]) == ("indexing", 4, 1)
    # the applier publishes the state, then its records
    publish_state(WriteState(root=root, generation=2, base_version="v1"))
    applying_path(root).unlink()
    assert writes.status(t, a.write_id)["status"] == "searchable"  # no record yet: the state says applied
    status_dir(root).mkdir(parents=True)
    outcome = {"write_id": b.write_id, "operation": "upsert", "status": "failed", "documents": 1, "chunks": None,
               "indexed": 0, "submitted_at": b.submitted_at, "searchable_at": None,
               "error": {"record": 0, "field": "metadata.year", "message": "no"}}
    (status_dir(root) / "000000000001-000000000002.json").write_text(json.dumps({"writes": {"2": outcome}}))
    st = writes.status(t, b.write_id)
    assert st["status"] == "failed" and st["error"]["field"] == "metadata.year" and st["index"] == "acme"


def test_an_unknown_or_guessed_write_id_is_404(root):
    writes = TenantWrites(WriteSettings())
    t = _tenant(root)
    real = writes.upsert(t, [_doc(1)], 100)
    for wid in ["nope", "000000000009-0123456789ab", real.write_id[:-1] + ("0" if real.write_id[-1] != "0" else "1")]:
        e = _error(lambda w=wid: writes.status(t, w))
        assert e.status == 404 and e.kind == "not_found"


# ------------------------------------------------------------------------------------ the HTTP edge
def test_a_body_too_deep_to_parse_and_a_wrong_method_get_documented_answers():
    """No Serve needed: FastAPI's own parsing and routing errors, as the app renders them."""
    from fastapi.testclient import TestClient

    from qrag_ray.serving.router import app

    client = TestClient(app)
    deep = '{"documents": ' + "[" * 3000 + "]" * 3000 + "}"
    r = client.post("/v1/documents", content=deep, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "malformed_json" and "nested" in r.json()["message"]
    r = client.options("/v1/documents")
    # both routes of the path, not only the first one Starlette matched
    assert r.status_code == 405 and r.headers["Allow"] == "DELETE, POST"


# ------------------------------------------------------------------------------------ the merge policy
def test_deltas_merge_by_size_tier_and_past_the_cap(tmp_path):
    from qrag_ray.index.write_state import Delta
    from qrag_ray.serving.applier import merge_plan

    def deltas(*sizes):
        return tuple(Delta(tmp_path / f"d{i}", 10 * i + 1, 10 * i + 10, chunks=n) for i, n in enumerate(sizes))

    s = WriteSettings(merge_factor=4, max_deltas=6)
    assert merge_plan(deltas(1, 1, 1), 0, s) == []
    four = deltas(20, 1, 2, 3, 1)  # the newest four are all under 4 chunks: one tier
    assert [d.chunks for d in merge_plan(four, 0, s)] == [1, 2, 3, 1]
    assert merge_plan(deltas(64, 16, 4, 1), 0, s) == []  # one delta per tier: a few, of growing size
    assert [d.chunks for d in merge_plan(deltas(40, 20, 8, 4, 30, 2, 1), 0, s)] == [2, 1]  # 7 > 6: back to 6
    # nothing at or below a running compaction's generation
    assert merge_plan(four, 20, s) == [] and merge_plan(four, 10, s) == list(four[1:])
