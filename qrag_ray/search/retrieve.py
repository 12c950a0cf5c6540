"""The retrieval core, the one path of `qrag search`, `qrag eval` and the Router from query vectors to
pages, wherever an index version's shards live: ask every shard once, merge once per query, format the
page from what the replies carry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

import numpy as np

from qrag_ray.errors import QragError
from qrag_ray.search.merge import merge_hits
from qrag_ray.search.page import SearchResult, format_page
from qrag_ray.search.query import QueryBatch
from qrag_ray.search.shard import Shard, search_shards
from qrag_ray.search.shard_reply import ShardReply


class LocalShards:
    """Shards searched in this process, all in one call: an index's shards opened up front (`qrag search`,
    `qrag eval`) or a small tenant's from the Router's cache. `open_shard(key, number)` gives shard `number`
    of the version `key` names (opaque here); `forget(key, number)` drops it from a cache; `offload` runs the
    search in a worker thread, keeping an event loop (a Serve replica's) free; `searched(key, replies)` hears
    of every search (the Router's metrics). serving's RemoteShards has the same methods over the
    ShardSearcher deployments: a backend differs only in where the shard lives."""

    path = "router"  # what `timings.path` says of a search here

    def __init__(self, open_shard: Callable[[Hashable, int], Awaitable[Shard]],
                 forget: Callable[[Hashable, int], object] | None = None, offload: bool = False,
                 searched: Callable[[Hashable, list[ShardReply]], None] | None = None):
        self.open_shard = open_shard
        self.forget = forget
        self.offload = offload
        self.searched = searched

    async def search(self, key: Hashable, num_shards: int, vectors: np.ndarray, batch: QueryBatch) -> list[ShardReply]:
        """Every shard's reply for the batch (a cold tenant's shards open at once)."""
        shards = await asyncio.gather(*[self.open_shard(key, number) for number in range(num_shards)])
        if self.offload:
            replies = await asyncio.to_thread(search_shards, shards, vectors, batch)
        else:
            replies = search_shards(shards, vectors, batch)
        if self.searched is not None:
            self.searched(key, replies)
        return replies

    async def fetch(self, key: Hashable, number: int, chunk_idx: list[int] | None, doc_id: str | None) -> list[dict]:
        """The records of these chunks, or of a document's chunks, in shard `number` (Shard.fetch_records)."""
        shard = await self.open_shard(key, number)
        return await asyncio.to_thread(shard.fetch_records, chunk_idx, doc_id)

    async def prepare(self, key: Hashable, number: int) -> None:
        """Open shard `number` before it gets traffic (a new version, or start-up)."""
        await self.open_shard(key, number)

    async def retire(self, key: Hashable, number: int) -> None:
        """Drop shard `number` of a version no request starts on any more."""
        if self.forget is not None:
            self.forget(key, number)


@dataclass
class BatchPages:
    """A batch's pages, one per query vector, with the replies they were merged from and the timings."""

    pages: list[list[SearchResult]]
    replies: list[ShardReply]  # one per shard
    search_ms: float
    merge_ms: float
    format_ms: float
    rounds: int  # the most widening rounds any shard needed


async def retrieve(backend: LocalShards, key: Hashable, num_shards: int, vectors: np.ndarray,
                   batch: QueryBatch) -> BatchPages:
    """Top batch.k distinct chunks for each query vector (exactly k when the index holds k)."""
    if batch.policy.bm25_alpha is not None and (batch.texts is None or len(batch.texts) != len(vectors)):
        raise QragError("hybrid search (bm25_alpha) needs the query texts, not only their vectors")
    started = time.perf_counter()
    replies = await backend.search(key, num_shards, vectors, batch)
    searched = time.perf_counter()
    merged = [merge_hits([reply.hits(query) for reply in replies], batch.k, batch.min_score, batch.policy)[0]
              for query in range(len(vectors))]
    merged_at = time.perf_counter()
    chunks = {chunk_idx: meta for reply in replies for chunk_idx, meta in reply.chunks.items()}
    rows = {(reply.shard, row): text for reply in replies for row, text in reply.row_texts.items()}
    vectors_of_rows = None
    if batch.vectors:
        vectors_of_rows = {(reply.shard, row): vector for reply in replies for row, vector in reply.row_vectors.items()}
    pages = [format_page(results, chunks, rows, vectors_of_rows) for results in merged]
    return BatchPages(pages, replies, (searched - started) * 1000, (merged_at - searched) * 1000,
                      (time.perf_counter() - merged_at) * 1000, max(reply.rounds for reply in replies))
