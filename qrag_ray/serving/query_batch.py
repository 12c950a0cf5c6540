"""The Router's query batches: resolve the tenant's version, then one shared call (serving/coalesce.py; a
lone request is a call of its own): the search pass of the queries of one index version and query
parameters that waited while that group's last pass ran. A pass embeds its queries in one model call
(QueryEncoder, which also joins the calls of passes that run at once for one model) and runs the
retrieval core (qrag_ray.search.retrieve) once over the tenant's shard backend
(serving/shard_backends.py), so each shard is asked once for all of them. Queries embed where they are
searched: a model call's fixed cost (the tokenizer, the runtime's call, the thread hop) is paid once per
pass rather than once for each of the smaller sets that arrive while a pass runs. A pass holds one such
group: a small tenant's query is answered when its own pass ends, not when a big tenant's fan-out beside
it does."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from qrag_ray.errors import QragError
from qrag_ray.search.filters import InvalidFilter, compile_filter
from qrag_ray.search.query import NoBm25Index, Query, check_hybrid
from qrag_ray.search.page import SearchResult
from qrag_ray.search.retrieve import retrieve
from qrag_ray.serving.api_models import SearchTimings
from qrag_ray.serving.coalesce import Coalescer
from qrag_ray.serving.api_errors import ApiError, index_unavailable
from qrag_ray.serving.shard_backends import RemoteShards, RouterShards
from qrag_ray.serving.shard_store import ShardKey, VersionMoved
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.tenant_versions import TenantIndex, TenantVersions

# Queries per search pass: as many waiting start another pass beside the group's running one, so a group's
# passes in flight grow with its load (what its ShardSearchers' replicas and autoscaling see) in full passes.
PASS_QUERIES = 32


@dataclass
class RoutedPage:
    """One request's page on the index version it was searched on (the core's `BatchPages` holds a whole batch's)."""

    results: list[SearchResult]
    index_version: str
    timings: SearchTimings


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
    """One request's query as it waits in the Router's batches."""

    text: str
    ti: TenantIndex
    key: ShardKey
    q: Query
    stage: dict  # the request's stage label, for a missed deadline's message

    @property
    def group(self) -> tuple:
        """Queries searched in one pass: one version has one policy, only a request's bm25_alpha changes it;
        a filter selects its own rows."""
        return self.key, self.q.k, self.q.min_score, self.q.policy.bm25_alpha, self.q.filter


class QueryBatcher:
    def __init__(self, encoder, local: RouterShards, remote: RemoteShards, versions: TenantVersions):
        self.encoder, self.local, self.remote, self.versions = encoder, local, remote, versions
        self.passes = Coalescer(lambda group, batch: self.search_batch(batch), PASS_QUERIES)

    def shards(self, ti: TenantIndex) -> RouterShards | RemoteShards:
        """The one choice of where a tenant version's shards are searched."""
        return self.local if ti.local else self.remote

    async def retrieve(self, tenant: Tenant, req, text: str, stage: dict) -> RoutedPage:
        """Search `text` (the query or its HyDE passage) on the tenant's version, as `req` asks."""
        for attempt in (1, 2):
            ti = await self.versions.current(tenant)
            ask = QueuedQuery(text, ti, ti.key(tenant.name), resolve_query(ti, tenant.name, req), stage)
            stage["stage"] = "waiting for its search pass"  # the pass sets its own stages
            try:
                page, timings = await self.passes.submit(ask.group, ask)
                break
            except VersionMoved:  # a plain index directory was republished under this request
                self.versions.moved(tenant.name)
                if attempt == 2:
                    raise index_unavailable(tenant.name, "its index changed twice during one request") from None
            except QragError as e:
                raise index_unavailable(tenant.name, str(e)) from None
        return RoutedPage(page, ti.version, timings)

    async def search_batch(self, batch: list[QueuedQuery]) -> list[tuple[list[SearchResult], SearchTimings]]:
        """Queries of one group (`QueuedQuery.group`) in one pass: one model call embeds them all, then one
        pass of the retrieval core asks each shard once for all their vectors. Each gets its page and its
        timings."""
        head = batch[0]
        for ask in batch:
            ask.stage["stage"] = "embedding the query"
        t0 = time.perf_counter()
        vecs, shared_call = await self.encoder.encode([a.text for a in batch], head.ti.embedder)
        embed_ms = (time.perf_counter() - t0) * 1000
        for ask in batch:
            ask.stage["stage"] = "searching the shards"
        backend = self.shards(head.ti)
        texts = None if head.q.texts is None else tuple(t for a in batch for t in a.q.texts)
        found = await retrieve(backend, head.key, head.ti.num_shards, vecs, replace(head.q, texts=texts))
        rs = found.replies
        shared = {"path": backend.path, "embed_ms": embed_ms, "embed_batch": shared_call, "search_batch": len(batch),
                  "search_ms": found.search_ms, "merge_ms": found.merge_ms, "lookup_ms": found.lookup_ms,
                  "format_ms": found.format_ms, "rounds": found.rounds,
                  "shard_search_ms": [round(r.search_ms, 3) for r in rs],
                  "cold_loads": sum(r.cold for r in rs), "shard_replicas": [r.replica for r in rs]}
        return [(found.pages[j], SearchTimings(**shared, candidates=sum(r.candidates[j] for r in rs)))
                for j in range(len(batch))]
