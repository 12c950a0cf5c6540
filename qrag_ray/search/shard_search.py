"""One shard of an index, loaded and searched: its FAISS index with row metadata (index/shard_index.py),
its chunks' metadata as Arrow columns looked up by row, and the search made final for the shard's own
top k. In-process search and every Serve shard replica load and search a shard through these."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qrag_ray.errors import IndexFormatError
from qrag_ray.index.file_checks import manifest_now, verify_once
from qrag_ray.index.format import CHUNKS, Manifest, files_under, read_table_file
from qrag_ray.index.metadata_columns import METADATA, URL, json_values
from qrag_ray.index.shard_index import Selection, ShardHits, ShardIndex, one_array, py_values
from qrag_ray.runtime.byte_lru import ByteLRU
from qrag_ray.search.filters import Filter, chunk_mask
from qrag_ray.search.hit_rows import HitRows, only_chunks
from qrag_ray.search.merge import ChunkResult, essential_hits, merge_hits
from qrag_ray.search.query import Query
from qrag_ray.search.page import ChunkMeta

# A hybrid query's first round asks each shard for at least this many vectors and BM25 hits: a chunk
# one list missed is scored at that list's floor, and a short list's floor sinks it (docs/EVALUATION.md).
HYBRID_MIN_DEPTH = 100
# A loaded shard keeps the selections of its most recent filters, room for this many (one bit per FAISS
# row and one byte per BM25 document each: under 1% of a shard's own bytes), so queries that repeat a
# filter, as an application's do (a permission group, a language), skip evaluating it on every shard.
SELECTIONS_KEPT = 8
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
    url: pa.Array | None = None  # the documents' urls and typed metadata, when the index has them
    metadata: pa.StructArray | None = None
    _selections: ByteLRU = field(init=False, repr=False)  # Filter -> Selection (SELECTIONS_KEPT)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        lex = self.index.lexicon
        one = self.index.ntotal // 8 + 1 + (len(lex) if lex is not None else 0)
        self._selections = ByteLRU(SELECTIONS_KEPT * one)

    def chunk_meta(self, idxs) -> dict[int, ChunkMeta]:
        """chunk_idx -> its metadata, for chunks of this shard."""
        idxs = np.asarray(list(idxs), dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.chunk_idx, idxs), max(len(self.chunk_idx) - 1, 0))
        if len(idxs) and (not len(self.chunk_idx) or (self.chunk_idx[pos] != idxs).any()):
            raise IndexFormatError(f"chunk(s) missing from the chunk table of {self.index.manifest.path}")
        at = pos.tolist()
        cols = [py_values(col, at) for col in self.chunks]
        cols.append(py_values(self.url, at) if self.url is not None else [None] * len(at))
        cols.append(json_values(py_values(self.metadata, at)) if self.metadata is not None else [{}] * len(at))
        return {int(ci): ChunkMeta(*row) for ci, row in zip(idxs.tolist(), zip(*cols))}

    def select(self, f: Filter) -> Selection:
        """The rows and BM25 documents of this shard's chunks that pass `f` (one vectorised pass, or the
        selection kept from a recent query with an equal filter: a Selection is never changed)."""
        with self._lock:
            sel = self._selections.get(f)
        if sel is None:
            sel = self.index.selection(self.chunk_idx, chunk_mask(f, self.chunks[1], self.metadata))
            with self._lock:
                self._selections.put(f, sel, sel.nbytes)
        return sel


def load_shard(index: str | Path | Manifest, shard: int, threads: int | None = None, verify: bool = True,
               use_gpu: bool = False) -> LoadedShard:
    """Load (and with `verify` check the sha256 of) one shard: FAISS file, row metadata, BM25, its chunks. A
    file already checked in this process and unchanged since is not hashed again (index/file_checks.py)."""
    manifest = index if isinstance(index, Manifest) else manifest_now(index)
    if shard >= manifest.num_shards:
        raise IndexFormatError(f"index {manifest.path} has {manifest.num_shards} shards, no shard {shard}")
    searcher = ShardIndex(manifest.path, shard, manifest, verify=verify, threads=threads, use_gpu=use_gpu)
    info = manifest.shard(shard)
    table = info.chunk_table or CHUNKS  # earlier indexes: this shard's rows of chunks.parquet
    if verify:
        verify_once(manifest, [table])
    if info.chunk_table:
        t = read_table_file(manifest.file(table))  # written sorted by chunk_idx
    else:
        t = pq.read_table(manifest.file(CHUNKS), filters=[("shard", "=", shard)])
        t = t.sort_by("chunk_idx")
    t = t.select([c for c in ["chunk_idx", *_META, URL, METADATA] if c in t.column_names])
    bm25 = files_under(manifest, info.bm25) if info.bm25 else []
    nbytes = searcher.nbytes + sum(os.path.getsize(manifest.file(r)) for r in bm25) + int(t.nbytes)
    extra = {c: one_array(t.column(c)) for c in (URL, METADATA) if c in t.column_names}
    return LoadedShard(searcher, t.column("chunk_idx").to_numpy(), [one_array(t.column(c)) for c in _META],
                       manifest.index_version, initial_multiplier(manifest), nbytes, **extra)


def search_shard_exact(searcher: ShardIndex, qvecs: np.ndarray, k: int, multiplier: int, min_score: float | None,
                       policy, queries: list[str] | None = None, tops: bool = False,
                       sel: Selection | None = None) -> tuple[list[ShardHits], list[list[ChunkResult] | None], int]:
    """One shard's hits per query, each deep enough that the shard's own top k distinct chunks are
    final (widening x4 while `needs_more` says so). A chunk's vectors all live in one shard, so the
    global top k are among the shards' local top k: the caller merges once. Also each query's local
    top k where the widening check merged it (every query's with `tops`), else None. With `sel` (a
    filter's selection) all of it holds among the selected rows: a pre-filter, k chunks when k pass."""
    total = searcher.ntotal if sel is None else sel.count
    use_text = policy.bm25_alpha is not None and queries is not None
    out: list[ShardHits | None] = [None] * len(qvecs)
    top: list[list[ChunkResult] | None] = [None] * len(qvecs)
    todo = np.arange(len(qvecs))
    m, rounds = multiplier, 0
    if use_text:
        m = max(m, -(-HYBRID_MIN_DEPTH // k))
    while len(todo):
        rounds += 1
        hits = searcher.search(qvecs[todo], k * m, [queries[i] for i in todo] if use_text else None, sel)
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
    hits: Sequence[ShardHits]  # one per query vector (HitRows in a remote caller's reply: add_page)
    matched: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, text)
    chunks: dict[int, ChunkMeta] = field(default_factory=dict)  # chunk_idx -> meta
    search_ms: float = 0.0
    rounds: int = 1
    candidates: list[int] = field(default_factory=list)  # vector hits per query before the reply trims them
    cold: bool = False  # the replica loaded the shard for this request
    replica: str = ""  # the Serve replica that searched it (remote shards)


def search_hits(ls: LoadedShard, shard: int, qvecs: np.ndarray, q: Query,
                tops: bool) -> tuple[ShardReply, list[list[ChunkResult] | None]]:
    """The shard's final hits for every query vector (timed) and, with `tops`, each query's own top k
    chunks of the shard (what `add_page` sends metadata for). Runs in the calling thread."""
    t0 = time.perf_counter()
    texts = None if q.texts is None else list(q.texts)
    sel = None if q.filter is None else ls.select(q.filter)
    hits, top, rounds = search_shard_exact(ls.index, qvecs, q.k, ls.multiplier, q.min_score, q.policy, texts, tops,
                                           sel)
    reply = ShardReply(shard, hits, rounds=rounds, candidates=[int((h.rows >= 0).sum()) for h in hits])
    reply.search_ms = (time.perf_counter() - t0) * 1000
    return reply, top


def add_page(ls: LoadedShard, reply: ShardReply, tops: list[list[ChunkResult]], q: Query,
             keep: list[set[int]] | None) -> ShardReply:
    """A remote caller's reply: only the hits the caller's merge can read and the metadata of the shard's
    top chunks, the only ones that can reach the page, so the caller needs no second call. With `keep`
    (per query, the chunks that can still reach the page: `group_winners`) those chunks' hits; without
    it (a fusion that reads every chunk's lists) the hits `essential_hits` keeps of every chunk."""
    t0 = time.perf_counter()
    if keep is None:
        reply.hits = HitRows.of(reply.shard, [essential_hits(h, q.k, q.policy) for h in reply.hits])
    else:
        tops = [[r for r in res if r.chunk_idx in kept] for res, kept in zip(tops, keep)]
        reply.hits = only_chunks(HitRows.of(reply.shard, reply.hits), keep)
    top = [r for res in tops for r in res]
    reply.chunks = ls.chunk_meta(dict.fromkeys(r.chunk_idx for r in top))
    matched = ls.index.matched([row for r in top for _, row, _ in r.matches])
    # a chunk row's text is its chunk's text: one string object for both, so the reply pickles it once
    same = {m.text: m.text for m in reply.chunks.values()}
    reply.matched = {row: (kind, same.get(text, text)) for row, (kind, text) in matched.items()}
    reply.search_ms += (time.perf_counter() - t0) * 1000
    return reply


def search_loaded(ls: LoadedShard, shard: int, qvecs: np.ndarray, q: Query) -> ShardReply:
    """The shard's final hits for every query vector, for a caller that merges in this process."""
    return search_hits(ls, shard, qvecs, q, False)[0]


def group_winners(tops: list[list[list[ChunkResult]]], k: int, policy) -> list[set[int]] | None:
    """Per query, the chunks of a group of shards (one replica's, or one shard) that can reach the page,
    from each shard's top k (`tops[shard][query]`): under max fusion without BM25 the group's own top k in
    the merge's order (best score, then the shard and row of the best vector), as any other chunk has k
    of the group above it everywhere; under rrf, sum or hybrid fusion a chunk's rank depends on every
    shard's lists, so None."""
    if policy.fusion != "max" or policy.bm25_alpha is not None:
        return None
    out = []
    for per_query in zip(*tops):
        ranked = sorted((r for res in per_query for r in res), key=lambda r: (-r.score, *r.matches[0][:2]))
        out.append({r.chunk_idx for r in ranked[:k]})
    return out


def group_pages(loaded: list[LoadedShard], found: list[tuple[ShardReply, list]], q: Query) -> list[ShardReply]:
    """The replies of a group of shards (or of one) searched by `search_hits(..., tops=True)`, made pages
    together: what a shard replica sends."""
    keep = group_winners([tops for _, tops in found], q.k, q.policy)
    return [add_page(ls, reply, tops, q, keep) for ls, (reply, tops) in zip(loaded, found)]
