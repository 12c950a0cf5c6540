"""The applier (qrag_ray/serving/applier.py) on a real tenant: a versioned root over a real index (the
default representation, 2 shards, BM25, every metadata type), batches logged as the routes log them and
applied in process with the real MiniLM: one delta per pass in the standard format, built through the
tenant's own representation (the same vectors, bit for bit, as a build gives the same documents), the
write state the search side reads, the statuses, the no-op rule, deletions by filter, merges, and a
pass redone over what a crash left. Integration tier: the base index is built with Ray once."""

from __future__ import annotations

import json
import shutil

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

from qrag_ray.index.format import read_table_file
from qrag_ray.index.write_log import WriteLog
from qrag_ray.index.write_state import load_write_state
from qrag_ray.serving.config import WriteSettings
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.writes import TenantWrites, applying_path
from support.corpus import PYDOC_QUESTIONS, topic_records, write_jsonl
from support.indexes import shared_build

pytestmark = pytest.mark.integration

NAMES = list(PYDOC_QUESTIONS)  # 14 topics: the base holds the first 10, the writes bring the rest
BASE = {"format": "jsonl", "shards": 2, "build.overwrite": True, "chunker": {"method": "token", "size": 120,
                                                                             "overlap": 20}}


def _records(names):
    return [{"id": r["id"], "title": r["title"], "text": r["text"], "url": r.get("url"), "metadata": r["metadata"]}
            for r in topic_records(names, metadata=True) if r["id"] in names]


@pytest.fixture(scope="module")
def built(local_ray, tmp_path_factory):
    """The base index (10 topics) and, for comparison, the index a build makes of all 14."""
    wd = tmp_path_factory.mktemp("writes")
    every = topic_records(NAMES, metadata=True)
    base_in = write_jsonl(wd / "base.jsonl", every[:10])
    full_in = write_jsonl(wd / "full.jsonl", every)
    shared_build({**BASE, "input": str(base_in), "build.output": str(wd / "base")})
    shared_build({**BASE, "input": str(full_in), "build.output": str(wd / "full")})
    return wd


@pytest.fixture(scope="module")
def applier():
    from qrag_ray.serving.applier import Applier

    return Applier(WriteSettings(merge_factor=4, max_deltas=3))


@pytest.fixture
def tenant(built, tmp_path):
    from qrag_ray.index.versions import publish_version

    root = tmp_path / "root"
    publish_version(root, built / "base")
    return Tenant(name="acme", index=str(root), key_sha256="0" * 64, scope="write")


def _rows(index_dir, chunk_ids):
    """(chunk_idx, kind, text) -> vector of the index's rows of these chunks, over all its shards."""
    from qrag_ray.index.format import chunk_key, load_manifest

    keys = {chunk_key(c) for c in chunk_ids}
    m = load_manifest(index_dir)
    out = {}
    for s in m.shards:
        meta = read_table_file(m.file(s.meta)).to_pylist()
        index = faiss.read_index(str(m.file(s.faiss)))
        for i, row in enumerate(meta):
            if row["chunk_idx"] in keys:
                out[(row["chunk_idx"], row["kind"], row["text"])] = index.reconstruct(i)
    return out


def _chunk_ids(index_dir, doc):
    t = pq.read_table(index_dir / "chunks.parquet", columns=["chunk_id", "doc_id"]).to_pylist()
    return sorted(r["chunk_id"] for r in t if r["doc_id"] == doc)


def test_a_batch_becomes_one_delta_through_the_tenants_representation(built, applier, tenant, open_engine):
    from qrag_ray.index.versions import resolve_index

    writes = TenantWrites(WriteSettings())
    root = tenant.index
    new = _records(NAMES[10:12])  # pass, return
    a = writes.upsert(tenant, new, 1000)
    b = writes.delete(tenant, ["for", "nothing-like-it"], None, 50)
    c = writes.upsert(tenant, [{"id": "if", "title": "if", "text": "The if statement picks one branch to run.",
                                "url": None, "metadata": {"area": "branches", "order": 99}}], 200)
    result = applier.apply(root)
    assert (result.first, result.last, result.entries, result.failed) == (1, 3, 3, 0)
    st = load_write_state(root)
    assert st.generation == 3 and st.base_version == resolve_index(root).version and st.base_seq == 0
    assert [(d.first_seq, d.last_seq) for d in st.deltas] == [(1, 3)]
    assert st.tombstones == {"pass": 1, "return": 1, "for": 2, "if": 3}
    assert set(st.hashes) == {"pass", "return", "if"}  # the live ones; `for` was deleted last
    assert st.metadata_schema == load_manifest_schema(built / "base")
    assert not applying_path(root).exists()

    delta = st.deltas[0].path
    m = json.loads((delta / "manifest.json").read_text())
    base_m = json.loads((built / "base" / "manifest.json").read_text())
    assert m["num_shards"] == 1 and m["faiss"]["factory"] == "Flat" and m["kinds"] == base_m["kinds"]
    assert m["delta"] == {"first_seq": 1, "last_seq": 3, "base_version": st.base_version}
    assert set(pq.read_table(delta / "chunks.parquet").column("doc_id").to_pylist()) == {"pass", "return", "if"}
    # the delta's vectors of a new document are the ones a build gives it, bit for bit
    ids = _chunk_ids(built / "full", "return")
    assert ids and _chunk_ids(delta, "return") == ids
    ours, theirs = _rows(delta, ids), _rows(built / "full", ids)
    assert ours.keys() == theirs.keys() and len(ours) > len(ids)
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    # a standard index: the engine searches it, BM25 and metadata included
    hits = open_engine(delta).search(["What does return do inside a generator?"], k=2)[0]
    assert hits[0]["doc_id"] == "return" and hits[0]["metadata"]["area"] and hits[0]["bm25"] is not None

    statuses = [writes.status(tenant, w.write_id) for w in (a, b, c)]
    assert [s["status"] for s in statuses] == ["searchable"] * 3
    assert statuses[0]["documents"] == 2 and statuses[0]["chunks"] == len(_chunk_ids(delta, "pass")) + len(ids)
    assert statuses[1]["documents"] == 2 and statuses[2]["chunks"] == 1
    assert all(s["searchable_at"] >= s["submitted_at"] for s in statuses)


def load_manifest_schema(index_dir):
    return json.loads((index_dir / "manifest.json").read_text())["metadata_schema"]


def test_a_repeated_write_changes_nothing(built, applier, tenant):
    writes = TenantWrites(WriteSettings())
    root = tenant.index
    writes.upsert(tenant, _records(["pass"]), 500)
    applier.apply(root)
    before = load_write_state(root)
    again = writes.upsert(tenant, _records(["pass"]), 500)  # the same document through the API again
    as_built = writes.upsert(tenant, _records(["assert"]), 500)  # a base document, sent as it was built
    result = applier.apply(root)
    after = load_write_state(root)
    assert result.documents == 0 and result.delta is None
    assert after.tombstones == before.tombstones and after.deltas == before.deltas and after.generation == 3
    for w in (again, as_built):
        st = writes.status(tenant, w.write_id)
        assert st["status"] == "searchable" and st["chunks"] == 0


def test_a_delete_by_filter_takes_what_is_visible_when_it_applies(built, applier, tenant):
    writes = TenantWrites(WriteSettings())
    root = tenant.index
    base_loops = {r["id"] for r in _records(NAMES[:10]) if r["metadata"]["area"] == "loops"}
    # an earlier write in the same pass moves `if` into the area; one moves `assert` out of it
    writes.upsert(tenant, [{**_records(["if"])[0], "metadata": {"area": "loops"}},
                           {**_records(["assert"])[0], "metadata": {"area": "values"}}], 2000)
    gone = writes.delete(tenant, None, {"type": "eq", "key": "area", "value": "loops"}, 60)
    applier.apply(root)
    st = load_write_state(root)
    expected = (base_loops | {"if"}) - {"assert"}
    assert {d for d, s in st.tombstones.items() if s == 2} == expected
    assert set(st.hashes) == {"assert"}  # `if` was written, then deleted in the same pass
    assert writes.status(tenant, gone.write_id)["documents"] == len(expected)
    assert set(pq.read_table(st.deltas[0].path / "chunks.parquet").column("doc_id").to_pylist()) == {"assert"}


def test_small_deltas_merge_and_keep_only_visible_documents(built, applier, tenant):
    writes = TenantWrites(WriteSettings())
    root = tenant.index
    new = _records(NAMES[10:14])
    for rec in new:
        writes.upsert(tenant, [rec], 500)
        applier.apply(root)
    writes.upsert(tenant, [{**new[0], "text": "Pass does nothing, now in other words."}], 500)  # replaces pass
    applier.apply(root)
    st = load_write_state(root)
    assert st.generation == 5 and len(st.deltas) <= 3  # max_deltas: merged instead of piling up
    shown = {}
    for d in st.deltas:
        for doc in set(pq.read_table(d.path / "chunks.parquet").column("doc_id").to_pylist()):
            if st.visible(doc, d.last_seq):
                shown.setdefault(doc, []).append(d.name)
    assert sorted(shown) == sorted(r["id"] for r in new) and all(len(v) == 1 for v in shown.values())
    texts = [t for d in st.deltas for t in pq.read_table(d.path / "chunks.parquet").column("text").to_pylist()]
    assert "Pass does nothing, now in other words." in texts
    assert st.retired  # the merged-away deltas stay for the replicas still reading them


def test_a_type_taken_by_an_earlier_writer_fails_the_later_batch(built, applier, tenant):
    log = WriteLog(tenant.index)
    recs = [{"doc_id": "x1", "title": "", "text": "One.", "url": "", "metadata": {"colour": "red"}, "hash": "a"},
            {"doc_id": "x2", "title": "", "text": "Two.", "url": "", "metadata": {"colour": 3}, "hash": "b"}]
    # both were checked against the schema before either applied, as two Router replicas would
    log.append("upsert", {"records": recs[:1]})
    second = log.append("upsert", {"records": [recs[0] | {"doc_id": "x3", "hash": "c"}, recs[1]]})
    result = applier.apply(tenant.index)
    assert result.failed == 1
    st = load_write_state(tenant.index)
    assert set(st.tombstones) == {"x1"} and st.metadata_schema["colour"] == "string"
    status = TenantWrites(WriteSettings()).status(tenant, second.write_id)
    assert status["status"] == "failed"
    assert status["error"]["record"] == 1 and status["error"]["field"] == "metadata.colour"


def test_a_pass_is_rebuilt_over_what_a_crashed_one_left(built, applier, tenant):
    writes = TenantWrites(WriteSettings())
    root = tenant.index
    writes.upsert(tenant, _records(["while"]), 500)
    # a crashed pass: its delta half written under the name this pass takes, its progress file left behind
    half = root_path(root) / "writes" / "deltas" / "000000000001-000000000001"
    half.mkdir(parents=True)
    (half / "chunks.parquet").write_bytes(b"PAR1 torn")
    applying_path(root).write_text(json.dumps({"first": 1, "last": 1, "chunks": 9, "indexed": 3}))
    result = applier.apply(root)
    assert result.entries == 1 and result.delta == half.name
    st = load_write_state(root)
    assert [d.name for d in st.deltas] == [half.name] and st.tombstones == {"while": 1}
    assert set(pq.read_table(half / "chunks.parquet").column("doc_id").to_pylist()) == {"while"}
    assert not applying_path(root).exists()
    assert applier.apply(root).entries == 0  # applied once


def root_path(root):
    from pathlib import Path

    return Path(root)


def test_an_orphan_delta_is_swept(built, applier, tenant):
    root = root_path(tenant.index)
    TenantWrites(WriteSettings()).upsert(tenant, _records(["with"]), 500)
    applier.apply(root)
    orphan = root / "writes" / "deltas" / "000000000007-000000000009"
    shutil.copytree(load_write_state(root).deltas[0].path, orphan)
    applier.maintain(root)
    assert not orphan.exists() and load_write_state(root).deltas[0].path.is_dir()
