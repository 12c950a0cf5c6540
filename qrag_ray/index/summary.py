"""What an index holds, for a person (`qrag info`): its manifest's description (representation, preset,
embedder, shards, vectors per kind, BM25, metadata schema, build time), its bytes on disk, and a few
sample chunks with the questions generated for them, read from the index's own tables: a chunk's
questions are the text of its shard's question-kind rows (kinds `question`, `quote`, `atomquote`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qrag_ray.errors import IndexFormatError
from qrag_ray.index.format import CHUNKS, MANIFEST, Manifest, load_manifest, read_table_file
from qrag_ray.index.lexical import QUESTION_KINDS


def summarize_index(index_dir: str | Path, sample: int = 3) -> dict[str, Any]:
    """The index at `index_dir` described as JSON data, with `sample` chunks and their questions. A
    missing, incomplete or unreadable index is an IndexFormatError (one line)."""
    manifest = load_manifest(index_dir)
    vectors: Counter = Counter()
    for shard in manifest.shards:
        vectors.update(shard.kinds)
    counts = manifest.counts.model_dump() if manifest.counts else {}
    return {
        "path": str(manifest.path), "index_version": manifest.index_version, "format_version": manifest.format_version,
        "created_at": manifest.created_at, "build_seconds": (manifest.stage_seconds or {}).get("total"),
        "representation": manifest.representation, "preset": manifest.preset, "kinds": manifest.kinds,
        "question_granularity": manifest.question_granularity,
        "embedder": {"model": manifest.embedder.model, "dim": manifest.embedder.dim},
        "faiss": manifest.faiss.model_dump() if manifest.faiss else None,
        "num_shards": manifest.num_shards,
        "shards": [{"id": s.id, "chunks": s.chunks, "vectors": s.vectors, "kinds": dict(s.kinds)}
                   for s in manifest.shards],
        "counts": counts, "vectors_per_kind": dict(sorted(vectors.items())),
        "bm25": _bm25(manifest), "bytes": index_bytes(manifest), "metadata_schema": manifest.metadata_schema,
        "samples": sample_chunks(manifest, sample),
    }


def _bm25(manifest: Manifest) -> dict[str, Any] | None:
    if not manifest.has_bm25:
        return None
    return {"docs": sum(s.bm25_docs or 0 for s in manifest.shards),
            "vocabulary": max((s.bm25_vocab or 0 for s in manifest.shards), default=0),
            "alpha": manifest.search_policy.bm25_alpha}


def _part(rel: str) -> str:
    if rel.endswith(".faiss"):
        return "faiss"
    if ".bm25/" in rel:
        return "bm25"
    if rel == CHUNKS or rel.endswith(".chunks.arrow"):
        return "chunks"
    if rel.startswith("shards/"):
        return "rows"
    return "other"


def index_bytes(manifest: Manifest) -> dict[str, int]:
    """Bytes on disk: the total (manifest included) and per part (FAISS, row metadata, chunks, BM25)."""
    parts: Counter = Counter()
    for rel in manifest.files:
        parts[_part(rel)] += manifest.file(rel).stat().st_size
    total = sum(parts.values()) + (manifest.path / MANIFEST).stat().st_size
    return {"total": total, **{p: parts.get(p, 0) for p in ("faiss", "rows", "chunks", "bm25", "other")}}


def _read(manifest: Manifest, rel: str, what) -> pa.Table:
    try:
        return what(manifest.file(rel))
    except (pa.ArrowException, OSError) as error:
        reason = " ".join(str(error).split())
        raise IndexFormatError(f"corrupt index {manifest.path}: cannot read {rel} ({reason})") from None


def sample_chunks(manifest: Manifest, count: int) -> list[dict[str, Any]]:
    """`count` chunks spread evenly over the index in chunk id order, each with its generated questions (in
    the order the shard stores them, each once)."""
    if count <= 0:
        return []
    ids = _read(manifest, CHUNKS, lambda p: pq.read_table(p, columns=["chunk_idx", "chunk_id"]))
    ids = ids.sort_by("chunk_id")
    picks = sorted({round(i * (ids.num_rows - 1) / max(count - 1, 1)) for i in range(min(count, ids.num_rows))})
    keys = [ids.column("chunk_idx")[i].as_py() for i in picks]
    rows = _read(manifest, CHUNKS, lambda p: pq.read_table(p, filters=[("chunk_idx", "in", keys)]))
    by_key = {r["chunk_idx"]: r for r in rows.to_pylist()}
    questions = _questions(manifest, {int(r["shard"]) for r in by_key.values()}, keys)
    return [{"chunk_id": by_key[k]["chunk_id"], "doc_id": by_key[k]["doc_id"], "title": by_key[k]["title"],
             "text": by_key[k]["text"], "questions": questions.get(k, [])} for k in keys if k in by_key]


def _questions(manifest: Manifest, shards: set[int], keys: list[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for shard in sorted(shards):
        rel = manifest.shard(shard).meta
        table = _read(manifest, rel, lambda p: read_table_file(p, ["chunk_idx", "kind", "text"]))
        mask = pc.and_(pc.is_in(table.column("chunk_idx"), pa.array(keys, pa.int64())),
                       pc.is_in(pc.cast(table.column("kind"), pa.string()), pa.array(QUESTION_KINDS)))
        for row in table.filter(mask).to_pylist():
            texts = out.setdefault(row["chunk_idx"], [])
            if row["text"] not in texts:
                texts.append(row["text"])
    return out
