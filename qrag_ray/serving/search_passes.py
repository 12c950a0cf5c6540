"""The Router's search passes: resolve the tenant's version, then one shared call (serving/coalesce.py; a
lone request is a call of its own): the pass of the queries of one index version and query parameters
that waited while that group's last pass ran. A pass embeds its queries in one model call (QueryEncoder,
which also joins the calls of passes that run at once for one model) and runs the retrieval core
(qrag_ray.search.retrieve) once over the version's shard backend, so each shard is asked once for all of
them. Queries embed where they are
searched: a model call's fixed cost (the tokenizer, the runtime's call, the thread hop) is paid once per
pass rather than once for each of the smaller sets that arrive while a pass runs. A pass holds one such
group: a small tenant's query is answered when its own pass ends, not when a big tenant's fan-out beside
it does."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from qrag_ray.errors import QragError
from qrag_ray.search.filters import InvalidFilter, compile_filter
from qrag_ray.search.page import SearchResult
from qrag_ray.search.query import NoBm25Index, QueryBatch, check_hybrid
from qrag_ray.search.retrieve import retrieve
from qrag_ray.serving.api_errors import ApiError, index_unavailable
from qrag_ray.serving.api_models import SearchTimings
from qrag_ray.serving.coalesce import Coalescer
from qrag_ray.serving.encoder import QueryEncoder
from qrag_ray.serving.shard_cache import VersionKey, VersionMoved
from qrag_ray.serving.tenant_versions import IndexVersion, TenantVersions
from qrag_ray.serving.tenants import Tenant

# Queries per search pass: as many waiting start another pass beside the group's running ones, whatever the
# backend's `passes_at_once`, so a big burst is searched in full passes at once.
PASS_QUERIES = 32


@dataclass
class RoutedPage:
    """One request's page on the index version it was searched on (the core's `BatchPages` holds a pass's)."""

    results: list[SearchResult]
    index_version: str
    timings: SearchTimings
    query_vector: list[float] | None = None  # with include_vectors: the vector the shards were searched with


def resolve_query(version: IndexVersion, tenant: str, request) -> QueryBatch:
    """The request (`api_models._Request`) as a batch of one on this index version: the index's fusion policy
    or the request's `bm25_alpha` over it (409 without a BM25 channel); hybrid also gets the user's words;
    its filter checked against this version's metadata schema (422 `invalid_filter`)."""
    policy = version.policy
    if request.bm25_alpha is not None:
        policy = policy.with_bm25_alpha(request.bm25_alpha)
        try:
            check_hybrid(policy, version.manifest, f"index '{tenant}'")
        except NoBm25Index as error:
            raise ApiError(409, "no_bm25_index", str(error)) from None
    compiled = None
    if request.filter is not None or request.doc_ids is not None:
        try:
            compiled = compile_filter(None if request.filter is None else request.filter.model_dump(), request.doc_ids,
                                      version.metadata_schema)
        except InvalidFilter as error:
            raise ApiError(422, "invalid_filter", str(error)) from None
    texts = (request.query,) if policy.bm25_alpha is not None else None
    return QueryBatch(request.k, request.min_score, policy, texts, compiled, getattr(request, "include_vectors", False))


@dataclass
class QueuedQuery:
    """One request's query as it waits for its search pass."""

    text: str
    version: IndexVersion
    key: VersionKey
    batch: QueryBatch  # the request's own batch of one
    stage: dict  # the request's stage label, for a missed deadline's message

    @property
    def group(self) -> tuple:
        """Queries searched in one pass: one version has one policy, only a request's bm25_alpha changes it;
        a filter selects its own rows. Its last item is the version's shard backend (its passes at once)."""
        batch = self.batch
        return (self.key, batch.k, batch.min_score, batch.policy.bm25_alpha, batch.filter, batch.vectors,
                self.version.backend)


def passes_at_once(group: tuple) -> int:
    """How many passes of a query group run at once before its queries wait for one: its backend's
    `passes_at_once` (RemoteShards: the shard groups' running replicas), else 1 (the Router's own shards)."""
    return getattr(group[-1], "passes_at_once", 1)


class SearchPasses:
    """The Router's searches: each request joins the pass of its group (`QueuedQuery.group`); a group whose
    shards have several replicas runs that many passes at once (`passes_at_once`), the waiting queries split
    among them, so every replica takes a share of a big tenant's load."""

    def __init__(self, encoder: QueryEncoder, versions: TenantVersions, replica: str = ""):
        self.encoder = encoder
        self.versions = versions
        self.replica = replica  # this Router replica's id, which every response names
        self.passes = Coalescer(self._run_pass, PASS_QUERIES, passes_at_once)

    async def search(self, tenant: Tenant, request, text: str, stage: dict) -> RoutedPage:
        """Search `text` (the query or its HyDE passage) on the tenant's version, as `request` asks."""
        for attempt in (1, 2):
            version = await self.versions.current(tenant)
            queued = QueuedQuery(text, version, version.key(tenant.name), resolve_query(version, tenant.name, request),
                                 stage)
            stage["stage"] = "waiting for its search pass"  # the pass sets its own stages
            try:
                page, timings, vector = await self.passes.submit(queued.group, queued)
                break
            except VersionMoved:  # a plain index directory was republished under this request
                self.versions.moved(tenant.name)
                if attempt == 2:
                    raise index_unavailable(tenant.name, "its index changed twice during one request") from None
            except QragError as error:
                raise index_unavailable(tenant.name, str(error)) from None
        return RoutedPage(page, version.index_version, timings, vector)

    async def _run_pass(self, group: tuple, queued: list[QueuedQuery]) -> list[tuple]:
        """The queries of one group in one pass: one model call embeds them all, then one pass of the retrieval
        core asks each shard once for all their vectors. Each gets its page, its timings and (when its batch
        asks) its query vector."""
        head = queued[0]
        for query in queued:
            query.stage["stage"] = "embedding the query"
        started = time.perf_counter()
        vectors, shared_call = await self.encoder.encode([query.text for query in queued], head.version.embedder)
        embed_ms = (time.perf_counter() - started) * 1000
        for query in queued:
            query.stage["stage"] = "searching the shards"
        backend = head.version.backend
        texts = None if head.batch.texts is None else tuple(text for query in queued for text in query.batch.texts)
        found = await retrieve(backend, head.key, head.version.num_shards, vectors, replace(head.batch, texts=texts))
        replies = found.replies
        shared = {"path": backend.path, "embed_ms": embed_ms, "embed_batch": shared_call, "search_batch": len(queued),
                  "search_ms": found.search_ms, "merge_ms": found.merge_ms, "format_ms": found.format_ms,
                  "rounds": found.rounds, "shard_search_ms": [round(reply.search_ms, 3) for reply in replies],
                  "cold_loads": sum(reply.cold for reply in replies),
                  "shard_replicas": [reply.replica for reply in replies], "router_replica": self.replica}
        pages = []
        for query in range(len(queued)):
            timings = SearchTimings(**shared, candidates=sum(reply.candidates[query] for reply in replies))
            vector = vectors[query].astype(float).tolist() if head.batch.vectors else None
            pages.append((found.pages[query], timings, vector))
        return pages
