"""The Router deployment (FastAPI ingress): its routes, each a thin call into the modules that do the
work. One deadline (`request_timeout_s`) covers a request; overload and per-tenant limits answer 503 /
429 with Retry-After at once.

No `from __future__ import annotations` here: FastAPI reads the routes' parameter types from their
annotations, and Serve pickles this class by value, so a route's string annotation ("Request") is resolved
against globals that lack the name; a FastAPI that then takes it for a query parameter answers every route 422."""

import asyncio
import logging
import time

from fastapi import Path, Query, Request
from fastapi.responses import JSONResponse
from ray import serve

from qrag_ray.runtime.long_lived import freeze_long_lived
from qrag_ray.search.retrieve import LocalShards
from qrag_ray.serving import api_models as m
from qrag_ray.serving.answer import Answerer
from qrag_ray.serving.api_errors import ApiError, overloaded
from qrag_ray.serving.app_metrics import process_metrics
from qrag_ray.serving.config import AppArgs, replica_id
from qrag_ray.serving.console import Console
from qrag_ray.serving.console_models import ConsoleIndex, ConsoleOperate, ConsoleVectors
from qrag_ray.serving.encoder import QueryEncoder
from qrag_ray.serving.fetcher import Fetcher
from qrag_ray.serving.http import app, bearer, error_responses, metrics_of, window_of
from qrag_ray.serving.ratelimit import RateLimiter
from qrag_ray.serving.registry import TenantRegistry
from qrag_ray.serving.search_passes import SearchPasses
from qrag_ray.serving.shard_cache import ShardCache
from qrag_ray.serving.shard_searcher import RemoteShards
from qrag_ray.serving.tenant_versions import IndexReader, TenantVersions
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.writes import TenantWrites, receipt

logger = logging.getLogger("ray.serve")

_QUERY_ERRORS = error_responses(400, 401, 403, 404, 409, 422, 429, 501, 502, 503, 504)
_FETCH_ERRORS = error_responses(401, 403, 404, 422, 429, 503, 504)
_CONSOLE_ERRORS = error_responses(401, 403, 404, 422, 429, 503, 504)
_INDEX = Query(None, pattern=m.INDEX_NAME, description="index name; defaults to the one the API key belongs to")
_WRITE_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 422, 429, 503, 504)


@serve.ingress(app)
class Router:
    async def __init__(self, searchers: list, synthesizer, args: AppArgs, writer=None):
        self.args = args
        self.searchers = RemoteShards(searchers, args.tenant_affinity, args.shards_per_searcher)
        self.registry = TenantRegistry.from_file(args.tenants) if args.tenants else TenantRegistry(args.load_tenants())
        self.limiter = RateLimiter()
        self._configure_limits()
        # one intra-op thread (torch or ONNX Runtime): the encoder runs one model call at a time beside the event
        # loop and the small tenants' searches, which the replica's other CPUs are for; a pool of intra-op
        # threads spins at its barriers whenever the node's cores are busy, the load at which CPU per
        # request counts
        self.encoder = QueryEncoder(threads=1)
        self.metrics = process_metrics()
        # small tenants' shards, searched here (no shard hop) from the Router's own cache
        self.cache = ShardCache(args.router_cache_bytes, args.faiss_threads, self.metrics)
        local = LocalShards(self.cache.get, self.cache.retire, offload=True,
                            searched=lambda key, replies: self.metrics.searched(key.tenant, replies))
        reader = IndexReader(len(searchers) * args.shards_per_searcher, args.local_search_max_bytes, local,
                             self.searchers)
        self.versions = TenantVersions(reader, self.encoder.model, retire_after_s=args.request_timeout_s + 1.0)
        self.passes = SearchPasses(self.encoder, self.versions, replica_id())
        self.fetcher = Fetcher(self.versions)
        self.answerer = Answerer(synthesizer, args.hyde_max_tokens, args.answer_min_cosine)
        self.console = Console(args.console)
        self.writes = TenantWrites(args.writes, writer) if writer is not None else None
        self._inflight = 0
        self._ready = False  # the warm-up has finished (set before the constructor returns)
        self._watcher: asyncio.Task | None = None
        self._reporter = asyncio.get_running_loop().create_task(self.metrics.report_versions(self.cache))
        await self._warm_up()
        self._ensure_watcher()

    # ---- background: registry reloads, version swaps ---------------------------------------------
    def _configure_limits(self) -> None:
        default = self.args.default_rate_limit
        self.limiter.configure({t.name: ((lim.rps, lim.burst) if (lim := t.rate_limit or default) else None)
                                for t in self.registry.tenants.by_name.values()})

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _warm_up(self) -> None:
        """What the first requests would otherwise pay, paid before the constructor returns (Serve sends a
        replica nothing until then, so no request waits on a warming replica, at start-up, under load or in
        a rollout): the first `warm_tenants` tenants loaded on every shard with their embedders (a broken one
        shows in the admin status before traffic), then one search of each, which makes the encoder's first
        model call, the handles to the ShardSearcher deployments and their first search. A step that fails
        is logged and the replica starts anyway: the requests then pay what is left."""
        try:
            tenants = self.registry.tenants.by_name
            await self.versions.sync(tenants, self.args.warm_tenants)
            await self.searchers.count_replicas()
            warm = [tenant for name, tenant in list(tenants.items())[:self.args.warm_tenants]
                    if name in self.versions.active]
            await asyncio.gather(*[self._warm_search(tenant) for tenant in warm])
            await self.searchers.statuses()  # a handle to every ShardSearcher deployment, even with no tenant on it
        except Exception:
            logger.exception("warm-up failed; the replica starts without it")
        freeze_long_lived()  # the first tenants' models and shards are loaded: what the replica keeps
        self._ready = True

    async def _warm_search(self, tenant: Tenant) -> None:
        request = m.SearchRequest(query="warm-up", k=1)
        try:
            async with asyncio.timeout(self.args.request_timeout_s):
                await self.passes.search(tenant, request, request.query, {})
        except Exception as error:
            logger.warning("warm-up search of tenant %r failed: %r", tenant.name, error)

    async def _watch(self) -> None:
        while True:
            try:
                if self.registry.refresh():
                    self._configure_limits()
                await self.versions.sync(self.registry.tenants.by_name)
                await self.searchers.count_replicas()
            except Exception:
                logger.exception("tenant watcher pass failed")
            await asyncio.sleep(self.args.tenants_reload_s)

    # ---- per request ---------------------------------------------------------------------------
    def _auth(self, request: Request, index: str | None = None) -> Tenant:
        self._ensure_watcher()
        tenants = self.registry.tenants
        tenant = tenants.authenticate(request.headers.get("authorization"))
        request.state.tenant = tenant.name
        tenant = tenants.resolve(tenant, index)
        if wait := self.limiter.retry_after(tenant.name):
            raise ApiError(429, "rate_limited", f"tenant '{tenant.name}' is over its request rate; retry in {wait} s",
                           {"Retry-After": str(wait)})
        return tenant

    async def _deadline(self, coro, stage: dict):
        """Run a request under the app's deadline; a miss is a 504 that names the stage it was in."""
        if self._inflight >= self.args.max_inflight:
            coro.close()
            raise overloaded(f"{self._inflight} requests in flight on this replica")
        self._inflight += 1
        try:
            async with asyncio.timeout(self.args.request_timeout_s):  # in this request's task: no task of its own
                return await coro
        except TimeoutError:
            where = stage.get("stage", "starting")
            raise ApiError(504, "deadline_exceeded", "the request did not finish within its "
                           f"{self.args.request_timeout_s:g} s deadline (it was {where})") from None
        finally:
            self._inflight -= 1

    async def _retrieve(self, request: Request, tenant: Tenant, req: m._Request, stage: dict):
        """(the retrieval, the HyDE passage) for the request's query."""
        text, hypothetical = await self.answerer.query_text(req, stage)
        routed = await self.passes.search(tenant, req, text, stage)
        metrics = metrics_of(request.app)
        metrics.before.observe(routed.timings.candidates, tags={"tenant": tenant.name})
        metrics.after.observe(len(routed.results), tags={"tenant": tenant.name})
        return routed, hypothetical

    # ---- routes --------------------------------------------------------------------------------
    @app.post("/v1/search", response_model=m.SearchResponse, responses=_QUERY_ERRORS, dependencies=[bearer])
    async def search(self, req: m.SearchRequest, request: Request) -> m.SearchResponse:
        """Top k distinct chunks for a query (exactly k when the index has them)."""
        started = time.perf_counter()
        tenant = self._auth(request, req.index)
        stage: dict = {}

        async def run():
            routed, hypothetical = await self._retrieve(request, tenant, req, stage)
            return m.SearchResponse(results=routed.results, index=tenant.name, index_version=routed.index_version,
                                    mode=req.mode, took_ms=(time.perf_counter() - started) * 1000,
                                    hypothetical=hypothetical, query_vector=routed.query_vector, timings=routed.timings)

        return await self._deadline(run(), stage)

    @app.post("/v1/answer", response_model=m.AnswerResponse, responses=_QUERY_ERRORS, dependencies=[bearer])
    async def answer(self, req: m.AnswerRequest, request: Request) -> m.AnswerResponse:
        """An answer synthesized from the retrieved chunks with [n] citations, or "I don't know"."""
        started = time.perf_counter()
        tenant = self._auth(request, req.index)
        self.answerer.require("/v1/answer")
        stage: dict = {}

        async def run():
            routed, _ = await self._retrieve(request, tenant, req, stage)
            answer, citations = await self.answerer.answer(req.query, routed.results, req.max_tokens, stage)
            return m.AnswerResponse(answer=answer, citations=citations, results=routed.results, index=tenant.name,
                                    index_version=routed.index_version, mode=req.mode,
                                    took_ms=(time.perf_counter() - started) * 1000)

        return await self._deadline(run(), stage)

    @app.get("/v1/chunks/{chunk_id:path}", response_model=m.ChunkResponse, responses=_FETCH_ERRORS,
             dependencies=[bearer])
    async def chunk(self, request: Request, chunk_id: str = Path(..., description="the chunk id (doc_id#n; "
                                                                                  "percent-encode the #)"),
                    index: str | None = _INDEX) -> m.ChunkResponse:
        """One chunk by id: its text, title, document, url, metadata and generated questions."""
        tenant = self._auth(request, index)
        stage: dict = {}
        return await self._deadline(self.fetcher.chunk(tenant, chunk_id, stage), stage)

    @app.get("/v1/documents/{doc_id:path}", response_model=m.DocumentResponse, responses=_FETCH_ERRORS,
             dependencies=[bearer])
    async def document(self, request: Request, doc_id: str = Path(..., description="the document id"),
                       index: str | None = _INDEX) -> m.DocumentResponse:
        """One document by id: its url and metadata, and its chunks in document order."""
        tenant = self._auth(request, index)
        stage: dict = {}
        return await self._deadline(self.fetcher.document(tenant, doc_id, stage), stage)

    @app.get("/v1/indexes", response_model=m.IndexesResponse, responses=error_responses(401, 429),
             dependencies=[bearer])
    async def indexes(self, request: Request) -> m.IndexesResponse:
        """The indexes this key may query (its tenant's)."""
        tenant = self._auth(request)
        try:
            version = await self.versions.current(tenant)
        except ApiError as error:
            return m.IndexesResponse(indexes=[m.IndexInfo(name=tenant.name, index_version=None, representation=None,
                                                          num_shards=None, embedder=None, available=False,
                                                          error=error.message)])
        manifest = version.manifest
        return m.IndexesResponse(indexes=[m.IndexInfo(
            name=tenant.name, index_version=version.index_version, representation=manifest.representation,
            num_shards=version.num_shards, embedder=version.embedder,
            counts=manifest.counts.model_dump() if manifest.counts else {}, available=True)])

    # ---- writes (docs/SERVING.md, "Writing to a tenant"): logged here, applied by the Writer ----------
    def _auth_write(self, request: Request, index: str | None) -> Tenant:
        tenant = self._auth(request, index)
        tenant.require_write()
        if self.writes is None:
            raise ApiError(409, "not_writable", "this server takes no writes (its app args set writes.enabled: false)")
        return tenant

    @app.post("/v1/documents", status_code=202, response_model=m.WriteReceipt, responses=_WRITE_ERRORS,
              dependencies=[bearer])
    async def upsert_documents(self, req: m.DocumentsRequest, request: Request) -> m.WriteReceipt:
        """Add or replace documents (upsert by id); durable when answered, searchable once applied."""
        tenant = self._auth_write(request, req.index)
        nbytes = len(await request.body())
        docs = [d.model_dump() for d in req.documents]
        stage: dict = {"stage": "logging the batch"}
        entry = await self._deadline(asyncio.to_thread(self.writes.upsert, tenant, docs, nbytes), stage)
        self.writes.nudge(tenant)
        return m.WriteReceipt(**receipt(tenant, entry))

    @app.delete("/v1/documents", status_code=202, response_model=m.WriteReceipt, responses=_WRITE_ERRORS,
                dependencies=[bearer])
    async def delete_documents(self, req: m.DeleteDocumentsRequest, request: Request) -> m.WriteReceipt:
        """Delete documents by id, or every document a filter matches when the deletion is applied."""
        tenant = self._auth_write(request, req.index)
        nbytes = len(await request.body())
        spec = None if req.filter is None else req.filter.model_dump(mode="json")
        stage: dict = {"stage": "logging the batch"}
        entry = await self._deadline(asyncio.to_thread(self.writes.delete, tenant, req.ids, spec, nbytes), stage)
        self.writes.nudge(tenant)
        return m.WriteReceipt(**receipt(tenant, entry))

    @app.get("/v1/writes/{write_id}", response_model=m.WriteStatus, responses=error_responses(401, 403, 404, 429, 503),
             dependencies=[bearer])
    async def write_status(self, request: Request, write_id: str = Path(..., description="a write id from a 202"),
                           index: str | None = _INDEX) -> m.WriteStatus:
        """Where a write is: queued, indexing (chunks embedded so far), searchable, or failed (record, reason)."""
        tenant = self._auth(request, index)
        if self.writes is None:
            raise ApiError(404, "not_found", f"no write {write_id!r}: this server takes no writes")
        return m.WriteStatus(**await asyncio.to_thread(self.writes.status, tenant, write_id))

    @app.get("/healthz", response_model=m.HealthResponse)
    async def healthz(self) -> m.HealthResponse:
        """Liveness: this replica answers. No key, no details (per-tenant state is the admin status's)."""
        self._ensure_watcher()
        return m.HealthResponse(status="ok")

    @app.get("/readyz", response_model=m.HealthResponse, responses={503: {"model": m.ReadyResponse,
                                                                          "description": "still warming up"}})
    async def readyz(self):
        """Readiness: 200 once the replica is constructed, which is after its warm-up (the first tenants'
        shards and models loaded, failures included: they are the admin status's to report; one search of
        each); 503 before. No key, no details."""
        self._ensure_watcher()
        if self._ready:
            return m.HealthResponse(status="ok")
        return JSONResponse({"status": "starting"}, status_code=503)

    @app.get("/v1/admin/status", response_model=m.AdminStatus, responses=error_responses(401, 403),
             dependencies=[bearer])
    async def admin_status(self, request: Request) -> m.AdminStatus:
        """Every tenant's served version and problems, every shard deployment's cache (admin key only)."""
        self._ensure_watcher()
        tenants, reg = self.registry.tenants, self.registry
        tenants.is_admin(request.headers.get("authorization"))
        replies = await self.searchers.statuses()
        shards = [m.CacheStatus(shard=group, reachable=False, error=type(status).__name__)
                  if isinstance(status, BaseException) else m.CacheStatus(shard=group, **status)
                  for group, status in enumerate(replies)]
        local = self.cache.status()
        problems = [(t, p) for st in [local, *replies] if isinstance(st, dict) for t, p in st["problems"].items()]
        out = [self._tenant_status(t, [p for name, p in problems if name == t.name]) for t in tenants.by_name.values()]
        ok = all(t.status == "ok" for t in out) and all(s.reachable for s in shards) and reg.error is None
        return m.AdminStatus(status="ok" if ok else "degraded", ready=self._ready, tenants=out, shards=shards,
                             router_cache=m.CacheStatus(**local),
                             registry=m.RegistryStatus(path=str(reg.path) if reg.path else None,
                                                       tenants=len(tenants.by_name), reloads=reg.reloads,
                                                       loaded_at=reg.loaded_at, error=reg.error),
                             inflight=self._inflight)

    def _tenant_status(self, tenant: Tenant, shard_problems: list[dict]) -> m.TenantStatus:
        active = self.versions.active.get(tenant.name)
        newest, problem = self.versions.newest(tenant)
        versions = {x.index_version for x in (active, newest) if x is not None}
        problems = ([problem] if problem else []) + [f"shard {p['shard']}: {p['reason']}" for p in shard_problems
                                                     if p["version"] in versions]
        known = active or newest
        return m.TenantStatus(
            name=tenant.name, status="error" if problems else "ok", problems=problems,
            searched_in=None if known is None else known.backend.path,
            serving_version=active.index_version if active else None,
            current_version=newest.index_version if newest else None,
            num_shards=known.num_shards if known else None,
            rate_limit=tenant.rate_limit.model_dump() if tenant.rate_limit else None)

    # ---- the console (serving/console.py): its pages, and the reads they need that no route above gives
    @app.get("/console", include_in_schema=False)
    async def console_entry(self):
        """The console's address without its slash: the browser is sent to `console/`."""
        return self.console.entry()

    @app.get("/console/", include_in_schema=False)
    async def console_page(self):
        """The console's page."""
        return self.console.page()

    @app.get("/console/{name}", include_in_schema=False)
    async def console_asset(self, name: str):
        """One of the console's script and style files."""
        return self.console.asset(name)

    @app.get("/v1/console/index", response_model=ConsoleIndex, responses=_CONSOLE_ERRORS, dependencies=[bearer],
             tags=["console"])
    async def console_index(self, request: Request, index: str | None = _INDEX,
                            sample: int = Query(5, ge=0, le=20, description="sample chunks to show")) -> ConsoleIndex:
        """The key's index as `qrag info` describes it, with its metadata fields' filter operators (the console)."""
        tenant = self._auth(request, index)  # first: a request without a key is a 401 whether or not the console is on
        self.console.require()
        stage: dict = {"stage": "describing the index"}

        async def run():
            version = await self.versions.current(tenant)
            return await self.console.index(version, tenant.name, self.args.generator is not None, sample)

        return await self._deadline(run(), stage)

    @app.get("/v1/console/vectors/{chunk_id:path}", response_model=ConsoleVectors, responses=_CONSOLE_ERRORS,
             dependencies=[bearer], tags=["console"])
    async def console_vectors(self, request: Request, chunk_id: str = Path(..., description="the chunk id"),
                              index: str | None = _INDEX) -> ConsoleVectors:
        """Every vector of one chunk: its kind and the text embedded (the console's chunk page)."""
        tenant = self._auth(request, index)  # first: a request without a key is a 401 whether or not the console is on
        self.console.require()
        stage: dict = {"stage": "reading the chunk's vectors"}

        async def run():
            version = await self.versions.current(tenant)
            return await self.console.vectors(version, tenant.name, chunk_id)

        return await self._deadline(run(), stage)

    @app.get("/v1/console/operate", response_model=ConsoleOperate, responses=error_responses(401, 403, 404),
             dependencies=[bearer], tags=["console"])
    async def console_operate(self, request: Request) -> ConsoleOperate:
        """The admin status with each tenant's requests in this replica's last minute, index bytes and the
        app's deployments (admin key only; the console's operate view)."""
        status = await self.admin_status(request)  # the admin key's check first, as above
        self.console.require()
        window = window_of(request.app)
        return await self.console.operate(status, dict(self.versions.active), window.stats(), window.seconds)

    def check_health(self) -> None:
        """Serve's periodic probe: restart a replica whose tenant watcher died (it would stop seeing
        key rotations and new versions) or whose metrics task did."""
        for name, task in (("tenant watcher", self._watcher), ("metrics task", self._reporter)):
            if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"{name} failed: {task.exception()!r}")
