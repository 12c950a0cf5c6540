"""Compaction (qrag_ray/index/compaction.py): a tenant's applied writes (new, replaced and deleted
documents, a delete by filter) folded into a new version by the incremental build equal a fresh full build
of the same documents, file for file (so the same chunk ids and scores); nothing is embedded again (the
base's kept work dir and the deltas' own vectors); a write logged meanwhile stays above the folded
generation. Slow tier: three builds of a 10-document index, about 3 minutes on 2 busy cores."""

from __future__ import annotations

import json

import pytest

from support.corpus import PYDOC_QUESTIONS, topic_records, write_jsonl
from support.indexes import build

pytestmark = pytest.mark.slow

NAMES = list(PYDOC_QUESTIONS)
QUERIES = ["When does the else clause of a for loop run?", "What does return do inside a generator?",
           "How does an if statement choose a branch?", "What does the assert statement do?", "What is pass?"]
COMMON = {"format": "jsonl", "shards": 2, "chunker": {"method": "token", "size": 120, "overlap": 20}}


def _doc(rec):
    return {"id": rec["id"], "title": rec["title"], "text": rec["text"], "url": rec.get("url"),
            "metadata": rec["metadata"]}


def _ranked(open_engine, index_dir):
    pages = open_engine(index_dir).search(QUERIES, k=5)
    return [[(r["chunk_id"], round(r["score"], 6)) for r in page] for page in pages]


def test_compaction_equals_a_fresh_build_and_embeds_nothing_again(local_ray, tmp_path, open_engine):
    from qrag_ray.index.compaction import compact
    from qrag_ray.index.versions import publish_version, resolve_index
    from qrag_ray.index.write_log import WriteLog
    from qrag_ray.index.write_state import load_write_state
    from qrag_ray.serving.applier import Applier
    from qrag_ray.serving.config import WriteSettings
    from qrag_ray.serving.tenants import Tenant
    from qrag_ray.serving.writes import TenantWrites

    every = {r["id"]: r for r in topic_records(NAMES, metadata=True)}
    base_in = write_jsonl(tmp_path / "base.jsonl", [every[n] for n in NAMES[:10]])
    build({**COMMON, "input": str(base_in), "build.output": str(tmp_path / "base"), "build.keep_work": True})
    root = tmp_path / "root"
    publish_version(root, tmp_path / "base")
    tenant = Tenant(name="acme", index=str(root), key_sha256="0" * 64, scope="write")
    writes = TenantWrites(WriteSettings())
    replaced = {**_doc(every["if"]), "text": "The if statement picks one branch. Its elif and else follow.",
                "metadata": {"area": "branches", "order": 42}}
    writes.upsert(tenant, [_doc(every["pass"]), _doc(every["return"])], 10_000)
    writes.upsert(tenant, [replaced], 1000)
    writes.delete(tenant, ["for"], None, 50)
    writes.delete(tenant, None, {"type": "eq", "key": "area", "value": "values"}, 80)
    applier = Applier(WriteSettings())
    applier.apply(root)
    g = load_write_state(root).generation
    late = writes.upsert(tenant, [_doc(every["while"])], 5000)  # logged, not applied when the compaction starts

    summary = compact(root)
    assert summary["compacted"] and summary["generation"] == g == 4
    assert summary["vectors_embedded"] == 0 and summary["vectors_reused"] == summary["vectors"] > 0

    # the documents as of generation g, built afresh
    final = {n: _doc(every[n]) for n in NAMES[:10]} | {"pass": _doc(every["pass"]), "return": _doc(every["return"])}
    final["if"] = replaced
    final.pop("for")
    final = {k: v for k, v in final.items() if (v["metadata"] or {}).get("area") != "values"}
    fresh_in = write_jsonl(tmp_path / "fresh.jsonl", [{k: v for k, v in d.items() if v is not None}
                                                      for d in final.values()])
    build({**COMMON, "input": str(fresh_in), "build.output": str(tmp_path / "fresh")})
    compacted = resolve_index(root).dir
    a = json.loads((compacted / "manifest.json").read_text())
    b = json.loads((tmp_path / "fresh" / "manifest.json").read_text())
    assert a["files"] == b["files"] and a["counts"] == b["counts"] and a["metadata_schema"] == b["metadata_schema"]
    assert _ranked(open_engine, compacted) == _ranked(open_engine, tmp_path / "fresh")

    st = load_write_state(root)
    assert (st.base_version, st.base_seq, st.deltas, dict(st.tombstones)) == (summary["index_version"], g, (), {})
    assert st.retired and WriteLog(root).numbers() == [late.seq]  # folded entries pruned, the late one kept
    applier.apply(root)  # the write logged during the compaction lands above it
    st = load_write_state(root)
    assert st.generation == late.seq and dict(st.tombstones) == {"while": late.seq}
    assert [(d.first_seq, d.last_seq) for d in st.deltas] == [(late.seq, late.seq)]
    assert writes.status(tenant, late.write_id)["status"] == "searchable"
