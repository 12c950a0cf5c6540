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
from qrag_ray.serving import api_models as m
from qrag_ray.serving.answer import Answerer
from qrag_ray.serving.config import AppArgs
from qrag_ray.serving.encoder import QueryEncoder
from qrag_ray.serving.api_errors import ApiError, overloaded
from qrag_ray.serving.fetcher import Fetcher
from qrag_ray.serving.http import app, bearer, error_responses, metrics_of
from qrag_ray.serving.ratelimit import RateLimiter
from qrag_ray.serving.registry import TenantRegistry
from qrag_ray.serving.query_batch import QueryBatcher
from qrag_ray.serving.shard_backends import RemoteShards, RouterShards
from qrag_ray.serving.shard_store import ShardStore
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.tenant_versions import IndexReader, TenantVersions
from qrag_ray.serving.writes import TenantWrites, receipt

logger = logging.getLogger("ray.serve")

_QUERY_ERRORS = error_responses(400, 401, 403, 404, 409, 422, 429, 501, 502, 503, 504)
_FETCH_ERRORS = error_responses(401, 403, 404, 422, 429, 503, 504)
_INDEX = Query(None, pattern=m.INDEX_NAME, description="index name; defaults to the one the API key belongs to")
_WRITE_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 422, 429, 503, 504)


@serve.ingress(app)
class Router:
    async def __init__(self, shards: list, synthesizer, args: dict, writer=None):
        self.args = a = AppArgs.model_validate(args)
        self.shards = list(shards)
        self.registry = TenantRegistry.from_file(a.tenants) if a.tenants else TenantRegistry(a.load_tenants())
        self.limiter = RateLimiter()
        self._configure_limits()
        # one intra-op thread (torch or ONNX Runtime): the encoder runs one model call at a time beside the event
        # loop and the small tenants' searches, which the replica's other CPUs are for; a pool of intra-op
        # threads spins at its barriers whenever the node's cores are busy, the load at which CPU per
        # request counts
        self.encoder = QueryEncoder(threads=1)
        self.local = ShardStore(a.router_cache_bytes, a.faiss_threads)
        self.versions = TenantVersions(
            IndexReader(len(self.shards) * a.shards_per_searcher, a.local_search_max_bytes),
            lambda ti, i, method, key: self.batcher.shards(ti).call(i, method, key),
            self.encoder.model, retire_after_s=a.request_timeout_s + 1.0)
        remote = RemoteShards(self.shards, a.tenant_affinity, a.shards_per_searcher)
        self.batcher = QueryBatcher(self.encoder, RouterShards(self.local), remote, self.versions)
        self.fetcher = Fetcher(self.versions, self.batcher.shards)
        self.answerer = Answerer(synthesizer, a.hyde_max_tokens, a.answer_min_cosine)
        self.writes = TenantWrites(a.writes) if writer is not None else None
        self.writer = writer
        self._nudges: set[asyncio.Task] = set()
        self._inflight = 0
        self._ready = False  # the first watcher pass (warm-up of the first tenants) has finished
        self._watcher: asyncio.Task | None = None
        self._ensure_watcher()

    # ---- background: registry reloads, version swaps ---------------------------------------------
    def _configure_limits(self) -> None:
        default = self.args.default_rate_limit
        self.limiter.configure({t.name: ((lim.rps, lim.burst) if (lim := t.rate_limit or default) else None)
                                for t in self.registry.tenants.by_name.values()})

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        first = True  # start-up: load the first tenants everywhere, so a broken one shows before traffic
        while True:
            try:
                if self.registry.refresh():
                    self._configure_limits()
                await self.versions.sync(self.registry.tenants.by_name, self.args.warm_tenants if first else None)
                if first:  # the first tenants' models and shards are loaded: what the replica keeps
                    freeze_long_lived()
                first, self._ready = False, True
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad tenant
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
            at = stage.get("stage", "starting")
            raise ApiError(504, "deadline_exceeded", "the request did not finish within its "
                           f"{self.args.request_timeout_s:g} s deadline (it was {at})") from None
        finally:
            self._inflight -= 1

    async def _retrieve(self, request: Request, tenant: Tenant, req: m._Request, stage: dict):
        """(the retrieval, the HyDE passage) for the request's query."""
        text, hypothetical = await self.answerer.query_text(req, stage)
        r = await self.batcher.retrieve(tenant, req, text, stage)
        metrics = metrics_of(request.app)
        metrics.before.observe(r.timings.candidates, tags={"tenant": tenant.name})
        metrics.after.observe(len(r.results), tags={"tenant": tenant.name})
        return r, hypothetical

    # ---- routes --------------------------------------------------------------------------------
    @app.post("/v1/search", response_model=m.SearchResponse, responses=_QUERY_ERRORS, dependencies=[bearer])
    async def search(self, req: m.SearchRequest, request: Request) -> m.SearchResponse:
        """Top k distinct chunks for a query (exactly k when the index has them)."""
        t0 = time.perf_counter()
        tenant = self._auth(request, req.index)
        stage: dict = {}

        async def run():
            r, hypothetical = await self._retrieve(request, tenant, req, stage)
            return m.SearchResponse(results=r.results, index=tenant.name, index_version=r.index_version,
                                    mode=req.mode, took_ms=(time.perf_counter() - t0) * 1000,
                                    hypothetical=hypothetical, timings=r.timings)

        return await self._deadline(run(), stage)

    @app.post("/v1/answer", response_model=m.AnswerResponse, responses=_QUERY_ERRORS, dependencies=[bearer])
    async def answer(self, req: m.AnswerRequest, request: Request) -> m.AnswerResponse:
        """An answer synthesized from the retrieved chunks with [n] citations, or "I don't know"."""
        t0 = time.perf_counter()
        tenant = self._auth(request, req.index)
        self.answerer.require("/v1/answer")
        stage: dict = {}

        async def run():
            r, _ = await self._retrieve(request, tenant, req, stage)
            answer, citations = await self.answerer.answer(req.query, r.results, req.max_tokens, stage)
            return m.AnswerResponse(answer=answer, citations=citations, results=r.results, index=tenant.name,
                                    index_version=r.index_version, mode=req.mode,
                                    took_ms=(time.perf_counter() - t0) * 1000)

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
            ti = await self.versions.current(tenant)
        except ApiError as e:
            return m.IndexesResponse(indexes=[m.IndexInfo(name=tenant.name, index_version=None, representation=None,
                                                          num_shards=None, embedder=None, available=False,
                                                          error=e.message)])
        mf = ti.manifest
        return m.IndexesResponse(indexes=[m.IndexInfo(
            name=tenant.name, index_version=ti.version, representation=mf.representation, num_shards=ti.num_shards,
            embedder=ti.embedder, counts=mf.counts.model_dump() if mf.counts else {}, available=True)])

    # ---- writes (docs/SERVING.md, "Writing to a tenant"): logged here, applied by the Writer ----------
    def _auth_write(self, request: Request, index: str | None) -> Tenant:
        tenant = self._auth(request, index)
        tenant.require_write()
        if self.writes is None:
            raise ApiError(409, "not_writable", "this server takes no writes (its app args set writes.enabled: false)")
        return tenant

    def _nudge(self, tenant: Tenant) -> None:
        """Tell the Writer a batch is logged; not waited for (its scan finds the batch anyway)."""
        task = asyncio.get_running_loop().create_task(self._send_nudge(tenant.index))
        self._nudges.add(task)
        task.add_done_callback(self._nudges.discard)

    async def _send_nudge(self, root: str) -> None:
        try:
            await self.writer.nudge.remote(root)
        except Exception:  # noqa: BLE001 - the Writer's own scan applies the batch within writes.scan_s
            logger.warning("could not nudge the Writer for %s", root, exc_info=True)

    @app.post("/v1/documents", status_code=202, response_model=m.WriteReceipt, responses=_WRITE_ERRORS,
              dependencies=[bearer])
    async def upsert_documents(self, req: m.DocumentsRequest, request: Request) -> m.WriteReceipt:
        """Add or replace documents (upsert by id); durable when answered, searchable once applied."""
        tenant = self._auth_write(request, req.index)
        nbytes = len(await request.body())
        docs = [d.model_dump() for d in req.documents]
        stage: dict = {"stage": "logging the batch"}
        entry = await self._deadline(asyncio.to_thread(self.writes.upsert, tenant, docs, nbytes), stage)
        self._nudge(tenant)
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
        self._nudge(tenant)
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
        """Readiness: 200 once the first tenants' shards and models are loaded (failures included: they
        are the admin status's to report), 503 before. No key, no details."""
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
        replies = await asyncio.gather(*[s.status.remote() for s in self.shards], return_exceptions=True)
        shards = [m.ShardStatus(shard=i, reachable=False, error=type(st).__name__) if isinstance(st, BaseException)
                  else m.ShardStatus(shard=i, reachable=True, **st) for i, st in enumerate(replies)]
        local = self.local.status()
        problems = [(t, p) for st in [local, *replies] if isinstance(st, dict) for t, p in st["problems"].items()]
        out = [self._tenant_status(t, [p for name, p in problems if name == t.name]) for t in tenants.by_name.values()]
        ok = all(t.status == "ok" for t in out) and all(s.reachable for s in shards) and reg.error is None
        return m.AdminStatus(status="ok" if ok else "degraded", ready=self._ready, tenants=out, shards=shards,
                             router_cache=m.CacheStatus(**local),
                             registry=m.RegistryStatus(path=str(reg.path) if reg.path else None,
                                                       tenants=len(tenants.by_name), reloads=reg.reloads,
                                                       loaded_at=reg.loaded_at, error=reg.error),
                             inflight=self._inflight)

    def _tenant_status(self, t: Tenant, shard_problems: list[dict]) -> m.TenantStatus:
        active = self.versions.active.get(t.name)
        newest, problem = self.versions.newest(t)
        versions = {x.version for x in (active, newest) if x is not None}
        problems = ([problem] if problem else []) + [f"shard {p['shard']}: {p['reason']}" for p in shard_problems
                                                     if p["version"] in versions]
        known = active or newest
        return m.TenantStatus(
            name=t.name, status="error" if problems else "ok", problems=problems,
            searched_in=None if known is None else self.batcher.shards(known).path,
            serving_version=active.version if active else None, current_version=newest.version if newest else None,
            num_shards=known.num_shards if known else None,
            rate_limit=t.rate_limit.model_dump() if t.rate_limit else None)

    def check_health(self) -> None:
        """Serve's periodic probe: restart a replica whose tenant watcher died (it would stop seeing
        key rotations and new versions) or whose metrics task did."""
        w = self._watcher
        if w is not None and w.done() and not w.cancelled() and w.exception() is not None:
            raise RuntimeError(f"tenant watcher failed: {w.exception()!r}")
        self.local.check_health()
