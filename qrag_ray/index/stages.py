"""Ray wiring of the streaming, resumable build: the map UDFs and the tasks that write checkpoints.

The stream (read -> chunk -> vector rows -> embed) runs on Ray Data's streaming executor: stages
overlap and backpressure bounds what is in flight. The chunk UDF and the embedding actors write their
own checkpoint parts into the work dir (qrag_ray.index.checkpoint) and pass on only what the next
stage needs; the embedding actors pass on a one-row summary per batch, so the driver sums counters and
never holds vectors or text. After the stream: one task trains the IVF/PQ quantizer on a sample of all
vectors (every shard gets a copy, so scores from different shards compare), one task per shard
assembles its files from the parts, one task writes chunks.parquet and globalizes the BM25 IDF.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qrag_ray.errors import QragError
from qrag_ray.index import checkpoint as ck

CHUNK_SCHEMA = pa.schema([("chunk_idx", pa.int64()), ("chunk_id", pa.string()), ("doc_id", pa.string()),
                          ("title", pa.string()), ("text", pa.string()), ("shard", pa.int32())])
VECTOR_COLS = ["chunk_idx", "kind", "text", "qn", "ord", "store", "row_key", "vector"]
# rows whose key is a multiple of this are also written to work/sample: a large build draws its
# training sample from there instead of scanning every vector part (88M rows -> ~86k candidates)
SAMPLE_STRIPE = 1024
# a generated row's position in its chunk: after every base row, grouped by the request's unit
GEN_ORD_BASE = 100_000


# ---------------------------------------------------------------- chunk stage (tasks)


def write_chunk_part(cols: dict, n_docs: int, work: Path, run: str, seconds: float = 0.0) -> None:
    """Write one batch's chunk rows as per-shard parts and register them for this run.

    Duplicate chunk ids inside the batch are a corpus error caught here, early; across batches the
    shard task catches them. Parts are named by content, so a retried or resumed batch rewrites the
    same file."""
    n = len(cols["chunk_idx"])
    ids = np.asarray(cols["chunk_idx"], np.int64)
    if n and len(np.unique(ids)) != n:
        uniq, first, counts = np.unique(ids, return_index=True, return_counts=True)
        bad = cols["chunk_id"][int(first[np.flatnonzero(counts > 1)[0]])]
        raise QragError(f"duplicate document id: chunk {bad!r} occurs twice (document ids must be unique)")
    table = pa.table({k: pa.array(list(cols[k]) if k in ("chunk_id", "doc_id", "title", "text") else cols[k],
                                  type=CHUNK_SCHEMA.field(k).type) for k in CHUNK_SCHEMA.names})
    h = hashlib.blake2b(digest_size=10)
    h.update(ids.tobytes())
    for t in table.column("text").to_pylist():
        h.update(t.encode())
    h.update(str(n_docs).encode())
    name = h.hexdigest()
    shards = sorted(set(table.column("shard").to_pylist()))
    for s in shards:
        sub = table.filter(pc.equal(table.column("shard"), s))
        ck.atomic_write_parquet(sub, work / "chunks" / ck.shard_dir_name(s) / f"{name}.parquet")
    ck.atomic_write_text(ck.run_registry(work, run) / f"{name}.json",
                         json.dumps({"part": name, "documents": n_docs, "chunks": n, "shards": shards,
                                     "seconds": round(seconds, 4)}))


# ---------------------------------------------------------------- embed stage (actor pool)


def vector_columns(rows: list[dict]) -> dict:
    """Vector rows as numpy columns (the embed stage's input)."""
    cols = {"chunk_idx": np.int64, "shard": np.int32, "kind": object, "text": object, "embed_text": object,
            "qn": np.int32, "ord": np.int32, "store": bool}
    return {c: np.asarray([r[c] for r in rows], dtype=t) if rows else np.zeros(0, t) for c, t in cols.items()}


class EmbedSink:
    """Embeds the rows no earlier run embedded and writes them as per-shard parts in the work dir.

    Returns one summary row per batch (counts and busy seconds), never the vectors: the shard tasks
    read them from the parts. Vectors are computed with `encode_canonical`, so a row's vector is the
    same bits whichever rows shared its batch (a resumed run batches differently)."""

    def __init__(self, model: str, batch_size: int, max_seq_length: int | None, threads: int | None,
                 work: str, question_kind: str | None, run: str, backend: str = "auto"):
        from qrag_ray.embedding import Embedder

        self.e = Embedder(model, batch_size, max_seq_length, threads, backend)
        self.work = Path(work)
        self.qk = question_kind
        self.run = run
        self.done = ck.done_row_keys(self.work)

    def __call__(self, batch: dict) -> dict:
        from qrag_ray.embedding import encode_canonical

        t0 = time.perf_counter()
        n = len(batch["chunk_idx"])
        keys = ck.row_keys(batch["chunk_idx"], batch["kind"], batch["ord"], batch["text"], batch["embed_text"])
        todo = np.flatnonzero(~ck.isin_sorted(keys, self.done))
        questions = 0
        if self.qk:
            questions = int(np.sum((batch["kind"] == self.qk) & (batch["qn"] >= 0)))
        # this run's rows, reused or not: the shard keeps exactly these (an older corpus's rows stay out)
        for sh in np.unique(batch["shard"]):
            k = keys[batch["shard"] == sh]
            ck.atomic_save_npy(k, ck.run_keys_dir(self.work, self.run, int(sh)) / f"{ck.part_name(k)}.npy")
        if len(todo):
            vecs = encode_canonical(self.e.st, [str(batch["embed_text"][i]) for i in todo], self.e.batch_size)
            dim = vecs.shape[1]
            shard = batch["shard"][todo]
            for s in np.unique(shard):
                sel = np.flatnonzero(shard == s)
                rows = todo[sel]
                flat = pa.array(vecs[sel].reshape(-1), type=pa.float32())
                t = pa.table({
                    "chunk_idx": pa.array(batch["chunk_idx"][rows], pa.int64()),
                    "kind": pa.array(batch["kind"][rows].tolist(), pa.string()),
                    "text": pa.array(batch["text"][rows].tolist(), pa.string()),
                    "qn": pa.array(batch["qn"][rows], pa.int32()),
                    "ord": pa.array(batch["ord"][rows], pa.int32()),
                    "store": pa.array(batch["store"][rows].astype(bool), pa.bool_()),
                    "row_key": pa.array(keys[rows], pa.int64()),
                    "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
                })
                name = ck.part_name(keys[rows])
                stripe = (keys[rows] % SAMPLE_STRIPE) == 0
                if stripe.any():  # the rows a large build trains its quantizer from (before the part: see sample_vectors)
                    ck.atomic_write_parquet(t.filter(pa.array(stripe)),
                                            self.work / "sample" / ck.shard_dir_name(int(s)) / f"{name}.parquet")
                ck.atomic_write_parquet(t, self.work / "vectors" / ck.shard_dir_name(int(s)) / f"{name}.parquet")
        return {"rows": np.asarray([n]), "embedded": np.asarray([len(todo)]), "reused": np.asarray([n - len(todo)]),
                "questions": np.asarray([questions]), "seconds": np.asarray([time.perf_counter() - t0])}


# ---------------------------------------------------------------- after the stream (tasks)


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
    wait on each other when the node is busy (a 1-CPU IVF training took 92 s instead of ~2 s)."""
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
