"""Failure and replay: the process that applies a tenant's writes is killed with SIGKILL in the middle of
its passes (at several points: loading the model, embedding, writing the delta, publishing), restarted,
and in the end every acknowledged write is applied exactly once: each document written last by an upsert
is visible in exactly one segment with its latest text, each deleted one in none, no chunk twice, and the
write state has passed every logged entry. Slow tier: one small index build and six applier processes
(each loads MiniLM), 2-3 minutes on 2 cores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from support.corpus import PYDOC_QUESTIONS, topic_records, write_jsonl
from support.indexes import shared_build

pytestmark = pytest.mark.slow

APPLIER = """
import sys, time
from qrag_ray.serving.applier import Applier
from qrag_ray.serving.config import WriteSettings
applier = Applier(WriteSettings(max_entries=3, merge_factor=2, max_deltas=3))
while True:
    applier.apply(sys.argv[1])
    time.sleep(0.05)
"""
# seconds after a pass shows up (its APPLYING file) before the kill: the model loading, the embedding, the
# delta being written, the state being published
KILL_AFTER_S = [0.0, 0.4, 1.2, 2.5, 4.0]


def _start(root: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-c", APPLIER, str(root)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait(cond, timeout: float, what: str) -> None:
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_kill_9_mid_batch_loses_and_repeats_nothing(local_ray, tmp_path):
    from qrag_ray.index.versions import publish_version
    from qrag_ray.index.write_log import WriteLog
    from qrag_ray.index.write_state import load_write_state
    from qrag_ray.serving.config import WriteSettings
    from qrag_ray.serving.tenants import Tenant
    from qrag_ray.serving.writes import TenantWrites, applying_path

    names = list(PYDOC_QUESTIONS)
    corpus = write_jsonl(tmp_path / "base.jsonl", topic_records(names[:6]))
    shared_build({"input": str(corpus), "format": "jsonl", "build.output": str(tmp_path / "base"),
                  "chunker": {"method": "token", "size": 120, "overlap": 20}})
    root = tmp_path / "root"
    publish_version(root, tmp_path / "base")
    tenant = Tenant(name="acme", index=str(root), key_sha256="0" * 64, scope="write")
    writes = TenantWrites(WriteSettings())
    latest: dict[str, str | None] = {}  # doc -> its acknowledged latest text (None: deleted)

    def upsert(doc: str, text: str) -> None:
        writes.upsert(tenant, [{"id": doc, "title": "", "text": text, "url": None, "metadata": {}}], 100)
        latest[doc] = text  # acknowledged: append returned

    proc = _start(root)
    try:
        for round_, delay in enumerate(KILL_AFTER_S):
            for i in range(6):
                upsert(f"n{round_}-{i}", f"Note {round_}.{i}: the applier was killed {round_} times so far.")
            upsert(f"n0-{round_}", f"Note 0.{round_} rewritten in round {round_}.")
            writes.delete(tenant, [f"n{round_}-5"], None, 20)
            latest[f"n{round_}-5"] = None
            writes.delete(tenant, [names[round_]], None, 20)  # a base document
            latest[names[round_]] = None
            _wait(lambda: applying_path(root).exists(), 120, "a pass to start")
            assert proc.poll() is None, "the applier died by itself"
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc = _start(root)
        last = WriteLog(root).last_seq()
        _wait(lambda: (st := load_write_state(root)) is not None and st.generation == last, 300, "the replay")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    st = load_write_state(root)
    shown: dict[str, list[str]] = {}
    chunks: set[str] = set()
    for d in st.deltas:
        for row in pq.read_table(d.path / "chunks.parquet", columns=["chunk_id", "doc_id", "text"]).to_pylist():
            if st.visible(row["doc_id"], d.last_seq):
                shown.setdefault(row["doc_id"], []).append(row["text"])
                assert row["chunk_id"] not in chunks, row["chunk_id"]  # no chunk in two visible segments
                chunks.add(row["chunk_id"])
    base_docs = set(pq.read_table(st.base_dir / "chunks.parquet", columns=["doc_id"]).column("doc_id").to_pylist())
    in_base = {doc for doc in base_docs if st.visible(doc, st.base_seq)}
    for doc, text in latest.items():
        if text is None:
            assert doc not in shown and doc not in in_base, doc
        else:
            assert shown.get(doc) == [text], (doc, shown.get(doc))  # once, with its latest text
            assert doc not in in_base
    assert set(shown) == {d for d, t in latest.items() if t is not None}
    assert in_base == set(names[:6]) - set(names[:len(KILL_AFTER_S)])
    outcomes = [json.loads(f.read_text())["writes"] for f in (root / "writes" / "status").iterdir()]
    assert all(o["status"] == "searchable" for batch in outcomes for o in batch.values())
