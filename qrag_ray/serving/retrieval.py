"""A query's one path inside the Router: resolve the tenant's version, embed, search its shards
(`LocalShards`: the Router's own store, `RemoteShards`: the ShardSearcher deployments), merge once,
look up the page, format. Concurrent queries are embedded in one encode call (`@serve.batch`); a lone
request on a small tenant has nothing to batch with, so it is embedded and searched in ONE
worker-thread call (`timings.path`: "router, one call", "router" or "shards")."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError

from qrag_ray.errors import QragError, find_user_error
from qrag_ray.index.format import shard_of
from qrag_ray.search.merge import merge_hits
from qrag_ray.search.shard_search import NoBm25Index, check_hybrid, format_results
from qrag_ray.serving.errors import ApiError, index_unavailable, overloaded, shard_unavailable
from qrag_ray.serving.messages import Query, ShardKey, ShardReply, VersionMoved
from qrag_ray.serving.shard_store import LoadedShard, ShardStore, search_loaded
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.versions import TenantIndex, TenantVersions

logger = logging.getLogger("ray.serve")


@dataclass
class Retrieval:
    results: list[dict]
    index_version: str
    timings: dict


@dataclass
class Hits:
    """What a backend's search gave: one reply per shard and how it ran."""

    replies: list[ShardReply]
    path: str
    embed_ms: float
    search_ms: float
    batch: int


def resolve_query(ti: TenantIndex, tenant: str, req, text: str) -> Query:
    """The request (`api_models._Request`) as one Query on this index version: the index's fusion policy
    or the request's `bm25_alpha` over it (409 without a BM25 channel); hybrid also gets the user's words."""
    policy = ti.policy
    if req.bm25_alpha is not None:
        policy = policy.with_bm25_alpha(req.bm25_alpha)
        try:
            check_hybrid(policy, ti.manifest, f"index '{tenant}'")
        except NoBm25Index as e:
            raise ApiError(409, "no_bm25_index", str(e)) from None
    return Query(text, req.k, req.min_score, policy, req.query if policy.bm25_alpha is not None else None)


def _search_all(loaded: list[LoadedShard], qvecs: np.ndarray, q: Query) -> list[ShardReply]:
    return [search_loaded(ls, shard, qvecs, q, page=False) for shard, ls in enumerate(loaded)]


def _embed_then_search(encoder, st, loaded: list[LoadedShard], q: Query) -> Hits:
    t0 = time.perf_counter()
    qv = encoder.encode_sync(st, [q.text])
    t1 = time.perf_counter()
    replies = _search_all(loaded, qv, q)
    return Hits(replies, "router, one call", (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000, 1)


class LocalShards:
    """Small tenants' shards in the Router's own process: every shard in one worker thread, one
    after the other (each search is well under a millisecond, so one thread hop is what counts)."""

    path = "router"

    def __init__(self, store: ShardStore):
        self.store = store

    async def call(self, shard: int, method: str, *args):
        return await getattr(self.store, method)(shard, *args)

    async def search(self, key: ShardKey, n: int, qvecs: np.ndarray, q: Query) -> list[ShardReply]:
        replies = await asyncio.to_thread(_search_all, await self.store.get_all(n, key), qvecs, q)
        self.store.observe(key, replies)
        return replies

    async def embed_and_search(self, encoder, ti: TenantIndex, key: ShardKey, q: Query, stage: dict) -> Hits:
        stage["stage"] = "embedding the query"
        st = await encoder.model(ti.embedder)  # loaded once; a no-op after the first request
        stage["stage"] = "embedding the query and searching"
        loaded = await self.store.get_all(ti.num_shards, key)
        hits = await asyncio.to_thread(_embed_then_search, encoder, st, loaded, q)
        self.store.observe(key, hits.replies)
        return hits

    async def lookup(self, key: ShardKey, want: dict[int, tuple[set, set]]) -> list[tuple[dict, dict]]:
        return [await self.store.lookup(s, key, sorted(rows), sorted(cis)) for s, (rows, cis) in want.items()]


class RemoteShards:
    """The ShardSearcher deployments, one per shard number; a replica that died under a call is retried
    once (Serve routes the retry to a live replica)."""

    path = "shards"

    def __init__(self, handles: list):
        self.handles = list(handles)

    async def call(self, shard: int, method: str, *args):
        for attempt in (1, 2):
            try:
                return await getattr(self.handles[shard], method).remote(shard, *args)
            except BackPressureError:
                raise overloaded(f"shard {shard} is at its queue limit") from None
            except Exception as e:
                if (ue := find_user_error(e)) is not None:  # e.g. a shard that cannot load this tenant's index
                    raise ue from None
                if not isinstance(e, (ActorDiedError, ActorUnavailableError, RayActorError)):
                    raise
                if attempt == 2:
                    raise shard_unavailable(shard, type(e).__name__) from None
                logger.warning("shard %d replica failed (%s); retrying once", shard, type(e).__name__)

    async def search(self, key: ShardKey, n: int, qvecs: np.ndarray, q: Query) -> list[ShardReply]:
        return list(await asyncio.gather(*[self.call(i, "search", key, qvecs, q) for i in range(n)]))

    async def lookup(self, key: ShardKey, want: dict[int, tuple[set, set]]) -> list[tuple[dict, dict]]:
        return list(await asyncio.gather(*[self.call(s, "lookup", key, sorted(rows), sorted(cis))
                                           for s, (rows, cis) in want.items()]))


class Retriever:
    def __init__(self, encoder, local: LocalShards, remote: RemoteShards, versions: TenantVersions):
        self.encoder, self.local, self.remote, self.versions = encoder, local, remote, versions

    async def retrieve(self, tenant: Tenant, req, text: str, stage: dict, lone: bool) -> Retrieval:
        """Search `text` (the query or its HyDE passage) on the tenant's version, as `req` asks;
        `lone`: no other request is in flight on this replica."""
        for attempt in (1, 2):
            ti = await self.versions.current(tenant)
            q = resolve_query(ti, tenant.name, req, text)
            key = ti.key(tenant.name)
            try:
                found = await self._search(ti, key, q, stage, lone)
                break
            except VersionMoved:  # a plain index directory was republished under this request
                self.versions.moved(tenant.name)
                if attempt == 2:
                    raise index_unavailable(tenant.name, "its index changed twice during one request") from None
            except QragError as e:
                raise index_unavailable(tenant.name, str(e)) from None
        tm = time.perf_counter()
        hits = [r.hits[0] for r in found.replies]
        res, _ = merge_hits(hits, 0, q.k, q.min_score, q.policy)
        merge_ms = (time.perf_counter() - tm) * 1000
        matched = {(r.shard, row): v for r in found.replies for row, v in r.matched.items()}
        chunks = {ci: meta for r in found.replies for ci, meta in r.chunks.items()}
        await self._fill_missing(ti, key, res, matched, chunks)
        tf = time.perf_counter()
        results = format_results(res, chunks.__getitem__, lambda s, row: matched[(s, row)])
        timings = {"path": found.path, "embed_ms": found.embed_ms, "embed_batch": found.batch,
                   "search_ms": found.search_ms, "merge_ms": merge_ms, "format_ms": (time.perf_counter() - tf) * 1000,
                   "rounds": max(r.rounds for r in found.replies),
                   "candidates": sum(int((h.rows[0] >= 0).sum()) for h in hits),
                   "shard_search_ms": [round(r.search_ms, 3) for r in found.replies]}
        return Retrieval(results, ti.version, timings)

    async def _search(self, ti: TenantIndex, key: ShardKey, q: Query, stage: dict, lone: bool) -> Hits:
        if lone and ti.local:
            return await self.local.embed_and_search(self.encoder, ti, key, q, stage)
        stage["stage"] = "embedding the query"
        t0 = time.perf_counter()
        vec, batch = await self._embed_batch((q.text, ti.embedder))
        t1 = time.perf_counter()
        stage["stage"] = "searching the shards"
        backend = self.local if ti.local else self.remote
        replies = await backend.search(key, ti.num_shards, vec[None, :], q)
        return Hits(replies, backend.path, (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000, batch)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0)  # no wait: under load the queue fills during an encode
    async def _embed_batch(self, items: list[tuple[str, str]]) -> list:
        """Concurrent queries' texts embedded in one call per model (items: (text, model)); each gets
        (its vector, the batch size) so the response's timings show whether batching happened."""
        vecs = await self.encoder.encode([t for t, _ in items], [mdl for _, mdl in items])
        return [(v, len(items)) for v in vecs]

    async def _fill_missing(self, ti: TenantIndex, key: ShardKey, res, matched: dict, chunks: dict) -> None:
        """Rows / chunks on the page that a shard did not send up front: the whole page of a small tenant
        (searched here, hits only), else only if the fusion policy ranks a chunk differently inside its
        shard than across shards."""
        want: dict[int, tuple[set, set]] = {}
        for r in res:
            for shard, row, _ in r.matches:
                if (shard, row) not in matched:
                    want.setdefault(shard, (set(), set()))[0].add(row)
            if r.chunk_idx not in chunks:  # the shard the pipeline wrote the chunk to
                want.setdefault(shard_of(r.chunk_idx, ti.num_shards), (set(), set()))[1].add(r.chunk_idx)
        if want:
            for s, (mt, ch) in zip(want, await (self.local if ti.local else self.remote).lookup(key, want)):
                matched.update({(s, row): v for row, v in mt.items()})
                chunks.update(ch)
