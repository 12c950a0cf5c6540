"""cluster/index_compare.py on real FAISS files: equal bytes pass, float-level vector noise passes, a vector
moved further, a changed non-vector file or a missing file is named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import faiss
import numpy as np

from cluster.index_compare import differences


def _index(folder: Path, vectors: np.ndarray, chunks: bytes = b"chunks") -> Path:
    (folder / "shards").mkdir(parents=True)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors.astype(np.float32))
    faiss.write_index(index, str(folder / "shards" / "00000.faiss"))
    (folder / "chunks.parquet").write_bytes(chunks)
    files = {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / "manifest.json").write_text(json.dumps({"files": files, "content": {"representation": "hype"}}))
    return folder


def test_equal_indexes_and_float_noise_pass_and_real_differences_are_named(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((20, 8)).astype(np.float32)
    first = _index(tmp_path / "a", vectors)
    assert differences(first, _index(tmp_path / "same", vectors)) == []
    noisy = vectors + np.float32(3e-7) * rng.standard_normal(vectors.shape).astype(np.float32)
    assert differences(first, _index(tmp_path / "noisy", noisy)) == []
    moved = vectors.copy()
    moved[3, 0] += 1e-3
    [line] = differences(first, _index(tmp_path / "moved", moved))
    assert line.startswith("shards/00000.faiss: vectors differ by up to 1.00e-03")
    assert differences(first, _index(tmp_path / "text", vectors, b"other chunks")) == ["chunks.parquet: bytes differ"]
    assert differences(first, _index(tmp_path / "fewer", vectors[:19])) == ["shards/00000.faiss: 20 vectors against 19"]
