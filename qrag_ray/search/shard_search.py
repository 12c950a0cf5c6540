"""One shard of an index, loaded and searched: its FAISS index with row metadata (index/shard_index.py),
its chunks' metadata as Arrow columns looked up by row, and the search made final for the shard's own
top k. In-process search and every Serve shard replica load and search a shard through these."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qrag_ray.errors import IndexFormatError
from qrag_ray.index.format import CHUNKS, Manifest, files_under, load_manifest, read_table_file, verify_files
from qrag_ray.index.shard_index import ShardHits, ShardIndex, one_array, py_values
from qrag_ray.search.merge import ChunkResult, merge_hits
from qrag_ray.search.query import Query
from qrag_ray.search.results import ChunkMeta

# A hybrid query's first round asks each shard for at least this many vectors and BM25 hits: a chunk
# one list missed is scored at that list's floor, and a short list's floor sinks it (docs/EVALUATION.md).
HYBRID_MIN_DEPTH = 100
_META = ["chunk_id", "doc_id", "title", "text"]


def initial_multiplier(manifest: Manifest) -> int:
    """Vectors to ask per wanted chunk: about twice the mean vectors per chunk."""
    c = manifest.counts
    vpc = (c.vectors if c else 1) / max(1, c.chunks if c else 1)
    return max(2, math.ceil(2 * vpc))


@dataclass
class LoadedShard:
    index: ShardIndex
    chunk_idx: np.ndarray  # this shard's chunk keys, sorted
    chunks: list[pa.Array]  # their chunk_id, doc_id, title, text (a column each), in chunk_idx order
    index_version: str
    multiplier: int
    nbytes: int

    def chunk_meta(self, idxs) -> dict[int, ChunkMeta]:
        """chunk_idx -> its metadata, for chunks of this shard."""
        idxs = np.asarray(list(idxs), dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.chunk_idx, idxs), max(len(self.chunk_idx) - 1, 0))
        if len(idxs) and (not len(self.chunk_idx) or (self.chunk_idx[pos] != idxs).any()):
            raise IndexFormatError(f"chunk(s) missing from the chunk table of {self.index.manifest.path}")
        cols = [py_values(col, pos.tolist()) for col in self.chunks]
        return {int(ci): ChunkMeta(*row) for ci, row in zip(idxs.tolist(), zip(*cols))}


def load_shard(index: str | Path | Manifest, shard: int, threads: int | None = None, verify: bool = True,
               use_gpu: bool = False) -> LoadedShard:
    """Load (and with `verify` check the sha256 of) one shard: FAISS file, row metadata, BM25, its chunks."""
    manifest = index if isinstance(index, Manifest) else load_manifest(index)
    if shard >= manifest.num_shards:
        raise IndexFormatError(f"index {manifest.path} has {manifest.num_shards} shards, no shard {shard}")
    searcher = ShardIndex(manifest.path, shard, manifest, verify=verify, threads=threads, use_gpu=use_gpu)
    info = manifest.shard(shard)
    table = info.chunk_table or CHUNKS  # earlier indexes: this shard's rows of chunks.parquet
    if verify:
        verify_files(manifest, [table])
    if info.chunk_table:
        t = read_table_file(manifest.file(table), ["chunk_idx", *_META])  # written sorted by chunk_idx
    else:
        t = pq.read_table(manifest.file(CHUNKS), columns=["chunk_idx", *_META], filters=[("shard", "=", shard)])
        t = t.sort_by("chunk_idx")
    bm25 = files_under(manifest, info.bm25) if info.bm25 else []
    nbytes = searcher.nbytes + sum(os.path.getsize(manifest.file(r)) for r in bm25) + int(t.nbytes)
    return LoadedShard(searcher, t.column("chunk_idx").to_numpy(), [one_array(t.column(c)) for c in _META],
                       manifest.index_version, initial_multiplier(manifest), nbytes)


def search_shard_exact(searcher: ShardIndex, qvecs: np.ndarray, k: int, multiplier: int, min_score: float | None,
                       policy, queries: list[str] | None = None,
                       tops: bool = False) -> tuple[list[ShardHits], list[list[ChunkResult] | None], int]:
    """One shard's hits per query, each deep enough that the shard's own top k distinct chunks are
    final (widening x4 while `needs_more` says so). A chunk's vectors all live in one shard, so the
    global top k are among the shards' local top k: the caller merges once. Also each query's local
    top k where the widening check merged it (every query's with `tops`), else None."""
    total = searcher.ntotal
    use_text = policy.bm25_alpha is not None and queries is not None
    out: list[ShardHits | None] = [None] * len(qvecs)
    top: list[list[ChunkResult] | None] = [None] * len(qvecs)
    todo = np.arange(len(qvecs))
    m, rounds = multiplier, 0
    if use_text:
        m = max(m, -(-HYBRID_MIN_DEPTH // k))
    while len(todo):
        rounds += 1
        hits = searcher.search(qvecs[todo], k * m, [queries[i] for i in todo] if use_text else None)
        again = []
        for j, qi in enumerate(todo):
            one = hits.row(j)
            wider = k * m < total
            res, more = merge_hits([one], 0, k, min_score, policy) if wider or tops else (None, False)
            if wider and more:
                again.append(qi)
            else:
                out[qi], top[qi] = one, res
        todo = np.asarray(again, dtype=np.int64)
        m *= 4
    return out, top, rounds  # type: ignore[return-value]


@dataclass
class ShardReply:  # a shard's final hits per query and, when asked, its page's rows and chunks

    shard: int
    hits: list[ShardHits]  # one per query vector
    matched: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, text)
    chunks: dict[int, ChunkMeta] = field(default_factory=dict)  # chunk_idx -> meta
    search_ms: float = 0.0
    rounds: int = 1
    cold: bool = False  # the replica loaded the shard for this request
    replica: str = ""  # the Serve replica that searched it (remote shards)


def search_loaded(ls: LoadedShard, shard: int, qvecs: np.ndarray, q: Query, page: bool) -> ShardReply:
    """The shard's final hits for every query vector (timed) plus, with `page`, the metadata of its own
    top-k chunks, the only ones that can reach the page: sent with the hits so a remote caller needs no
    second call. Runs in the calling thread."""
    t0 = time.perf_counter()
    texts = None if q.texts is None else list(q.texts)
    hits, tops, rounds = search_shard_exact(ls.index, qvecs, q.k, ls.multiplier, q.min_score, q.policy, texts, page)
    reply = ShardReply(shard, hits, rounds=rounds)
    if page:
        top = [r for res in tops for r in res]
        reply.chunks = ls.chunk_meta(dict.fromkeys(r.chunk_idx for r in top))
        reply.matched = ls.index.matched([row for r in top for _, row, _ in r.matches])
    reply.search_ms = (time.perf_counter() - t0) * 1000
    return reply
