"""A small index in the `qrag index` format written without Ray or a model (milliseconds): documents with
metadata, random unit vectors (a chunk row and a few sentence rows per chunk), BM25 over the chunk texts,
written by the package's own shard writer, chunk-table typing and manifest. For search logic that must
be exact whatever the vectors mean (filters against brute force); the build path itself is tested with
real corpora and MiniLM elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["loop", "shard", "vector", "replica", "query", "tenant", "router", "chunk", "passage", "question", "answer",
         "cluster", "memory", "latency", "batch", "model", "token", "corpus", "search", "merge", "score", "rank",
         "cache", "load"]


def synthetic_docs(count: int, seed: int = 0) -> list[dict]:
    """n documents with a text of WORDS and metadata of every type: `group` (string, 4 values), `year`
    (number), `public` (bool), `day` (date), `at` (datetime), `tags` (list of strings); every fifth
    document has no metadata, every third has a url."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(count):
        text = " ".join(rng.choice(WORDS, size=12))
        meta = {"group": "abcd"[i % 4], "year": 2000 + i % 7, "public": bool(i % 2), "day": f"2024-01-{1 + i % 28:02d}",
                "at": f"2024-02-03T{i % 24:02d}:30:00Z", "tags": [WORDS[i % 5], WORDS[(i * 3) % 7]]}
        docs.append({"doc_id": f"d{i}", "title": f"Doc {i}", "text": text, "metadata": {} if i % 5 == 4 else meta,
                     "url": f"https://example.org/d{i}" if i % 3 == 0 else ""})
    return docs


def write_synthetic_index(out: Path, docs: list[dict], shards: int = 1, dim: int = 16, sentences: int = 2,
                          factory: str = "Flat", seed: int = 0) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qrag_ray.config.index import build_index_config, index_identity
    from qrag_ray.index.format import (
        CHUNKS,
        Counts,
        EmbedderInfo,
        FaissInfo,
        IndexDescription,
        ShardEntry,
        chunk_key,
        shard_bm25,
        shard_chunks,
        shard_of,
        write_arrow,
        write_manifest,
    )
    from qrag_ray.index.lexical import globalize_idf
    from qrag_ray.index.metadata_columns import chunk_table
    from qrag_ray.index.rows import CHUNK_PART_SCHEMA
    from qrag_ray.index.writer import write_shard
    from qrag_ray.io.metadata import field_types, merge_field_types, normalize_metadata, to_json

    cfg = build_index_config(None, input="synthetic", representation="chunk+sentence", shards=shards,
                             faiss={"factory": factory}, bm25={"enabled": True}, build={"output": str(out)})
    metas = {d["doc_id"]: normalize_metadata(d.get("metadata"), d["doc_id"]) for d in docs}
    schema = merge_field_types([field_types(metas.items())])
    has_url = any(d.get("url") for d in docs)
    rng = np.random.default_rng(seed)
    per_chunk = 1 + sentences
    entries = []
    tables = []
    out.mkdir(parents=True, exist_ok=True)
    keys = {d["doc_id"]: chunk_key(f"{d['doc_id']}#0") for d in docs}
    for shard in range(shards):
        mine = sorted((d for d in docs if shard_of(keys[d["doc_id"]], shards) == shard),
                      key=lambda d: keys[d["doc_id"]])
        vec = rng.standard_normal((len(mine) * per_chunk, dim)).astype(np.float32)
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        rows = pa.table({
            "chunk_idx": np.repeat([keys[d["doc_id"]] for d in mine], per_chunk).astype(np.int64),
            "kind": ["chunk", *["sentence"] * sentences] * len(mine),
            "text": [t for d in mine for t in [d["text"]] + [f"{d['text']} ({j})" for j in range(sentences)]],
            "qn": np.zeros(len(mine) * per_chunk, np.int32), "store": np.ones(len(mine) * per_chunk, bool),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), dim)})
        stats = write_shard(shard, rows, out, cfg.filters, cfg.faiss, dim, cfg.bm25)
        parts = pa.table({"chunk_idx": [keys[d["doc_id"]] for d in mine],
                          "chunk_id": [f"{d['doc_id']}#0" for d in mine],
                          "doc_id": [d["doc_id"] for d in mine], "title": [d["title"] for d in mine],
                          "text": [d["text"] for d in mine], "shard": np.full(len(mine), shard, np.int32),
                          "url": [d.get("url") or "" for d in mine],
                          "metadata": [to_json(metas[d["doc_id"]]) for d in mine]}, schema=CHUNK_PART_SCHEMA)
        chunks = chunk_table(parts, schema, has_url)
        write_arrow(chunks.drop_columns(["shard"]), out / shard_chunks(shard))
        entries.append(ShardEntry(**stats, chunk_table=shard_chunks(shard)))
        tables.append(chunks)
    globalize_idf([out / shard_bm25(s) for s in range(shards)])
    pq.write_table(pa.concat_tables(tables), out / CHUNKS)
    n_vec = sum(e.vectors for e in entries)
    write_manifest(out, IndexDescription(
        representation="chunk+sentence", kinds=["chunk", "sentence"], embedder=EmbedderInfo(model="none", dim=dim),
        faiss=FaissInfo(factory=factory), num_shards=shards, shards=entries,
        counts=Counts(documents=len(docs), chunks=len(docs), questions=0, vectors=n_vec, vectors_before_filters=n_vec),
        config=cfg.model_dump(mode="json"), content=index_identity(cfg.model_dump(mode="json")),
        **({"metadata_schema": schema} if schema else {})))
    return out
