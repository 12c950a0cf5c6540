"""Resumable builds: `qrag index` SIGKILLed mid-embedding and re-run with the same command embeds only
what the killed run had not checkpointed, and publishes the same index (manifest content_hash) as a
build that was never interrupted. Real Ray, real MiniLM, a real kill of the whole process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from qrag_ray.index.format import load_manifest


def _corpus(path):
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    recs = [{"id": k, "title": k, "text": unwrap(v)} for k, v in sorted(topics.items())[:60]]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.mark.slow
# The soak tier's (a build killed and run again, twice over, minutes of CI): CI holds the pieces a resume rests
# on (tests/index/test_checkpoint.py: batch-invariant vectors, content keys) and an injected crash mid-write
# (tests/index/test_build.py). 32: every batch spread over many shards, one part per batch.
@pytest.mark.soak
@pytest.mark.parametrize("shards", [3, 32])
def test_killed_build_resumes_to_the_same_index(local_ray, build_with, tmp_path, shards):
    corpus = _corpus(tmp_path / "topics.jsonl")
    conf = tmp_path / "c.yaml"
    conf.write_text("chunker: {method: token, size: 120, overlap: 20}\n"
                    "build: {rows_per_part: 16, embedder: {threads: 1, batch_size: 8}}\n")
    out = tmp_path / "idx"
    cmd = [sys.executable, "-m", "qrag_ray.cli", "index", "--input", str(corpus), "--output", str(out),
           "--representation", "chunk", "--shards", str(shards), "--config", str(conf), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    parts = tmp_path / ".idx.work" / "vectors"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and len(list(parts.rglob("*.parquet"))) < 3:
        time.sleep(0.2)
    if proc.poll() is not None:
        pytest.fail(f"qrag index exited ({proc.returncode}) before it could be killed: {proc.stderr.read()[-2000:]}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert not out.exists()
    done_before = len(list(parts.rglob("*.parquet")))
    assert done_before >= 3

    cfg = {"input": str(corpus), "representation": "chunk", "shards": shards, "chunker.method": "token",
           "chunker.size": 120, "chunker.overlap": 20, "build.rows_per_part": 16, "build.embedder.threads": 1,
           "build.embedder.batch_size": 8}  # forward passes of 8 rows: each part is 16 rows over several length buckets
    resumed = build_with({**cfg, "build.output": str(out)})
    # the re-run embedded only what the killed run had not written, and reused the rest
    assert resumed.vectors_reused > 0 and resumed.vectors_embedded > 0
    assert resumed.vectors_reused + resumed.vectors_embedded == resumed.vectors
    assert not (tmp_path / ".idx.work").exists()  # published: the checkpoints are gone

    fresh = build_with({**cfg, "build.output": str(tmp_path / "fresh")})
    # (an embedding actor that Ray restarts mid-build reuses its own finished parts: reused may be > 0)
    assert fresh.vectors_reused + fresh.vectors_embedded == fresh.vectors == resumed.vectors
    resumed_manifest = load_manifest(out, verify=True).data
    fresh_manifest = load_manifest(tmp_path / "fresh", verify=True).data
    assert resumed_manifest["files"] == fresh_manifest["files"]  # byte-identical shards and chunks
    assert resumed_manifest["content_hash"] == fresh_manifest["content_hash"]
    assert resumed_manifest["index_version"] == fresh_manifest["index_version"]
