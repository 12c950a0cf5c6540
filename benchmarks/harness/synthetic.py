"""A synthetic big tenant, written in `qrag index`'s format: latency does not depend on what the vectors
mean, and millions of real vectors would take hours to embed on a small box. Chunks of ~300 characters,
`per_chunk` vectors each (kinds chunk + sentence) around a random centre, written by the package's own
shard writer (`write_shard`, one quantizer trained once and shared by the shards, as `qrag index` does)
with chunks.parquet and a checksummed manifest; every document has a metadata field `bucket` (0..999,
each value on 1/1000 of the documents, drawn at random: filtered_search.py) and the float32 vectors are
kept beside the index for exact search. Queries are embedded by a tiny random-weights model
(harness/models.py), on the served and the in-process side alike. With `topics` (the queries' own
vectors) half of the chunks lie at graded distances around them, as a real query has a few close
passages: the data for recall figures; otherwise a query has no near neighbours."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ("index", "shard", "vector", "replica", "query", "tenant", "router", "chunk", "passage", "question", "answer",
         "cluster", "memory", "latency", "batch", "model", "token", "corpus", "search", "merge", "score", "rank",
         "cache", "load")


def _sentences(rng: np.random.Generator, n: int) -> list[str]:
    words = np.asarray(WORDS)[rng.integers(0, len(WORDS), size=(n, 8))]
    return [" ".join(w).capitalize() + "." for w in words]


def topic_chunks(centres: np.ndarray, noise: np.ndarray, topics: np.ndarray, rng: np.random.Generator,
                 share: float = 0.5, near: float = 0.3, far: float = 2.0, spread: float = 0.1) -> None:
    """Put `share` of the chunks around the queries' own vectors (`topics`, unit rows), in place: each such
    chunk's centre is a query's vector moved in a random direction by a distance drawn evenly from
    near..far (about 17 to 63 degrees away), its vectors `spread` per coordinate around it (a few degrees).
    So a query has neighbours at graded distances, as a real one has a few close passages and many loosely
    related ones; the other chunks stay at random centres. `centres` (norm ~ sqrt(dim)) and `noise` (per
    coordinate) are per chunk."""
    dim = centres.shape[1]
    mine = np.flatnonzero(rng.random(len(centres)) < share)
    offset = rng.standard_normal((len(mine), dim), dtype=np.float32)
    offset *= (rng.uniform(near, far, len(mine)) / np.linalg.norm(offset, axis=1))[:, None]
    moved = topics[rng.integers(0, len(topics), size=len(mine))] + offset
    centres[mine] = np.sqrt(dim) * moved / np.linalg.norm(moved, axis=1, keepdims=True)
    noise[mine] = spread


def synthetic_index(out: Path, model: str, dim: int, vectors: int, shards: int, per_chunk: int, factory: str,
                    nprobe: int, topics: np.ndarray | None = None) -> Path:
    """Write a `qrag index`-format index of about `vectors` vectors (idempotent: a finished one is kept);
    with `topics` (query vectors) half of the chunks lie around them (topic_chunks)."""
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
        shard_chunks,
        shard_of,
        write_arrow,
        write_manifest,
    )
    from qrag_ray.index.metadata_columns import chunk_table
    from qrag_ray.index.rows import CHUNK_PART_SCHEMA
    from qrag_ray.index.tasks import needs_training
    from qrag_ray.index.writer import build_faiss, write_shard

    if (out / "manifest.json").is_file():
        return out
    cfg = build_index_config(None, input="synthetic", representation="chunk+sentence", shards=shards,
                             embedder={"model": model}, faiss={"factory": factory, "nprobe": nprobe},
                             build={"output": str(out)})
    n_chunks = vectors // per_chunk
    rng = np.random.default_rng(0)
    ids = [f"c{i}" for i in range(n_chunks)]
    keys = np.array([chunk_key(c) for c in ids], dtype=np.int64)
    placed = np.array([shard_of(int(k), shards) for k in keys])
    flat = _sentences(rng, n_chunks * (per_chunk - 1))
    sentences = [flat[i * (per_chunk - 1):(i + 1) * (per_chunk - 1)] for i in range(n_chunks)]
    centres = rng.standard_normal((n_chunks, dim), dtype=np.float32)
    noise = np.full(n_chunks, 0.5, np.float32)  # a vector's offset from its chunk's centre, per coordinate
    if topics is not None:
        topic_chunks(centres, noise, topics, rng)

    def unit(v: np.ndarray) -> np.ndarray:
        """Rows scaled to unit length, float32."""
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    trained = out.parent / f"{out.name}.trained.faiss"
    if needs_training(factory, dim):
        import faiss

        n = min(cfg.faiss.train_sample, n_chunks)
        sample = unit(centres[:n] + noise[:n, None] * rng.standard_normal((n, dim), dtype=np.float32))
        faiss.write_index(build_faiss(sample, cfg.faiss, add=False), str(trained))
    tmp = out.with_name(out.name + ".partial")
    vec_dir = out.with_name(out.name + ".vectors")  # the exact vectors, for the filtered search's recall
    vec_dir.mkdir(exist_ok=True)
    bucket = buckets(n_chunks // 4 + 1)
    entries, chunk_tables = [], []
    for s in range(shards):
        mine = np.flatnonzero(placed == s)
        vec = unit(np.repeat(centres[mine], per_chunk, axis=0) + np.repeat(noise[mine], per_chunk)[:, None]
                   * rng.standard_normal((len(mine) * per_chunk, dim), dtype=np.float32))
        texts = [t for i in mine for t in [" ".join(sentences[i])] + sentences[i]]
        kinds = ["chunk", *["sentence"] * (per_chunk - 1)] * len(mine)
        table = pa.table({
            "chunk_idx": np.repeat(keys[mine], per_chunk), "kind": kinds,
            "qn": np.zeros(len(mine) * per_chunk, np.int32), "store": np.ones(len(mine) * per_chunk, bool),
            "text": texts, "vector": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), dim)})
        stats = write_shard(s, table, tmp, cfg.filters, cfg.faiss, dim,
                            trained=str(trained) if trained.is_file() else None)
        order = np.argsort(keys[mine], kind="stable")  # the writer's row order: by chunk key
        np.save(vec_dir / f"{s}.npy", vec.reshape(len(mine), per_chunk, dim)[order].reshape(-1, dim))
        mine = mine[order]
        chunks = chunk_table(pa.table({
            "chunk_idx": keys[mine], "chunk_id": [ids[i] for i in mine], "doc_id": [f"d{i // 4}" for i in mine],
            "title": [f"Doc {i // 4}" for i in mine], "text": [" ".join(sentences[i]) for i in mine],
            "shard": np.full(len(mine), s, np.int32), "url": [""] * len(mine),
            "metadata": [f'{{"bucket":{bucket[i // 4]}}}' for i in mine]}, schema=CHUNK_PART_SCHEMA),
            {"bucket": "number"})
        write_arrow(chunks.drop_columns(["shard"]), tmp / shard_chunks(s))
        entries.append(ShardEntry(**stats, chunk_table=shard_chunks(s)))
        chunk_tables.append(chunks)
        print(f"  shard {s}: {entries[-1].vectors:,} vectors in {entries[-1].seconds:.0f} s", flush=True)
    with pq.ParquetWriter(tmp / CHUNKS, chunk_tables[0].schema) as w:
        for t in chunk_tables:
            w.write_table(t)
    n_vec = sum(e.vectors for e in entries)
    write_manifest(tmp, IndexDescription(
        representation="chunk+sentence", kinds=["chunk", "sentence"], embedder=EmbedderInfo(model=model, dim=dim),
        faiss=FaissInfo(factory=factory), num_shards=shards, shards=entries,
        counts=Counts(documents=n_chunks // 4 + 1, chunks=n_chunks, questions=0, vectors=n_vec,
                      vectors_before_filters=n_vec),
        config=cfg.model_dump(mode="json"), content=index_identity(cfg.model_dump(mode="json")) | {
            "metadata_schema": {"bucket": "number"}}, metadata_schema={"bucket": "number"}))
    tmp.rename(out)
    trained.unlink(missing_ok=True)
    return out


def buckets(n_docs: int, seed: int = 1) -> np.ndarray:
    """Each document's bucket: a random permutation folded onto 0..999, so every value holds 1/1000."""
    return np.random.default_rng(seed).permutation(n_docs) % 1000


def big_tenant(workdir: Path, vectors: int, shards: int, per_chunk: int, factory: str, nprobe: int,
               topics: bool = False) -> Path:
    """The tiny model and the synthetic index under `workdir`, each built once and reused (with `topics`,
    half of the chunks around the vectors of every distinct query of `make_queries`)."""
    from benchmarks.harness.indexes import make_queries
    from benchmarks.harness.models import write_tiny_model

    model = str(write_tiny_model(workdir / "tiny-st"))
    name = f"index-{vectors}-{shards}-{factory.replace(',', '_')}-meta" + ("-topics" if topics else "")
    topic_vectors = None
    if topics and not (workdir / name / "manifest.json").is_file():
        from qrag_ray.embedding import encode, load_sentence_transformer

        topic_vectors = encode(load_sentence_transformer(model), list(dict.fromkeys(make_queries(10_000))))
    return synthetic_index(workdir / name, model, 64, vectors, shards, per_chunk, factory, nprobe, topic_vectors)
