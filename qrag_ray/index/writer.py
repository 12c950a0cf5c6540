"""Write one shard: filtered vectors -> FAISS index + row metadata as Arrow IPC (one Ray task per shard).
All vectors of a chunk are in the shard, so per-chunk filters are exact here. The FAISS index comes
from a factory string over inner product (vectors are unit norm: IP = cosine)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa

from qrag_ray.config.index import Bm25Config, FaissConfig, FilterConfig
from qrag_ray.errors import QragError
from qrag_ray.index.format import shard_bm25, shard_faiss, shard_meta, write_arrow
from qrag_ray.index.lexical import build_bm25, lexical_docs
from qrag_ray.index.question_filters import filter_chunk_rows

log = logging.getLogger(__name__)


def vectors_of(table: pa.Table) -> np.ndarray:
    """The `vector` column (fixed-size lists) as a float32 [rows, dim] array."""
    if table.num_rows == 0:
        return np.zeros((0, 0), dtype=np.float32)
    flat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat.reshape(table.num_rows, -1), dtype=np.float32)


def apply_filters(table: pa.Table, vecs: np.ndarray, cfg: FilterConfig) -> tuple[np.ndarray, np.ndarray]:
    """(row mask, vectors) after the per-chunk filters (of a non-empty table): pooled atoms' centroids."""
    chunk_idx = table.column("chunk_idx").to_numpy()
    kind = np.asarray(table.column("kind").to_pylist(), dtype=object)
    qn = table.column("qn").to_numpy()
    store = table.column("store").to_numpy(zero_copy_only=False).astype(bool)
    texts = table.column("text").to_pylist()
    # only pooling changes vectors: without it the shard's vectors are neither copied nor written back
    pooling = cfg.max_atoms is not None
    keep = np.zeros(len(chunk_idx), dtype=bool)
    out = vecs.copy() if pooling else vecs
    order = np.argsort(chunk_idx, kind="stable")
    for grp in np.split(order, np.flatnonzero(np.diff(chunk_idx[order])) + 1):
        keep[grp], pooled = filter_chunk_rows(kind[grp], qn[grp], store[grp], [texts[i] for i in grp], vecs[grp], cfg)
        if pooling:
            out[grp] = pooled
    return keep, out


def faiss_factory(dim: int, factory: str):
    """An empty inner-product index from a factory string; a bad string is the user's error."""
    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError:
        raise QragError(f"invalid FAISS factory string '{factory}' (e.g. Flat, HNSW32, IVF1024,PQ48)") from None


def build_faiss(vecs: np.ndarray, cfg: FaissConfig, seed: int = 0, add: bool = True, trained: str | None = None,
                gpu: bool = False):
    """`trained`: a saved, trained empty index (the build's shared quantizer) to fill instead of training
    one; `add=False` returns the trained index empty. `gpu`: the resource plan put this build on a GPU (a
    factory FAISS has a GPU version of); where FAISS sees none it builds on CPU, unless faiss.use_gpu is true."""
    index = faiss.read_index(trained) if trained is not None else faiss_factory(vecs.shape[1], cfg.factory)
    if gpu and faiss.get_num_gpus() == 0:
        if cfg.use_gpu is True:
            raise RuntimeError("faiss.use_gpu is true but FAISS sees no GPU (install faiss-gpu on a GPU worker)")
        log.warning("the shard build holds a GPU but FAISS sees none (faiss-cpu installed?): building on CPU")
        gpu = False
    work = index
    if gpu:
        try:
            work = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
        except RuntimeError as error:  # a variant the cloner refuses (e.g. PQ over 48 bytes per code): CPU
            log.warning("FAISS cannot build '%s' on the GPU (%s): building on CPU", cfg.factory, error)
    if not work.is_trained:
        sample_size = min(len(vecs), cfg.train_sample)
        if sample_size < len(vecs):
            sample = vecs[np.random.default_rng(seed).choice(len(vecs), size=sample_size, replace=False)]
        else:
            sample = vecs
        try:
            work.train(sample)
        except RuntimeError as error:
            # IVF / PQ need more training vectors than centroids: on a small shard a user error, not a crash
            raise QragError(f"cannot train FAISS '{cfg.factory}' on {sample_size} vectors "
                            f"({str(error).split('Error: ')[-1].strip()}); use a smaller "
                            "nlist/PQ code, or Flat/HNSW32") from None
    if add and len(vecs):
        work.add(vecs)
    return faiss.index_gpu_to_cpu(work) if work is not index else index


def write_shard(shard: int, table: pa.Table, out_dir: str | Path, filters: FilterConfig, index_cfg: FaissConfig,
                dim: int, bm25: Bm25Config | None = None, trained: str | None = None, gpu: bool = False) -> dict:
    """Build and write shard files under out_dir; returns stats for the manifest."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    (out_dir / "shards").mkdir(parents=True, exist_ok=True)
    vecs = vectors_of(table) if table.num_rows else np.zeros((0, dim), np.float32)
    before = int(np.sum(table.column("store").to_numpy(zero_copy_only=False)))
    keep, vecs = apply_filters(table, vecs, filters) if table.num_rows else (np.zeros(0, bool), vecs)
    rows = np.flatnonzero(keep)
    # stable order: by chunk then original order, so a chunk's vectors are contiguous ids
    rows = rows[np.argsort(table.column("chunk_idx").to_numpy()[rows], kind="stable")]
    kept = table.take(pa.array(rows, type=pa.int64()))
    kvecs = np.ascontiguousarray(vecs[rows])
    if len(kvecs) and kvecs.shape[1] != dim:
        raise RuntimeError(f"shard {shard}: vectors have dim {kvecs.shape[1]}, expected {dim}")
    index = build_faiss(kvecs, index_cfg, seed=shard, trained=trained, gpu=gpu)
    faiss.write_index(index, str(out_dir / shard_faiss(shard)))
    meta = pa.table({"chunk_idx": pa.array(kept.column("chunk_idx").to_numpy(), type=pa.int64()),
                     "kind": pa.array(kept.column("kind").to_pylist(), type=pa.string()).dictionary_encode(),
                     "text": pa.array(kept.column("text").to_pylist(), type=pa.string())})
    write_arrow(meta, out_dir / shard_meta(shard))
    lexical = {}
    if bm25 is not None and bm25.enabled:
        # from all rows, before the vector filters: a pruned question still names the chunk's words
        ids, docs = lexical_docs(table.column("chunk_idx").to_numpy(), table.column("kind").to_pylist(),
                                 table.column("text").to_pylist(), table.column("qn").to_numpy(), bm25.doc2query)
        vocab = build_bm25(ids, docs, out_dir / shard_bm25(shard), bm25.k1, bm25.b, bm25.stemmer)
        lexical = {"bm25": shard_bm25(shard), "bm25_docs": int(len(ids)), "bm25_vocab": vocab}
    return {**lexical, "id": shard, "faiss": shard_faiss(shard), "meta": shard_meta(shard),
            "vectors": int(index.ntotal), "vectors_before_filters": before,
            "chunks": len(np.unique(meta.column("chunk_idx").to_numpy())),
            "kinds": dict(Counter(meta.column("kind").to_pylist())), "seconds": round(time.perf_counter() - started, 3)}
