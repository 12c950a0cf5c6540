"""Chunks and documents by id (GET /v1/chunks/{id}, GET /v1/documents/{id}, `qrag show`): a chunk lives in
shard `shard_of(chunk_key(id))`, so one shard answers for it; a document's chunks are spread over the
shards, each of which finds its own in one vectorised pass over its chunk table. A record is what the API
returns of a chunk: its text, title, document, url, metadata and the generated questions stored with it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from qrag_ray.index.format import chunk_key, shard_of
from qrag_ray.index.lexical import QUESTION_KINDS
from qrag_ray.search.shard_search import LoadedShard


def chunk_shard(chunk_id: str, num_shards: int) -> tuple[int, int]:
    """(chunk_idx, the shard that holds it): the build's one placement rule."""
    ci = chunk_key(chunk_id)
    return ci, shard_of(ci, num_shards)


def chunk_records(ls: LoadedShard, chunk_idxs: list[int] | None = None, doc_id: str | None = None) -> list[dict]:
    """The records of this shard's chunks with these keys, or of document `doc_id` (absent ones left out):
    {chunk_id, doc_id, title, text, url, metadata, questions}."""
    if doc_id is not None:
        pos = np.flatnonzero(pc.fill_null(pc.equal(ls.chunks[1], pa.scalar(doc_id, pa.string())), False)
                             .to_numpy(zero_copy_only=False))
        keys = ls.chunk_idx[pos].tolist()
    else:
        want = np.asarray(chunk_idxs or [], np.int64)
        at = np.minimum(np.searchsorted(ls.chunk_idx, want), max(len(ls.chunk_idx) - 1, 0))
        keys = want[(ls.chunk_idx[at] == want)].tolist() if len(ls.chunk_idx) else []
    out = []
    for ci, meta in ls.chunk_meta(keys).items():
        rows = np.flatnonzero(ls.index.chunk_idx == ci)
        kinds = ls.index.matched(rows.tolist())
        questions = list(dict.fromkeys(text for kind, text in (kinds[r] for r in rows.tolist()) if kind in QUESTION_KINDS))
        out.append({**meta._asdict(), "questions": questions})
    return out


def in_document_order(records: list[dict]) -> list[dict]:
    """A document's chunks by their number (`doc#n`), whichever shards they came from."""
    return sorted(records, key=lambda r: int(r["chunk_id"].rsplit("#", 1)[-1]) if r["chunk_id"].rsplit("#", 1)[-1].isdigit()
                  else -1)


def document_body(doc_id: str, records: list[dict]) -> dict:
    """A document as the API returns it (without `index`, `index_version`): its url, metadata and its
    chunks in document order."""
    chunks = in_document_order(records)
    first = chunks[0]
    return {"doc_id": doc_id, "title": first["title"], "url": first["url"], "metadata": first["metadata"],
            "chunks": [{k: c[k] for k in ("chunk_id", "title", "text", "questions")} for c in chunks]}
