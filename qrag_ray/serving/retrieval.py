"""A request's retrieval inside the Router: resolve the tenant's version, then one batch (`@serve.batch`;
a lone request is a batch of one) embeds the concurrent queries in one encode call and runs the retrieval
core (qrag_ray.search.retrieve) once per index version and query parameters over the tenant's shard
backend: `RouterShards`, the Router's own store for small tenants, or `RemoteShards`, the ShardSearcher
deployments (`timings.path`: "router" or "shards")."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace

import numpy as np
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError

from qrag_ray.errors import QragError, find_user_error
from qrag_ray.search.query import NoBm25Index, Query, check_hybrid
from qrag_ray.search.results import SearchResult
from qrag_ray.search.retrieve import Found, LocalShards, Wanted, retrieve
from qrag_ray.search.shard_search import ShardReply
from qrag_ray.serving.errors import ApiError, index_unavailable, overloaded, shard_unavailable
from qrag_ray.serving.shard_store import ShardKey, ShardStore, VersionMoved, affinity_id
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.versions import TenantIndex, TenantVersions

logger = logging.getLogger("ray.serve")


@dataclass
class Retrieved:
    """One request's page on the index version it was searched on (the core's `Retrieval` is a batch's)."""

    results: list[SearchResult]
    index_version: str
    timings: dict


def resolve_query(ti: TenantIndex, tenant: str, req) -> Query:
    """The request (`api_models._Request`) as one Query on this index version: the index's fusion policy
    or the request's `bm25_alpha` over it (409 without a BM25 channel); hybrid also gets the user's words."""
    policy = ti.policy
    if req.bm25_alpha is not None:
        policy = policy.with_bm25_alpha(req.bm25_alpha)
        try:
            check_hybrid(policy, ti.manifest, f"index '{tenant}'")
        except NoBm25Index as e:
            raise ApiError(409, "no_bm25_index", str(e)) from None
    return Query(req.k, req.min_score, policy, (req.query,) if policy.bm25_alpha is not None else None)


class RouterShards(LocalShards):
    """Small tenants' shards in the Router's own store, searched in one worker-thread call."""

    path = "router"

    def __init__(self, store: ShardStore):
        super().__init__(store.get, offload=True)
        self.store = store

    async def call(self, shard: int, method: str, key: ShardKey, *args):
        return await getattr(self.store, method)(shard, key, *args)

    async def search(self, key: ShardKey, num_shards: int, qvecs: np.ndarray, q: Query) -> list[ShardReply]:
        replies = await super().search(key, num_shards, qvecs, q)
        self.store.observe(key, replies)
        return replies


class RemoteShards:
    """The ShardSearcher deployments, deployment g searching shards g*per .. g*per+per-1, so a query makes
    one call per deployment. A call carries its (tenant, version, g) as Serve's multiplexed model id, so
    Serve routes it to a replica that holds that group (tenant affinity); a replica that died under a call
    is retried once (Serve routes the retry to a live one)."""

    path = "shards"

    def __init__(self, handles: list, affinity: bool = True, per: int = 1):
        self.handles, self.affinity, self.per = list(handles), affinity, per

    async def call(self, shard: int, method: str, key: ShardKey, *args):
        """`method` of the deployment searching `shard`, for that shard."""
        return await self._call(shard // self.per, method, shard, key, *args)

    async def _call(self, group: int, method: str, shards, key: ShardKey, *args):
        handle = self.handles[group]
        if self.affinity:
            handle = handle.options(multiplexed_model_id=affinity_id(key, group))
        for attempt in (1, 2):
            try:
                return await getattr(handle, method).remote(shards, key, *args)
            except BackPressureError:
                raise overloaded(f"ShardSearcher{group} is at its queue limit") from None
            except Exception as e:
                if (ue := find_user_error(e)) is not None:  # e.g. a shard that cannot load this tenant's index
                    raise ue from None
                if not isinstance(e, (ActorDiedError, ActorUnavailableError, RayActorError)):
                    raise
                if attempt == 2:
                    raise shard_unavailable(shards, type(e).__name__) from None
                logger.warning("ShardSearcher%d replica failed (%s); retrying once", group, type(e).__name__)

    async def search(self, key: ShardKey, num_shards: int, qvecs: np.ndarray, q: Query) -> list[ShardReply]:
        groups = [list(range(s, min(s + self.per, num_shards))) for s in range(0, num_shards, self.per)]
        replies = await asyncio.gather(*[self._call(g, "search", shards, key, qvecs, q) for g, shards in enumerate(groups)])
        return [r for group in replies for r in group]

    async def lookup(self, key: ShardKey, want: Wanted) -> Found:
        return list(await asyncio.gather(*[self.call(s, "lookup", key, rows, cis) for s, (rows, cis) in want.items()]))


@dataclass
class _Ask:
    """One request's query as it waits in the Router's batch."""

    text: str
    ti: TenantIndex
    key: ShardKey
    q: Query
    stage: dict  # the request's stage label, for a missed deadline's message


class Retriever:
    def __init__(self, encoder, local: RouterShards, remote: RemoteShards, versions: TenantVersions):
        self.encoder, self.local, self.remote, self.versions = encoder, local, remote, versions
        self._searching: set[asyncio.Task] = set()

    def shards(self, ti: TenantIndex) -> RouterShards | RemoteShards:
        """The one choice of where a tenant version's shards are searched."""
        return self.local if ti.local else self.remote

    async def retrieve(self, tenant: Tenant, req, text: str, stage: dict) -> Retrieved:
        """Search `text` (the query or its HyDE passage) on the tenant's version, as `req` asks."""
        for attempt in (1, 2):
            ti = await self.versions.current(tenant)
            stage["stage"] = "embedding the query"  # queued for, or in, the batch's encode
            try:
                page, timings = await (await self._batch(_Ask(text, ti, ti.key(tenant.name),
                                                               resolve_query(ti, tenant.name, req), stage)))
                break
            except VersionMoved:  # a plain index directory was republished under this request
                self.versions.moved(tenant.name)
                if attempt == 2:
                    raise index_unavailable(tenant.name, "its index changed twice during one request") from None
            except QragError as e:
                raise index_unavailable(tenant.name, str(e)) from None
        return Retrieved(page, ti.version, timings)

    # No wait: under load the queue fills while a batch encodes (one encode at a time: QueryEncoder). A batch
    # ends with its encode; its searches go on outside it, so the next batch's encode overlaps them.
    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0, max_concurrent_batches=2)
    async def _batch(self, asks: list[_Ask]) -> list[asyncio.Future]:
        return await self.run_batch(asks)

    async def run_batch(self, asks: list[_Ask]) -> list[asyncio.Future]:
        """Concurrent requests' queries: one encode call per model, then one pass of the retrieval core per
        index version and query parameters, so each shard is asked once for all of that group's vectors.
        Each ask gets a future of (its page, its timings) or of the error its group met, set when its own
        group is done: a small tenant's query does not wait for a big tenant's fan-out in the same batch."""
        t0 = time.perf_counter()
        vecs = await self.encoder.encode([a.text for a in asks], [a.ti.embedder for a in asks])
        embed_ms = (time.perf_counter() - t0) * 1000
        groups: dict[tuple, list[int]] = {}
        for i, a in enumerate(asks):  # one version has one policy: only a request's bm25_alpha changes it
            groups.setdefault((a.key, a.q.k, a.q.min_score, a.q.policy.bm25_alpha), []).append(i)
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
