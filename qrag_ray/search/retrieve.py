"""The retrieval core, the one path of `qrag search`, `qrag eval` and the Router from query vectors to
pages over any shard backend: ask every shard, merge once per query, fetch what the page lacks, format."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from qrag_ray.errors import QragError
from qrag_ray.index.format import shard_of
from qrag_ray.search.merge import ChunkResult, merge_hits
from qrag_ray.search.query import Query
from qrag_ray.search.page import ChunkMeta, SearchResult, format_page
from qrag_ray.search.shard_search import LoadedShard, ShardReply, search_loaded

Wanted = dict[int, tuple[list[int], list[int]]]  # shard -> (rows, chunk_idx) whose metadata the page needs
Found = list[tuple[dict[int, tuple[str, str]], dict[int, ChunkMeta]]]  # per wanted shard: (row -> (kind, text), meta)


class ShardBackend(Protocol):
    """Where an index version's shards are searched; `key` names the version (opaque to the core)."""

    async def search(self, key: Hashable, num_shards: int, qvecs: np.ndarray, q: Query) -> list[ShardReply]: ...

    async def lookup(self, key: Hashable, want: Wanted) -> Found: ...


class LocalShards:
    """Shards loaded in this process (`get(shard, key)`), all searched in one call, one after the other
    (a shard search is well under a millisecond on small indexes: the call is what counts). `offload`
    runs that call in a worker thread, keeping an event loop (a Serve replica's) free."""

    def __init__(self, get: Callable[[int, Hashable], Awaitable[LoadedShard]], offload: bool = False):
        self.get, self.offload = get, offload

    async def search(self, key: Hashable, num_shards: int, qvecs: np.ndarray, q: Query) -> list[ShardReply]:
        loaded = await asyncio.gather(*[self.get(s, key) for s in range(num_shards)])  # a cold tenant's load at once
        run = lambda: [search_loaded(ls, s, qvecs, q) for s, ls in enumerate(loaded)]  # noqa: E731
        return await asyncio.to_thread(run) if self.offload else run()

    async def lookup(self, key: Hashable, want: Wanted) -> Found:
        return [(ls.index.matched(rows), ls.chunk_meta(cis)) for s, (rows, cis) in want.items()
                for ls in [await self.get(s, key)]]


@dataclass
class BatchPages:
    pages: list[list[SearchResult]]  # one per query vector
    replies: list[ShardReply]  # one per shard
    search_ms: float
    merge_ms: float
    lookup_ms: float  # fetching the page's rows and chunks that the shards did not send
    format_ms: float
    rounds: int  # the most widening rounds any shard needed


async def retrieve(backend: ShardBackend, key: Hashable, num_shards: int, qvecs: np.ndarray, q: Query) -> BatchPages:
    """Top q.k distinct chunks for each query vector (exactly k when the index holds k)."""
    if q.policy.bm25_alpha is not None and (q.texts is None or len(q.texts) != len(qvecs)):
        raise QragError("hybrid search (bm25_alpha) needs the query texts, not only their vectors")
    t0 = time.perf_counter()
    replies = await backend.search(key, num_shards, qvecs, q)
    t1 = time.perf_counter()
    merged = [merge_hits([r.hits[qi] for r in replies], 0, q.k, q.min_score, q.policy)[0] for qi in range(len(qvecs))]
    t2 = time.perf_counter()
    matched = {(r.shard, row): v for r in replies for row, v in r.matched.items()}
    chunks = {ci: meta for r in replies for ci, meta in r.chunks.items()}
    if want := _missing(merged, matched, chunks, num_shards):
        for s, (mt, ch) in zip(want, await backend.lookup(key, want)):
            matched.update({(s, row): v for row, v in mt.items()})
            chunks.update(ch)
    t3 = time.perf_counter()
    pages = [format_page(res, chunks, matched) for res in merged]
    return BatchPages(pages, replies, (t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000,
                     (time.perf_counter() - t3) * 1000, max(r.rounds for r in replies))


def _missing(merged: list[list[ChunkResult]], matched: dict, chunks: dict, num_shards: int) -> Wanted:
    """Rows and chunks on the pages that no shard sent: all of them from an in-process backend, else only
    those the fusion policy ranks differently inside a shard than across shards."""
    want: dict[int, tuple[set, set]] = {}
    for res in merged:
        for r in res:
            for shard, row, _ in r.matches:
                if (shard, row) not in matched:
                    want.setdefault(shard, (set(), set()))[0].add(row)
            if r.chunk_idx not in chunks:  # the shard the pipeline wrote the chunk to
                want.setdefault(shard_of(r.chunk_idx, num_shards), (set(), set()))[1].add(r.chunk_idx)
    return {s: (sorted(rows), sorted(cis)) for s, (rows, cis) in want.items()}
