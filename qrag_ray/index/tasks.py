"""The Ray tasks after the stream: train the shared quantizer, build each shard from its checkpoint
parts, assemble the staging dir.

One task trains the IVF/PQ quantizer on a sample of all vectors (every shard gets a copy, so scores
from different shards compare), one task per shard assembles its files from the parts, one task writes
chunks.parquet and globalizes the BM25 IDF. Every task reads and writes files under the work dir, so
a re-run finds what a killed one finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qrag_ray.errors import QragError
from qrag_ray.index import checkpoint as ck
from qrag_ray.index.rows import CHUNK_SCHEMA
from qrag_ray.index.udfs import SAMPLE_STRIPE

VECTOR_COLS = ["chunk_idx", "kind", "text", "qn", "ord", "store", "row_key", "vector"]



def needs_training(factory: str, dim: int) -> bool:
    import faiss

    try:
        return not faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT).is_trained
    except RuntimeError:
        raise QragError(f"invalid FAISS factory string '{factory}' (e.g. Flat, HNSW32, IVF1024,PQ48)") from None


def sample_vectors(work: Path, total_rows: int, n: int, keep: np.ndarray | None = None) -> np.ndarray:
    """A deterministic sample of about n stored vectors over all parts: rows whose key falls under a
    threshold (keys are hashes, so this is uniform), then the n smallest keys. Part by part, so memory
    is the sample, not the corpus."""
    modulus = 1_000_003
    striped = total_rows / SAMPLE_STRIPE >= 3 * n  # the stripe alone holds enough candidates
    pool = total_rows / SAMPLE_STRIPE if striped else total_rows
    frac = min(1.0, 1.5 * n / max(1.0, pool))
    cut = int(np.ceil(modulus * frac))
    keys, vecs = [], []
    for f in ck.parquet_files(work / ("sample" if striped else "vectors")):
        t = pq.read_table(f, columns=["row_key", "store", "vector"])
        k = t.column("row_key").to_numpy()
        mine = ck.isin_sorted(k, keep) if keep is not None else np.ones(len(k), bool)
        sel = np.flatnonzero((k % modulus < cut) & mine & t.column("store").to_numpy(zero_copy_only=False))
        if len(sel):
            from qrag_ray.index.writer import vectors_of

            keys.append(k[sel])
            vecs.append(vectors_of(t.take(pa.array(sel, pa.int64()))))
    if not keys:
        return np.zeros((0, 0), np.float32)
    k = np.concatenate(keys)
    _, first = np.unique(k, return_index=True)  # a row re-embedded after a kill may sit in two files
    first = first[:n]  # np.unique sorts: the n smallest keys
    return np.ascontiguousarray(np.concatenate(vecs)[first])


def train_quantizer(work: str, factory: str, train_sample: int, total_rows: int, dim: int,
                    run: str | None = None, shards: int = 0) -> str:
    """Train the factory's quantizer once on a sample of every shard's vectors; the trained, empty
    index is written under the work dir (named by the sample's content) and its path returned."""
    import faiss

    from qrag_ray.config import IndexBuildConfig
    from qrag_ray.index.writer import build_faiss

    w = Path(work)
    _one_thread_per_cpu()
    keep = None
    if run is not None:  # only this run's rows: an append/delete trains as a full rebuild would
        keep = np.unique(np.concatenate([ck.run_row_keys(w, run, s) for s in range(shards)] or [np.zeros(0, np.int64)]))
    sample = sample_vectors(w, total_rows, train_sample, keep)
    if not len(sample):
        sample = np.zeros((0, dim), np.float32)
    name = hashlib.sha256(sample.tobytes() + factory.encode()).hexdigest()[:16]
    path = w / "trained" / f"{name}.faiss"
    if path.is_file():
        return str(path)
    index = build_faiss(sample, IndexBuildConfig(factory=factory, train_sample=max(1, len(sample)), use_gpu=False),
                        add=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)
    return str(path)


def _one_thread_per_cpu() -> None:
    """FAISS (OpenMP) threads = the CPUs this Ray task was given: more threads than granted CPUs
    wait on each other when the node is busy."""
    import faiss

    try:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    except Exception:  # noqa: BLE001 - outside Ray: leave FAISS's default
        return
    faiss.omp_set_num_threads(max(1, int(cpus)))


def _signature(files: list[Path], extra) -> str:
    return ck.stable_hash({"files": [f.name for f in files], "extra": extra})


def build_shard(shard: int, work: str, run: str, cfg_json: str, dim: int, trained: str | None) -> dict:
    """One shard from its parts: chunk rows of this run, every vector part of the shard. Skipped when
    a finished build of the same inputs is already in the work dir (a resumed run)."""
    from qrag_ray.config import IndexConfig
    from qrag_ray.index.writer import write_shard

    cfg = IndexConfig.model_validate_json(cfg_json)
    w = Path(work)
    _one_thread_per_cpu()
    sd = ck.shard_dir_name(shard)
    parts = [p for p in ck.registered_parts(w, run) if shard in p["shards"]]
    chunk_files = sorted(w / "chunks" / sd / f"{p['part']}.parquet" for p in parts)
    vec_files = ck.parquet_files(w / "vectors" / sd)
    keep = ck.run_row_keys(w, run, shard)
    sig = _signature(chunk_files + vec_files, [trained and Path(trained).name, dim,
                                               hashlib.sha256(keep.tobytes()).hexdigest()])
    out = w / "built" / f"{shard:05d}"
    stats_path = out / "stats.json"
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
        if stats.get("signature") == sig:
            stats["reused"] = True
            return stats
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    chunks = pa.concat_tables([pq.read_table(f).cast(CHUNK_SCHEMA) for f in chunk_files]) if chunk_files \
        else CHUNK_SCHEMA.empty_table()
    chunks = chunks.take(pc.sort_indices(chunks, [("chunk_idx", "ascending")]))
    ids = chunks.column("chunk_idx").to_numpy()
    if len(ids) > 1 and np.any(ids[1:] == ids[:-1]):
        bad = chunks.column("chunk_id")[int(np.flatnonzero(ids[1:] == ids[:-1])[0])].as_py()
        raise QragError(f"duplicate document id: chunk {bad!r} occurs twice (document ids must be unique)")
    pq.write_table(chunks, out / "chunks.parquet")
    if vec_files:
        table = pa.concat_tables([pq.read_table(f, columns=VECTOR_COLS) for f in vec_files])
    else:
        table = pa.table({"chunk_idx": pa.array([], pa.int64()), "kind": pa.array([], pa.string()),
                          "text": pa.array([], pa.string()), "qn": pa.array([], pa.int32()),
                          "ord": pa.array([], pa.int32()), "store": pa.array([], pa.bool_()),
                          "row_key": pa.array([], pa.int64()), "vector": pa.array([], pa.list_(pa.float32(), dim))})
    table = table.filter(pa.array(ck.isin_sorted(table.column("row_key").to_numpy(), keep)))
    # one order whatever the parts were: by chunk, then the row's place in its chunk
    table = table.take(pc.sort_indices(table, [("chunk_idx", "ascending"), ("ord", "ascending"),
                                                       ("row_key", "ascending")]))
    table = drop_duplicate_rows(table)
    stats = write_shard(shard, table, out, cfg.filters, cfg.index, dim, cfg.bm25, trained=trained)
    stats["chunk_rows"] = int(chunks.num_rows)
    stats["signature"] = sig
    ck.atomic_write_text(stats_path, json.dumps(stats))
    stats["reused"] = False
    return stats


def build_one_shard(shard: int, work: str, run: str, cfg_json: str, dim: int, trained: str | None) -> dict:
    """build_shard as a Ray task: its stats also record the node it ran on (`built_on`)."""
    import ray

    stats = build_shard(shard, work, run, cfg_json, dim, trained)
    ctx = ray.get_runtime_context()
    stats["built_on"] = {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    return stats


def drop_duplicate_rows(table: pa.Table) -> pa.Table:
    """One (chunk, kind, text, store) once: the same text generated twice must not count twice."""
    if table.num_rows == 0:
        return table
    keys = list(zip(table.column("chunk_idx").to_pylist(), table.column("kind").to_pylist(),
                    table.column("text").to_pylist(), table.column("store").to_pylist()))
    seen, keep = set(), []
    for i, k in enumerate(keys):
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return table if len(keep) == table.num_rows else table.take(pa.array(keep, pa.int64()))


def assemble(work: str, staging: str, num_shards: int, bm25: bool) -> None:
    """Copy the built shards into the staging dir, write chunks.parquet shard by shard (one shard's
    chunk table in memory at a time) and give every BM25 shard the global IDF. The work dir's copies
    stay untouched, so a crash here and a re-run start from the same files."""
    from qrag_ray.index.format import CHUNKS

    w, st = Path(work), Path(staging)
    (st / "shards").mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(st / CHUNKS, CHUNK_SCHEMA) as writer:
        for s in range(num_shards):
            src = w / "built" / f"{s:05d}"
            writer.write_table(pq.read_table(src / "chunks.parquet").cast(CHUNK_SCHEMA))
            for p in sorted((src / "shards").iterdir()):
                dst = st / "shards" / p.name
                if p.is_dir():
                    shutil.copytree(p, dst)
                else:
                    shutil.copy2(p, dst)
    if bm25:
        from qrag_ray.index.format import shard_bm25
        from qrag_ray.index.lexical import globalize_idf

        globalize_idf([st / shard_bm25(s) for s in range(num_shards)])
