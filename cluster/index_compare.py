"""Two builds of one corpus and config compared: equal bytes everywhere but the vectors, and the vectors
equal within a float tolerance.

The embedder's float32 sums depend on the shape of the batch a row is encoded in (which rows share a padded
length, how many of them), and a cluster's batches are not a single process's: the same text gives vectors
that differ in the last bits. So a job's index is held to a plain build's this way, not by content_hash
(which hashes the FAISS bytes too); every other file (chunks, row tables, BM25, questions) must be equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VECTOR_SUFFIX = ".faiss"
ATOL = 1e-5  # unit-norm MiniLM vectors: batch-shape differences are ~1e-7


def _manifest(index_dir: Path) -> dict:
    return json.loads((index_dir / "manifest.json").read_text())


def _vectors(path: Path) -> np.ndarray:
    import faiss

    index = faiss.read_index(str(path))
    try:
        return index.reconstruct_n(0, index.ntotal)
    except RuntimeError:  # an IVF index reconstructs through its direct map
        ivf = faiss.extract_index_ivf(index)
        ivf.make_direct_map()
        return index.reconstruct_n(0, index.ntotal)


def differences(first: Path, second: Path, atol: float = ATOL) -> list[str]:
    """What differs between index folders a and b, one line each (empty: the same index)."""
    first_manifest = _manifest(first)
    second_manifest = _manifest(second)
    out = []
    if first_manifest.get("content") != second_manifest.get("content"):
        out.append("content config differs")
    first_files = first_manifest["files"]
    second_files = second_manifest["files"]
    if sorted(first_files) != sorted(second_files):
        out.append(f"file lists differ: only in the first {sorted(set(first_files) - set(second_files))}, "
                   f"only in the second {sorted(set(second_files) - set(first_files))}")
    for rel in sorted(set(first_files) & set(second_files)):
        if first_files[rel] == second_files[rel]:
            continue
        if not rel.endswith(VECTOR_SUFFIX):
            out.append(f"{rel}: bytes differ")
            continue
        first_vectors = _vectors(first / rel)
        second_vectors = _vectors(second / rel)
        if first_vectors.shape != second_vectors.shape:
            out.append(f"{rel}: {first_vectors.shape[0]} vectors against {second_vectors.shape[0]}")
        elif (gap := float(np.abs(first_vectors - second_vectors).max(initial=0.0))) > atol:
            out.append(f"{rel}: vectors differ by up to {gap:.2e} (tolerance {atol:.0e})")
    return out
