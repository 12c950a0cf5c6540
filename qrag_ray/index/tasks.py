"""The Ray tasks after the stream: train one IVF/PQ quantizer for all shards (so their scores compare),
build each shard from its checkpoint parts, assemble the staging dir. Every task works under the work
dir, so a re-run finds what a killed one finished."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qrag_ray.config.index import FaissConfig, IndexConfig
from qrag_ray.index import workdir
from qrag_ray.index.faiss_search import set_faiss_threads
from qrag_ray.index.format import (
    CHUNKS,
    atomic_write,
    atomic_write_text,
    shard_bm25,
    shard_chunks,
    stable_hash,
    write_arrow,
)
from qrag_ray.index.lexical import globalize_idf
from qrag_ray.index.metadata_columns import chunk_table
from qrag_ray.index.rows import CHUNK_PART_SCHEMA, check_unique_chunks, vector_schema
from qrag_ray.index.udfs import SAMPLE_STRIPE
from qrag_ray.index.writer import build_faiss, faiss_factory, vectors_of, write_shard
from qrag_ray.io.metadata import merge_field_types


def needs_training(factory: str, dim: int) -> bool:
    return not faiss_factory(dim, factory).is_trained


def sample_vectors(work: Path, total_rows: int, size: int, keep: np.ndarray | None = None) -> np.ndarray:
    """A deterministic sample of `size` stored vectors, part by part: rows whose key (a hash) falls under a
    threshold, then the `size` smallest keys."""
    modulus = 1_000_003
    striped = total_rows / SAMPLE_STRIPE >= 3 * size  # the stripe alone holds enough candidates
    pool = total_rows / SAMPLE_STRIPE if striped else total_rows
    cut = int(np.ceil(modulus * min(1.0, 1.5 * size / max(1.0, pool))))
    keys = []
    vecs = []
    for file in workdir.parquet_files(work / ("sample" if striped else "vectors")):
        table = pq.read_table(file, columns=["row_key", "store", "vector"])
        row_keys = table.column("row_key").to_numpy()
        mine = workdir.isin_sorted(row_keys, keep) if keep is not None else np.ones(len(row_keys), bool)
        sel = np.flatnonzero((row_keys % modulus < cut) & mine & table.column("store").to_numpy(zero_copy_only=False))
        if len(sel):
            keys.append(row_keys[sel])
            vecs.append(vectors_of(table.take(pa.array(sel, pa.int64()))))
    if not keys:
        return np.zeros((0, 0), np.float32)
    _, first = np.unique(np.concatenate(keys), return_index=True)  # a re-embedded row may sit in two files
    return np.ascontiguousarray(np.concatenate(vecs)[first[:size]])  # np.unique sorts: the smallest keys


def train_quantizer(work: str, factory: str, train_sample: int, total_rows: int, dim: int,
                    run: str | None = None, threads: int = 1) -> str:
    """Train the quantizer once on a sample of all shards' vectors; returns the saved empty index's path."""
    work_dir = Path(work)
    set_faiss_threads(threads)
    keep = None
    if run is not None:  # only this run's rows: an append/delete trains as a full rebuild would
        keep = workdir.run_row_keys(work_dir, run)
    sample = sample_vectors(work_dir, total_rows, train_sample, keep)
    if not len(sample):
        sample = np.zeros((0, dim), np.float32)
    path = work_dir / "trained" / f"{hashlib.sha256(sample.tobytes() + factory.encode()).hexdigest()[:16]}.faiss"
    if path.is_file():
        return str(path)
    index = build_faiss(sample, FaissConfig(factory=factory, train_sample=max(1, len(sample)), use_gpu=False),
                        add=False)
    atomic_write(path, lambda tmp: faiss.write_index(index, str(tmp)))
    return str(path)


def build_shard(shard: int, work: str, run: str, cfg_json: str, dim: int, trained: str | None,
                fields: dict | None = None, threads: int = 1, gpu: bool = False) -> dict:
    """One shard from this run's chunk parts and the shard's vector parts; reused when a finished build
    of the same inputs is in the work dir. `fields`: the corpus's metadata schema and whether any document
    has a url (`metadata_fields`), so every shard's chunk table has the same typed columns. `threads`,
    `gpu`: the resource plan's build-shards stage."""
    cfg = IndexConfig.model_validate_json(cfg_json)
    work_dir = Path(work)
    set_faiss_threads(threads)
    parts = [p for p in workdir.registered_parts(work_dir, run) if shard in p["shards"]]
    chunk_groups = workdir.shard_row_groups(sorted(work_dir / "chunks" / f"{p['part']}.parquet" for p in parts), shard)
    vec_groups = workdir.shard_row_groups(workdir.parquet_files(work_dir / "vectors"), shard)
    keep = workdir.run_row_keys(work_dir, run, shard)
    sig = stable_hash({"files": [Path(g.path).name for g in chunk_groups + vec_groups],
                       "extra": [trained and Path(trained).name, dim, hashlib.sha256(keep.tobytes()).hexdigest()],
                       **({"fields": fields} if fields else {})})
    out = work_dir / "built" / f"{shard:05d}"
    stats_path = out / "stats.json"
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
        if stats.get("signature") == sig:
            return {**stats, "reused": True}
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    chunks = _concat(workdir.read_row_groups(chunk_groups, CHUNK_PART_SCHEMA.names, shard), CHUNK_PART_SCHEMA)
    chunks = chunks.take(pc.sort_indices(chunks, [("chunk_idx", "ascending")]))
    check_unique_chunks(chunks.column("chunk_idx").to_numpy(), chunks.column("chunk_id"))
    chunks = chunk_table(chunks, **(fields or {}))
    pq.write_table(chunks, out / "chunks.parquet")
    schema = vector_schema(dim)
    table = _concat(workdir.read_row_groups(vec_groups, schema.names, shard), schema)
    table = table.filter(pa.array(workdir.isin_sorted(table.column("row_key").to_numpy(), keep)))
    # one order whatever the parts were: by chunk, then the row's place in its chunk
    table = table.take(pc.sort_indices(table, [("chunk_idx", "ascending"), ("ord", "ascending"),
                                               ("row_key", "ascending")]))
    stats = write_shard(shard, drop_duplicate_rows(table), out, cfg.filters, cfg.faiss, dim, cfg.bm25, trained=trained,
                        gpu=gpu)
    write_arrow(chunks.drop_columns(["shard"]), out / shard_chunks(shard))  # sorted by chunk_idx: searched by it
    stats.update(chunk_rows=int(chunks.num_rows), signature=sig, chunk_table=shard_chunks(shard))
    atomic_write_text(stats_path, json.dumps(stats))
    return {**stats, "reused": False}


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([t.cast(schema) for t in tables]) if tables else schema.empty_table()


def metadata_fields(parts: list[dict]) -> dict:
    """The corpus's metadata from this run's chunk parts (workdir.registered_parts): {"schema": {field:
    type}, "url": bool}; QragError naming both documents when one field has two types."""
    return {"schema": merge_field_types(p.get("metadata") or {} for p in parts),
            "url": any(p.get("url") for p in parts)}


def build_one_shard(shard: int, work: str, run: str, cfg_json: str, dim: int, trained: str | None,
                    fields: dict | None = None, threads: int = 1, gpu: bool = False) -> dict:
    """build_shard as a Ray task: its stats also record the node it ran on (`built_on`)."""
    import ray

    stats = build_shard(shard, work, run, cfg_json, dim, trained, fields, threads, gpu)
    stats["built_on"] = {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    return stats


def drop_duplicate_rows(table: pa.Table) -> pa.Table:
    """One (chunk, kind, text, store) once: the same text generated twice must not count twice."""
    first: dict = {}
    columns = (table.column(c).to_pylist() for c in ("chunk_idx", "kind", "text", "store"))
    for i, identity in enumerate(zip(*columns, strict=True)):
        first.setdefault(identity, i)
    return table if len(first) == table.num_rows else table.take(pa.array(list(first.values()), pa.int64()))


def assemble(work: str, staging: str, num_shards: int, bm25: bool) -> None:
    """Copy the built shards into the staging dir, write chunks.parquet shard by shard and give every
    BM25 shard the global IDF; the work dir stays untouched, so a re-run starts from the same files."""
    work_dir = Path(work)
    staging_dir = Path(staging)
    (staging_dir / "shards").mkdir(parents=True, exist_ok=True)
    schema = pq.read_schema(work_dir / "built" / f"{0:05d}" / "chunks.parquet")  # every shard's: the same typed columns
    with pq.ParquetWriter(staging_dir / CHUNKS, schema) as writer:
        for shard in range(num_shards):
            src = work_dir / "built" / f"{shard:05d}"
            writer.write_table(pq.read_table(src / "chunks.parquet").cast(schema))
            for entry in sorted((src / "shards").iterdir()):
                (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, staging_dir / "shards" / entry.name)
    if bm25:
        globalize_idf([staging_dir / shard_bm25(s) for s in range(num_shards)])
