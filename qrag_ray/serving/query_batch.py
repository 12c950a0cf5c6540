"""The Router's query batch: resolve the tenant's version, then one batch (`@serve.batch`; a lone request is
a batch of one) embeds the concurrent queries in one encode call and runs the retrieval core
(qrag_ray.search.retrieve) once per index version and query parameters over the tenant's shard backend
(serving/shard_backends.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

import numpy as np
from ray import serve

from qrag_ray.errors import QragError
from qrag_ray.search.filters import InvalidFilter, compile_filter
from qrag_ray.search.query import NoBm25Index, Query, check_hybrid
from qrag_ray.search.results import SearchResult
from qrag_ray.search.retrieve import retrieve
from qrag_ray.serving.errors import ApiError, index_unavailable
from qrag_ray.serving.shard_backends import RemoteShards, RouterShards
from qrag_ray.serving.shard_store import ShardKey, VersionMoved
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.versions import TenantIndex, TenantVersions

@dataclass
class RoutedPage:
    """One request's page on the index version it was searched on (the core's `BatchPages` holds a whole batch's)."""

    results: list[SearchResult]
    index_version: str
    timings: dict


def resolve_query(ti: TenantIndex, tenant: str, req) -> Query:
    """The request (`api_models._Request`) as one Query on this index version: the index's fusion policy
    or the request's `bm25_alpha` over it (409 without a BM25 channel); hybrid also gets the user's words;
    its filter checked against this version's metadata schema (422 `invalid_filter`)."""
    policy = ti.policy
    if req.bm25_alpha is not None:
        policy = policy.with_bm25_alpha(req.bm25_alpha)
        try:
            check_hybrid(policy, ti.manifest, f"index '{tenant}'")
        except NoBm25Index as e:
            raise ApiError(409, "no_bm25_index", str(e)) from None
    flt = None
    if req.filter is not None or req.doc_ids is not None:
        try:
            flt = compile_filter(None if req.filter is None else req.filter.model_dump(), req.doc_ids,
                                 ti.manifest.metadata_schema)
        except InvalidFilter as e:
            raise ApiError(422, "invalid_filter", str(e)) from None
    return Query(req.k, req.min_score, policy, (req.query,) if policy.bm25_alpha is not None else None, flt)


@dataclass
class QueuedQuery:
    """One request's query as it waits in the Router's batch."""

    text: str
    ti: TenantIndex
    key: ShardKey
    q: Query
    stage: dict  # the request's stage label, for a missed deadline's message


class QueryBatcher:
    def __init__(self, encoder, local: RouterShards, remote: RemoteShards, versions: TenantVersions):
        self.encoder, self.local, self.remote, self.versions = encoder, local, remote, versions
        self._searching: set[asyncio.Task] = set()

    def shards(self, ti: TenantIndex) -> RouterShards | RemoteShards:
        """The one choice of where a tenant version's shards are searched."""
        return self.local if ti.local else self.remote

    async def retrieve(self, tenant: Tenant, req, text: str, stage: dict) -> RoutedPage:
        """Search `text` (the query or its HyDE passage) on the tenant's version, as `req` asks."""
        for attempt in (1, 2):
            ti = await self.versions.current(tenant)
            stage["stage"] = "embedding the query"  # queued for, or in, the batch's encode
            try:
                page, timings = await (await self._batch(QueuedQuery(text, ti, ti.key(tenant.name),
                                                               resolve_query(ti, tenant.name, req), stage)))
                break
            except VersionMoved:  # a plain index directory was republished under this request
                self.versions.moved(tenant.name)
                if attempt == 2:
                    raise index_unavailable(tenant.name, "its index changed twice during one request") from None
            except QragError as e:
                raise index_unavailable(tenant.name, str(e)) from None
        return RoutedPage(page, ti.version, timings)

    # No wait: under load the queue fills while a batch encodes (one encode at a time: QueryEncoder). A batch
    # ends with its encode; its searches go on outside it, so the next batch's encode overlaps them.
    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0, max_concurrent_batches=2)
    async def _batch(self, asks: list[QueuedQuery]) -> list[asyncio.Future]:
        return await self.run_batch(asks)

    async def run_batch(self, asks: list[QueuedQuery]) -> list[asyncio.Future]:
        """Concurrent requests' queries: one encode call per model, then one pass of the retrieval core per
        index version and query parameters, so each shard is asked once for all of that group's vectors.
        Each ask gets a future of (its page, its timings) or of the error its group met, set when its own
        group is done: a small tenant's query does not wait for a big tenant's fan-out in the same batch."""
        t0 = time.perf_counter()
        vecs = await self.encoder.encode([a.text for a in asks], [a.ti.embedder for a in asks])
        embed_ms = (time.perf_counter() - t0) * 1000
        groups: dict[tuple, list[int]] = {}
        for i, a in enumerate(asks):  # one version has one policy: only a request's bm25_alpha changes it
            groups.setdefault((a.key, a.q.k, a.q.min_score, a.q.policy.bm25_alpha, a.q.filter), []).append(i)
        loop = asyncio.get_running_loop()
        out = [loop.create_future() for _ in asks]  # a request that gave up (deadline) cancelled its own

        async def search(idx: list[int]) -> None:
            head, backend = asks[idx[0]], self.shards(asks[idx[0]].ti)
            for i in idx:
                asks[i].stage["stage"] = "searching the shards"
            texts = None if head.q.texts is None else tuple(t for i in idx for t in asks[i].q.texts)
            try:
                found = await retrieve(backend, head.key, head.ti.num_shards, np.stack([vecs[i] for i in idx]),
                                       replace(head.q, texts=texts))
            except Exception as e:  # noqa: BLE001 - every request of the group gets it, the other groups go on
                for i in (i for i in idx if not out[i].done()):
                    out[i].set_exception(e)
                return
            rs = found.replies
            for j, i in ((j, i) for j, i in enumerate(idx) if not out[i].done()):
                out[i].set_result((found.pages[j], {
                    "path": backend.path, "embed_ms": embed_ms, "embed_batch": len(asks), "search_batch": len(idx),
                    "search_ms": found.search_ms, "merge_ms": found.merge_ms, "lookup_ms": found.lookup_ms,
                    "format_ms": found.format_ms, "rounds": found.rounds,
                    "candidates": sum(int((r.hits[j].rows[0] >= 0).sum()) for r in rs),
                    "shard_search_ms": [round(r.search_ms, 3) for r in rs], "cold_loads": sum(r.cold for r in rs),
                    "shard_replicas": [r.replica for r in rs]}))

        for idx in groups.values():  # the loop keeps only weak references to tasks
            task = asyncio.ensure_future(search(idx))
            self._searching.add(task)
            task.add_done_callback(self._searching.discard)
        return out
