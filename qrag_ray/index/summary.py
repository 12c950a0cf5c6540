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

# manifest keys a build may record its metadata schema under ({field: type}); none: built without metadata
_SCHEMA_KEYS = ("metadata_schema", "metadata")


def summarize_index(index_dir: str | Path, sample: int = 3) -> dict[str, Any]:
    """The index at `index_dir` described as JSON data, with `sample` chunks and their questions. A
    missing, incomplete or unreadable index is an IndexFormatError (one line)."""
    m = load_manifest(index_dir)
    vectors: Counter = Counter()
    for s in m.shards:
        vectors.update(s.kinds)
    counts = m.counts.model_dump() if m.counts else {}
    return {
        "path": str(m.path), "index_version": m.index_version, "format_version": m.format_version,
        "created_at": m.created_at, "build_seconds": (m.stage_seconds or {}).get("total"),
        "representation": m.representation, "preset": m.preset, "kinds": m.kinds,
        "question_granularity": m.question_granularity,
        "embedder": {"model": m.embedder.model, "dim": m.embedder.dim},
        "faiss": m.faiss.model_dump() if m.faiss else None,
        "num_shards": m.num_shards,
        "shards": [{"id": s.id, "chunks": s.chunks, "vectors": s.vectors, "kinds": dict(s.kinds)} for s in m.shards],
        "counts": counts, "vectors_per_kind": dict(sorted(vectors.items())),
        "bm25": _bm25(m), "bytes": index_bytes(m), "metadata_schema": metadata_schema(m),
        "samples": sample_chunks(m, sample),
    }


def _bm25(m: Manifest) -> dict[str, Any] | None:
    if not m.has_bm25:
        return None
    return {"docs": sum(s.bm25_docs or 0 for s in m.shards),
            "vocabulary": max((s.bm25_vocab or 0 for s in m.shards), default=0),
            "alpha": m.search_policy.bm25_alpha}


def metadata_schema(m: Manifest) -> dict[str, Any] | None:
    """The manifest's metadata schema ({field: type}), read defensively: None when the build recorded none."""
    for key in _SCHEMA_KEYS:
        value = m.data.get(key)
        if isinstance(value, dict) and isinstance(value.get("fields"), dict):
            value = value["fields"]
        if isinstance(value, dict) and value:
            return dict(value)
    return None


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


def index_bytes(m: Manifest) -> dict[str, int]:
    """Bytes on disk: the total (manifest included) and per part (FAISS, row metadata, chunks, BM25)."""
    parts: Counter = Counter()
    for rel in m.files:
        parts[_part(rel)] += m.file(rel).stat().st_size
    total = sum(parts.values()) + (m.path / MANIFEST).stat().st_size
    return {"total": total, **{p: parts.get(p, 0) for p in ("faiss", "rows", "chunks", "bm25", "other")}}


def _read(m: Manifest, rel: str, what) -> pa.Table:
    try:
        return what(m.file(rel))
    except (pa.ArrowException, OSError) as e:
        raise IndexFormatError(f"corrupt index {m.path}: cannot read {rel} ({' '.join(str(e).split())})") from None


def sample_chunks(m: Manifest, n: int) -> list[dict[str, Any]]:
    """`n` chunks spread evenly over the index in chunk id order, each with its generated questions (in
    the order the shard stores them, each once)."""
    if n <= 0:
        return []
    ids = _read(m, CHUNKS, lambda p: pq.read_table(p, columns=["chunk_idx", "chunk_id"]))
    ids = ids.sort_by("chunk_id")
    picks = sorted({round(i * (ids.num_rows - 1) / max(n - 1, 1)) for i in range(min(n, ids.num_rows))})
    keys = [ids.column("chunk_idx")[i].as_py() for i in picks]
    rows = _read(m, CHUNKS, lambda p: pq.read_table(p, filters=[("chunk_idx", "in", keys)]))
    by_key = {r["chunk_idx"]: r for r in rows.to_pylist()}
    questions = _questions(m, {int(r["shard"]) for r in by_key.values()}, keys)
    return [{"chunk_id": by_key[k]["chunk_id"], "doc_id": by_key[k]["doc_id"], "title": by_key[k]["title"],
             "text": by_key[k]["text"], "questions": questions.get(k, [])} for k in keys if k in by_key]


def _questions(m: Manifest, shards: set[int], keys: list[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for s in sorted(shards):
        rel = m.shard(s).meta
        t = _read(m, rel, lambda p: read_table_file(p, ["chunk_idx", "kind", "text"]))
        mask = pc.and_(pc.is_in(t.column("chunk_idx"), pa.array(keys, pa.int64())),
                       pc.is_in(pc.cast(t.column("kind"), pa.string()), pa.array(QUESTION_KINDS)))
        for row in t.filter(mask).to_pylist():
            qs = out.setdefault(row["chunk_idx"], [])
            if row["text"] not in qs:
                qs.append(row["text"])
    return out
