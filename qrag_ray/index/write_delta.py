"""A tenant's written documents as a delta index: the documents of some log entries through the tenant's
own representation (the base version's recorded config: chunker, vector kinds, title prefix, filters,
embedder, BM25), in process with the build's pure parts (text/chunking.py, index/rows.py,
index/representations.py, index/writer.py, index/lexical.py), written in the standard on-disk format
(index/format.py) as a one-shard index with a Flat FAISS. Its BM25 scores use the IDF of the base plus its
own documents, so its raw BM25 scores compare with the base shards'. A delta also keeps every vector row
it embedded (`vectors.parquet`, auxiliary rows included), so deltas merge without embedding again and a
compaction's build finds them in its work dir.

Documents travel as records in the log's form: {doc_id, title, text, url ("" for none), metadata
({field: JSON value}, qrag_ray.io.metadata's normal form), hash}; `record_hash` is their content hash."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qrag_ray.config.index import FaissConfig, IndexConfig, representation_plan
from qrag_ray.config.search_policy import GENERATED_KINDS
from qrag_ray.errors import QragError
from qrag_ray.index import workdir
from qrag_ray.index.format import (
    CHUNKS,
    Counts,
    EmbedderInfo,
    FaissInfo,
    IndexDescription,
    Manifest,
    ShardEntry,
    load_manifest,
    publish,
    shard_bm25,
    shard_chunks,
    write_arrow,
    write_manifest,
)
from qrag_ray.index.incremental import published_config
from qrag_ray.index.lexical import rescale_idf, shard_frequencies
from qrag_ray.index.metadata_columns import METADATA, URL, chunk_table, json_values, typed_struct
from qrag_ray.index.rows import CHUNK_PART_SCHEMA, base_vector_columns, check_unique_chunks, chunk_rows, vector_schema
from qrag_ray.index.tasks import drop_duplicate_rows
from qrag_ray.index.writer import write_shard
from qrag_ray.io.metadata import to_json

DELTA_VECTORS = "vectors.parquet"  # every embedded row of the delta, auxiliary ones included
DELTA_INFO = "delta"  # the manifest key holding the delta's sequence range and base version


def record_hash(doc_id: str, title: str, text: str, url: str, metadata: dict) -> str:
    """A document's content hash as the log records it: equal for the same id, title, text, url and
    metadata (in their JSON form), so a repeated write is recognised."""
    body = json.dumps([doc_id, title, text, url or "", metadata or {}], sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def writable_reason(manifest: Manifest) -> str | None:
    """Why the index of `manifest` cannot take writes through the API (None: it can)."""
    data = published_config(manifest)
    backend = (data.get("generator") or {}).get("backend") or "none"
    if backend == "precomputed":
        return ("its questions came with the corpus (generator: precomputed), and a written document has none; "
                "add documents with `qrag index --append`")
    if backend != "none" or set(manifest.kinds or []) & set(GENERATED_KINDS):
        return ("it was built with an LLM generator, which writes through the API do not run yet; add documents "
                "with `qrag index --append` and `qrag publish`")
    return None


def delta_config(base: Manifest) -> IndexConfig:
    """The config a delta of `base` is built with: the base's own, on one shard with a Flat FAISS."""
    data = published_config(base)
    data["shards"] = 1
    data["faiss"] = {**(data.get("faiss") or {}), "factory": "Flat"}
    data.pop("build", None)
    return IndexConfig.model_validate(data)


class DeltaEmbedder:
    """The tenant's embedder in this process, run as a build runs it on the same device: on CPU the same
    backend and canonical forward passes (EmbedSink's), so a delta's vectors have the bits a CPU build would
    give them; on a GPU the GPU build's passes (by tokens), as close to a GPU build's as two of those are."""

    def __init__(self, cfg: IndexConfig, threads: int | None = None, device: str = "cpu"):
        from qrag_ray.embedding import Forward, load_sentence_transformer
        from qrag_ray.embedding.forward import default_tokens_per_batch

        run = cfg.build.embedder
        self.model = cfg.embedder.model
        self.st = load_sentence_transformer(cfg.embedder.model, device=device,
                                            max_seq_length=cfg.embedder.max_seq_length, backend=run.backend,
                                            threads=threads, dtype=cfg.embedder.dtype)
        on_gpu = str(self.st.device).startswith("cuda")
        self.forward = Forward(self.st, run.tokens_per_batch or default_tokens_per_batch(on_gpu),
                               canonical_rows=None if on_gpu else run.batch_size)

    def __call__(self, texts: list[str], on_pass: Callable[[int], None] | None = None) -> np.ndarray:
        from qrag_ray.embedding.tokens import token_ids

        ids, lens = token_ids(self.st.tokenizer, [str(t) for t in texts], int(self.st.max_seq_length or 512))
        return self.forward(ids, lens, on_pass)


@dataclass(frozen=True)
class DeltaRows:
    """A delta's content before it is written: its chunks (CHUNK_PART_SCHEMA: url and metadata as JSON
    text) and every embedded vector row (the work dir's vector parts' schema plus `shard`)."""

    chunks: pa.Table
    vectors: pa.Table

    @property
    def doc_ids(self) -> set[str]:
        return set(self.chunks.column("doc_id").to_pylist())

    def keep(self, docs: Iterable[str]) -> "DeltaRows":
        """Only the chunks and rows of these documents."""
        wanted = pa.array(sorted(set(docs)), pa.string())
        chunk_mask = pc.is_in(self.chunks.column("doc_id"), value_set=wanted)
        chunks = self.chunks.filter(chunk_mask)
        keys = pa.array(chunks.column("chunk_idx").to_numpy(), pa.int64())
        return DeltaRows(chunks, self.vectors.filter(pc.is_in(self.vectors.column("chunk_idx"), value_set=keys)))

    @staticmethod
    def concat(parts: list["DeltaRows"], dim: int) -> "DeltaRows":
        chunks = [p.chunks.cast(CHUNK_PART_SCHEMA) for p in parts]
        vectors = [p.vectors.cast(_vector_table_schema(dim)) for p in parts]
        return DeltaRows(pa.concat_tables(chunks) if chunks else CHUNK_PART_SCHEMA.empty_table(),
                         pa.concat_tables(vectors) if vectors else _vector_table_schema(dim).empty_table())


def _vector_table_schema(dim: int) -> pa.Schema:
    return vector_schema(dim).append(pa.field("shard", pa.int32()))


def _aux_questions(cfg: IndexConfig) -> bool:
    filters = cfg.filters
    return (filters.prune_tau is not None or filters.min_question_chunk_sim is not None
            or filters.require_content_overlap)


def document_chunks(records: list[dict], cfg: IndexConfig) -> list[dict]:
    """The chunk rows of some log records (placed for `cfg`'s shard count), in record order."""
    out = []
    for record in records:
        doc = {"doc_id": record["doc_id"], "title": record.get("title") or "", "text": record["text"],
               "url": record.get("url") or "", "metadata": to_json(record.get("metadata") or {})}
        out += chunk_rows(doc, cfg)
    return out


@dataclass(frozen=True)
class DeltaInput:
    """Some records' chunks and the vector rows to embed for them (before the model runs)."""

    chunks: list[dict]
    columns: dict | None  # index/rows.py's vector columns (None: no chunk)

    @property
    def rows(self) -> int:
        return 0 if self.columns is None else len(self.columns["chunk_idx"])

    def chunks_of(self) -> dict[str, int]:
        """Chunks per document."""
        out: dict[str, int] = {}
        for chunk in self.chunks:
            out[chunk["doc_id"]] = out.get(chunk["doc_id"], 0) + 1
        return out


def delta_input(records: list[dict], cfg: IndexConfig) -> DeltaInput:
    """The records' chunks and vector rows through the representation of `cfg` (a `delta_config`)."""
    kinds, _ = representation_plan(cfg)
    chunks = document_chunks(records, cfg)
    return DeltaInput(chunks, base_vector_columns(chunks, kinds, cfg, _aux_questions(cfg)) if chunks else None)


def embed_input(todo: DeltaInput, embedder: DeltaEmbedder, dim: int,
                on_pass: Callable[[int], None] | None = None) -> DeltaRows:
    """Embed `todo`'s rows (`on_pass` gets the rows of each forward pass as it finishes): its DeltaRows."""
    columns = todo.columns
    chunks = pa.table({k: pa.array([c[k] for c in todo.chunks], type=CHUNK_PART_SCHEMA.field(k).type)
                       for k in CHUNK_PART_SCHEMA.names}, schema=CHUNK_PART_SCHEMA)
    if not todo.rows:
        return DeltaRows(chunks, _vector_table_schema(dim).empty_table())
    embeddings = embedder(list(columns["embed_text"]), on_pass)
    if embeddings.shape[1] != dim:
        raise QragError(f"the embedder gives {embeddings.shape[1]}-d vectors, the index holds {dim}-d ones")
    keys = workdir.row_keys(columns["chunk_idx"], columns["kind"], columns["ord"], columns["text"],
                            columns["embed_text"])
    flat = pa.array(np.ascontiguousarray(embeddings, np.float32).reshape(-1), type=pa.float32())
    vectors = pa.table({"chunk_idx": pa.array(columns["chunk_idx"], pa.int64()), "kind": list(columns["kind"]),
                        "text": list(columns["text"]), "qn": pa.array(columns["qn"], pa.int32()),
                        "ord": pa.array(columns["ord"], pa.int32()), "store": pa.array(columns["store"], pa.bool_()),
                        "row_key": pa.array(keys, pa.int64()),
                        "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
                        "shard": pa.array(columns["shard"], pa.int32())}, schema=_vector_table_schema(dim))
    return DeltaRows(chunks, vectors)


def read_delta_rows(delta_dir: str | Path, dim: int) -> DeltaRows:
    """A written delta's content back (its chunk table's typed metadata in the JSON form it came in)."""
    delta_dir = Path(delta_dir)
    table = pq.read_table(delta_dir / CHUNKS)
    meta = (json_values(table.column(METADATA).to_pylist()) if METADATA in table.column_names
            else [{}] * table.num_rows)
    url = table.column(URL).to_pylist() if URL in table.column_names else [None] * table.num_rows
    chunks = pa.table({"chunk_idx": table.column("chunk_idx"), "chunk_id": table.column("chunk_id"),
                       "doc_id": table.column("doc_id"), "title": table.column("title"),
                       "text": table.column("text"), "shard": table.column("shard"),
                       "url": pa.array([u or "" for u in url], pa.string()),
                       "metadata": pa.array([to_json(m) for m in meta], pa.string())}, schema=CHUNK_PART_SCHEMA)
    return DeltaRows(chunks, pq.read_table(delta_dir / DELTA_VECTORS).cast(_vector_table_schema(dim)))


@dataclass(frozen=True)
class BaseTerms:
    """The base version's BM25 collection statistics: its documents and each term's document count over
    all its shards (what a delta's IDF adds its own documents to)."""

    documents: int
    frequencies: dict[str, int]

    @classmethod
    def of(cls, base: Manifest) -> "BaseTerms":
        documents = 0
        frequencies: dict[str, int] = {}
        for shard in base.shards:
            if shard.bm25:
                shard_documents, document_frequency = shard_frequencies(base.file(shard.bm25))
                documents += shard_documents
                for term, count in document_frequency.items():
                    frequencies[term] = frequencies.get(term, 0) + count
        return cls(documents, frequencies)


def canonical_metadata(meta: dict, schema: dict[str, str]) -> dict:
    """Metadata in the form an index returns it (typed by `schema`, then as JSON values): a document's
    written fields and the base's stored ones compare equal when they hold the same values."""
    if not meta:
        return {}
    fields = {f: schema[f] for f in sorted(meta) if f in schema}
    typed = typed_struct([to_json({f: meta[f] for f in fields})], fields).to_pylist() if fields else [{}]
    return {**{f: v for f, v in meta.items() if f not in fields}, **json_values(typed)[0]}


def chunk_fingerprint(chunks: list[tuple[str, str, str]], url: str | None, metadata: dict) -> str:
    """What a document's chunks hold ((chunk id, title, text) in order, url, canonical metadata), hashed."""
    body = json.dumps([sorted(chunks), url or "", metadata], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


def write_delta(rows: DeltaRows, cfg: IndexConfig, base: Manifest, out: Path, schema: dict[str, str] | None,
                terms: BaseTerms | None, info: dict) -> Manifest:
    """Write `rows` as a delta index at `out` (replaced if a crashed attempt left one): one shard, Flat
    FAISS, BM25 when the base has it (IDF of the base plus these documents), the chunk table with `schema`'s
    typed metadata columns, the manifest with `info` (sequence range, base version) under `delta`."""
    started = time.perf_counter()
    dim = base.dim
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        chunks = rows.chunks.take(pc.sort_indices(rows.chunks, [("chunk_idx", "ascending")]))
        check_unique_chunks(chunks.column("chunk_idx").to_numpy(), chunks.column("chunk_id"))
        chunks = chunks.set_column(chunks.schema.get_field_index("shard"), "shard",
                                   pa.array(np.zeros(chunks.num_rows, np.int32)))
        base_url = URL in pq.read_schema(base.file(CHUNKS)).names
        has_url = base_url or any(bool(u) for u in chunks.column("url").to_pylist())
        typed = chunk_table(chunks, schema or None, url=has_url)
        pq.write_table(typed, staging / CHUNKS)
        vectors = rows.vectors.set_column(rows.vectors.schema.get_field_index("shard"), "shard",
                                          pa.array(np.zeros(rows.vectors.num_rows, np.int32)))
        vectors = vectors.take(pc.sort_indices(vectors, [("chunk_idx", "ascending"), ("ord", "ascending"),
                                                         ("row_key", "ascending")]))
        pq.write_table(vectors, staging / DELTA_VECTORS)
        bm25 = cfg.bm25 if base.has_bm25 else cfg.bm25.model_copy(update={"enabled": False})
        stats = write_shard(0, drop_duplicate_rows(vectors), staging, cfg.filters,
                            FaissConfig(factory="Flat"), dim, bm25)
        write_arrow(typed.drop_columns(["shard"]), staging / shard_chunks(0))
        if bm25.enabled and terms is not None:
            delta_documents, document_frequency = shard_frequencies(staging / shard_bm25(0))
            rescale_idf(staging / shard_bm25(0), terms.documents + delta_documents,
                        {t: terms.frequencies.get(t, 0) + c for t, c in document_frequency.items()})
        stats["chunk_table"] = shard_chunks(0)
        stats["seconds"] = round(time.perf_counter() - started, 3)
        documents = len(set(chunks.column("doc_id").to_pylist()))
        description = IndexDescription(
            representation=base.representation, preset=base.preset, kinds=base.kinds,
            question_granularity=base.question_granularity,
            embedder=EmbedderInfo(model=base.embedder_model, dim=dim, normalize=True),
            faiss=FaissInfo(factory="Flat", metric="inner_product"), num_shards=1,
            shards=[ShardEntry.model_validate(stats)],
            counts=Counts(documents=documents, chunks=chunks.num_rows, questions=0, vectors=stats["vectors"],
                          vectors_before_filters=stats["vectors_before_filters"]),
            config=cfg.model_dump(mode="json"), **({"metadata_schema": schema} if schema else {}),
            **{DELTA_INFO: info})
        write_manifest(staging, description)
        publish(staging, out)  # verified, then renamed over what a crashed attempt may have left
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return load_manifest(out)


class BaseDocuments:
    """The base version's documents as the write path asks about them: whether one is there, and its
    chunk fingerprint (a repeated write of a batch-built document is recognised too). The chunk table's
    document column is read once per instance (one per base version), the rest per question."""

    def __init__(self, base: Manifest):
        self.base = base
        self.path = base.file(CHUNKS)
        doc_ids = pq.read_table(self.path, columns=["doc_id"]).column("doc_id").to_pylist()
        self.rows: dict[str, list[int]] = {}
        for row, doc_id in enumerate(doc_ids):
            self.rows.setdefault(doc_id, []).append(row)
        self.schema = base.metadata_schema or {}
        self._table: pa.Table | None = None

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self.rows

    def table(self) -> pa.Table:
        """The base's whole chunk table (read on the first question that needs more than ids)."""
        if self._table is None:
            self._table = pq.read_table(self.path)
        return self._table

    def fingerprint(self, doc_id: str) -> str | None:
        """`chunk_fingerprint` of the base's document (None when the base has no such document)."""
        rows = self.rows.get(doc_id)
        if rows is None:
            return None
        table = self.table().take(pa.array(rows, pa.int64()))
        chunks = list(zip(table.column("chunk_id").to_pylist(), table.column("title").to_pylist(),
                          table.column("text").to_pylist(), strict=True))
        url = table.column(URL)[0].as_py() if URL in table.column_names else None
        meta = json_values([table.column(METADATA)[0].as_py()])[0] if METADATA in table.column_names else {}
        return chunk_fingerprint(chunks, url, meta)


def record_fingerprint(record: dict, cfg: IndexConfig, schema: dict[str, str]) -> str:
    """`chunk_fingerprint` a log record would have once indexed with `cfg` (to compare with the base's)."""
    chunks = [(c["chunk_id"], c["title"], c["text"]) for c in document_chunks([record], cfg)]
    meta = canonical_metadata(record.get("metadata") or {}, schema)
    return chunk_fingerprint(chunks, record.get("url") or None, meta)
