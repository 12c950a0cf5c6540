"""The FastAPI ingress: authenticate, limit, embed, fan out to the shards, merge once, (optionally) answer.

Ranking is the in-process engine's: each shard replica runs `search_shard_exact` (its own top k
final), the router merges once with the same `merge_hits` and formats with the same `format_results`.

What keeps it up while things change:
- the tenants file is re-read every `tenants_reload_s` (registry.py): keys rotate and tenants come
  and go without a restart;
- each tenant has an active index version; a new one (`qrag publish`) is loaded on every shard
  before the pointer moves, and every request carries the exact version it started with;
- one deadline (`request_timeout_s`) covers embedding, fan-out and the LLM; a dead shard replica is
  retried once; overload and per-tenant limits answer 503 / 429 with Retry-After at once.
Every user mistake is an `ApiError` rendered as `{"error", "message"}` with a 4xx/5xx status; only
bugs are 500s.

Size: over 400 lines because a Serve ingress is one class (routes, tenants, versions, deadlines); its
parts with logic of their own (registry, rate limits, shard cache, encoder, errors) are separate modules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from fastapi import FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from qrag_ray.errors import QragError, find_user_error
from qrag_ray.index.format import shard_of
from qrag_ray.serving import api_models as m
from qrag_ray.serving.deployments import ShardKey, VersionMoved
from qrag_ray.serving.errors import (ApiError, bad_request, deadline_exceeded, index_unavailable, llm_failed,
                                     llm_not_configured, overloaded, rate_limited, shard_unavailable)
from qrag_ray.serving.tenants import Tenant, Tenants

logger = logging.getLogger("ray.serve")

app = FastAPI(
    title="qrag-ray",
    version="1",
    description="Question-based retrieval over sharded FAISS indexes (Ray Serve). Send `Authorization: Bearer KEY` "
                "when the server has a tenants file; the admin status takes the admin key.",
)
bearer = Security(HTTPBearer(auto_error=False, description="the tenant's API key (`qrag tenants add` prints it once)"))


def _openapi() -> dict:
    """FastAPI's schema, minus the empty `example: {}` Serve's class-based view leaves on request
    bodies: an example the server itself rejects (no `query`) is not a truthful one."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes,
                           servers=app.servers or None)
        for ops in spec.get("paths", {}).values():
            for op in ops.values():
                for media in (op.get("requestBody") or {}).get("content", {}).values():
                    if media.get("example") == {}:
                        media.pop("example")
        app.openapi_schema = spec
    return app.openapi_schema


app.openapi = _openapi

_ROUTER: "Router | None" = None  # the replica's Router, for the module-level handlers below


def _set_router(router: "Router") -> None:
    # A module function, not `global` inside Router.__init__: Serve pickles the ingress class by value,
    # and a by-value method's `global` would land in a copy of this module's namespace.
    global _ROUTER
    _ROUTER = router


# ------------------------------------------------------------------------------ error rendering
def _count_error(request: Request, kind: str) -> None:
    if _ROUTER is not None:
        _ROUTER.metrics.errors.inc(tags={"route": _route_of(request), "tenant": _tenant_of(request), "kind": kind})


def _route_of(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def _tenant_of(request: Request) -> str:
    return getattr(request.state, "tenant", None) or "-"


def _error(request: Request, status: int, kind: str, message: str, headers: dict | None = None,
           detail: list | None = None) -> JSONResponse:
    _count_error(request, kind)
    body = {"error": kind, "message": message}
    if detail:
        body["detail"] = detail
    return JSONResponse(body, status_code=status, headers=headers)


@app.exception_handler(ApiError)
async def _api_error(request: Request, e: ApiError):
    return _error(request, e.status, e.kind, e.message, e.headers)


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, e: RequestValidationError):
    errs = e.errors()
    if any(err.get("type") == "json_invalid" for err in errs):
        return _error(request, 400, "malformed_json", "the request body is not valid JSON")
    parts, detail = [], []
    for err in errs:
        loc = [x for x in err.get("loc", ()) if x != "body"]
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{'.'.join(str(x) for x in loc) or 'body'}: {msg}")
        detail.append({"loc": loc or ["body"], "msg": msg, "type": str(err.get("type", "invalid"))})
    too_long = any(err.get("type") == "string_too_long" for err in errs)
    return _error(request, 422, "query_too_long" if too_long else "invalid_request", "; ".join(parts), detail=detail)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, e: StarletteHTTPException):
    kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
    msg = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
    return _error(request, e.status_code, kind, msg, headers=getattr(e, "headers", None))


@app.exception_handler(Exception)
async def _bug(request: Request, e: Exception):
    logger.exception("unhandled error in %s %s", request.method, request.url.path)
    return _error(request, 500, "internal", f"internal error ({type(e).__name__}); see the Router replica log")


class _Timing:
    """Request latency per route, tenant and status. A plain ASGI middleware: Starlette's
    `@app.middleware("http")` (BaseHTTPMiddleware) runs every request through extra tasks and
    streams, which cost more than the rest of this replica's request handling on a small index."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = [500]
        state = scope.setdefault("state", {})

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if _ROUTER is not None:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                _ROUTER.metrics.latency.observe((time.perf_counter() - t0) * 1000, tags={
                    "route": route, "tenant": state.get("tenant") or "-", "status": str(status[0])})


app.add_middleware(_Timing)


def _errors(*codes: int) -> dict:
    """The documented error responses of a route: the same body for all, with their headers."""
    out: dict = {}
    for c in codes:
        out[c] = {"model": m.ErrorResponse, "description": m.ERROR_DESCRIPTIONS[c]}
        if c in m.RETRY_AFTER_STATUSES:
            out[c]["headers"] = {"Retry-After": {"description": "seconds to wait before retrying",
                                                 "schema": {"type": "integer"}}}
        if c == 401:
            out[c]["headers"] = {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}
    return out


# ------------------------------------------------------------------------------ per-tenant state
@dataclass(frozen=True)
class TenantIndex:
    """One immutable index version as the router needs it: no vectors, no texts (those stay in the
    shard replicas)."""

    dir: str
    version: str
    manifest: object
    policy: object
    num_shards: int
    embedder: str
    local: bool  # small enough to search inside the Router (no shard hop)


class _Chunks:
    """The `.get(chunk_idx)` that `engine.format_results` expects, over the chunks the shards sent."""

    def __init__(self, d: dict[int, dict]):
        self.d = d

    def get(self, chunk_idx: int) -> dict:
        return self.d[chunk_idx]


@dataclass
class Retrieval:
    results: list[dict]
    index_version: str
    timings: dict


_DEAD_REPLICA: tuple[type, ...] | None = None


def _dead_replica_errors() -> tuple[type, ...]:
    global _DEAD_REPLICA
    if _DEAD_REPLICA is None:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        _DEAD_REPLICA = (ActorDiedError, ActorUnavailableError, RayActorError)
    return _DEAD_REPLICA


def _embed_then_search(encoder, st, text: str, shards: list[int], loaded: list, k: int, min_score: float | None,
                       lex: list[str] | None, bm25_alpha: float | None) -> tuple[list, float, float]:
    """Embed one query and search a small tenant's loaded shards, in the calling worker thread; returns
    (replies, embed ms, search ms)."""
    from qrag_ray.serving.deployments import search_loaded_all

    t0 = time.perf_counter()
    qv = encoder.encode_sync(st, [text])
    t1 = time.perf_counter()
    replies = search_loaded_all(shards, loaded, qv, k, min_score, lex, bm25_alpha)
    return replies, (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000


# ------------------------------------------------------------------------------ the deployment
@serve.ingress(app)
class Router:
    async def __init__(self, shards: list, synthesizer, args: dict):
        from qrag_ray.serving.config import AppArgs
        from qrag_ray.serving.deployments import ShardStore, _assigned_cpus
        from qrag_ray.serving.encoder import QueryEncoder
        from qrag_ray.serving.metrics import RouterMetrics
        from qrag_ray.serving.ratelimit import RateLimiter
        from qrag_ray.serving.registry import TenantRegistry

        self.shards = list(shards)
        self.synth = synthesizer
        self.args = AppArgs.model_validate(args)
        self.metrics = RouterMetrics()
        self.registry = (TenantRegistry.from_file(self.args.tenants) if self.args.tenants
                         else TenantRegistry(self.args.load_tenants()))
        self.limiter = RateLimiter()
        self._configure_limits()
        self.encoder = QueryEncoder(threads=_assigned_cpus())
        self.local = ShardStore(self.args.router_cache_bytes, self.args.faiss_threads or _assigned_cpus())
        self._versions: OrderedDict[tuple[str, str], TenantIndex] = OrderedDict()  # (dir, version) -> index
        self._active: dict[str, TenantIndex] = {}  # tenant -> the version its requests start on
        self._problems: dict[str, str] = {}  # tenant -> why its index (or its newest version) is not served
        self._retry_at: dict[tuple[str, str], float] = {}  # (tenant, version) that failed to warm -> next try
        self._inflight = 0
        self._ready = False  # the first watcher pass (warm-up of the first tenants) has finished
        self._watcher: asyncio.Task | None = None
        _set_router(self)
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
        first = True
        while True:
            try:
                if self.registry.refresh():
                    self._configure_limits()
                    for gone in set(self._active) - set(self.registry.tenants.by_name):
                        await self._retire_later(self._active.pop(gone), gone, 0.0)
                if first:  # start-up: load the first tenants everywhere, so a broken one shows before traffic
                    first = False
                    for t in list(self.registry.tenants.by_name.values())[: self.args.warm_tenants]:
                        await self._check_version(t, warm=True)
                    self._ready = True
                for name in list(self._active):
                    t = self.registry.tenants.by_name.get(name)
                    if t is not None:
                        await self._check_version(t, warm=True)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad tenant
                logger.exception("tenant watcher pass failed")
            await asyncio.sleep(self.args.tenants_reload_s)

    def _index_of(self, tenant: Tenant) -> TenantIndex:
        """The version `tenant.index` points at now (reads CURRENT / manifest.json; cached per version)."""
        from qrag_ray.index.versions import resolve_index
        from qrag_ray.search.engine import check_hybrid
        from qrag_ray.search.merge import FusionPolicy

        r = resolve_index(tenant.index)
        key = (str(r.dir), r.version)
        ti = self._versions.get(key)
        if ti is None:
            man = r.manifest  # the manifest the version was read from: no second read to disagree with
            if man.num_shards > len(self.shards):
                raise QragError(f"it has {man.num_shards} shards but the app runs {len(self.shards)} "
                                "ShardSearcher deployments (raise args.shards)")
            policy = FusionPolicy.from_manifest(man)
            check_hybrid(policy, man)
            nbytes = sum(man.file(rel).stat().st_size for rel in man.data["files"])
            ti = TenantIndex(str(r.dir), r.version, man, policy, man.num_shards, man.embedder_model,
                             local=nbytes <= self.args.local_search_max_bytes)
            self._versions[key] = ti
            while len(self._versions) > 4096:
                self._versions.popitem(last=False)
        else:
            self._versions.move_to_end(key)
        return ti

    async def _check_version(self, tenant: Tenant, warm: bool) -> TenantIndex | None:
        """Resolve the tenant's index; switch to a new version only once every shard has loaded it."""
        try:
            ti = self._index_of(tenant)
        except QragError as e:
            self._problems[tenant.name] = str(e)
            return self._active.get(tenant.name)
        old = self._active.get(tenant.name)
        if old is not None and old.version == ti.version and old.dir == ti.dir:
            return old
        if warm:
            if time.monotonic() < self._retry_at.get((tenant.name, ti.version), 0.0):
                return old
            try:
                key = ShardKey(tenant.name, ti.dir, ti.version)
                await asyncio.gather(self.encoder.model(ti.embedder),
                                     *[self._call(ti, i, "prepare", key) for i in range(ti.num_shards)])
            except (ApiError, QragError) as e:
                reason = e.message if isinstance(e, ApiError) else str(e)
                self._problems[tenant.name] = (f"version {ti.version} failed to load, still serving "
                                               f"{old.version}: {reason}" if old else reason)
                self._retry_at[(tenant.name, ti.version)] = time.monotonic() + 30.0
                return old
        self._active[tenant.name] = ti
        self._problems.pop(tenant.name, None)
        if old is not None:
            logger.info("tenant %r now serves index version %s (was %s)", tenant.name, ti.version, old.version)
            await self._retire_later(old, tenant.name, self.args.request_timeout_s + 1.0)
        return ti

    async def _retire_later(self, ti: TenantIndex, tenant: str, delay: float) -> None:
        async def retire():
            await asyncio.sleep(delay)  # requests started on it finish first
            if any(a.dir == ti.dir and a.version == ti.version for a in self._active.values()):
                return
            key = ShardKey(tenant, ti.dir, ti.version)
            await asyncio.gather(*[self._call(ti, i, "retire", key) for i in range(ti.num_shards)],
                                 return_exceptions=True)

        asyncio.get_running_loop().create_task(retire())

    async def _tenant_index(self, tenant: Tenant) -> TenantIndex:
        ti = self._active.get(tenant.name)
        if ti is None:  # first use: no traffic to protect yet, so no warm-up either
            ti = await self._check_version(tenant, warm=False)
        if ti is None:
            raise index_unavailable(tenant.name, self._problems.get(tenant.name, "it could not be read"))
        return ti

    # ---- helpers -------------------------------------------------------------------------------
    def _auth(self, request: Request, index: str | None = None) -> Tenant:
        self._ensure_watcher()
        tenants: Tenants = self.registry.tenants
        tenant = tenants.authenticate(request.headers.get("authorization"))
        request.state.tenant = tenant.name
        tenant = tenants.resolve(tenant, index)
        wait = self.limiter.retry_after(tenant.name)
        if wait:
            raise rate_limited(tenant.name, wait)
        return tenant

    async def _call(self, ti: TenantIndex, i: int, method: str, *args):
        """One shard call: in this process for a small tenant, else to ShardSearcher i, where a replica
        that died under the call is retried once (Serve routes the retry to a live replica). Errors a
        user can act on come back as ApiError/QragError."""
        from ray.serve.exceptions import BackPressureError

        if ti.local:
            return await getattr(self.local, method)(i, *args)
        for attempt in (1, 2):
            try:
                return await getattr(self.shards[i], method).remote(*args)
            except BackPressureError:
                raise overloaded(f"shard {i} is at its queue limit") from None
            except Exception as e:
                ue = find_user_error(e)  # e.g. a shard that cannot load this tenant's index
                if ue is not None:
                    raise ue from None
                if not isinstance(e, _dead_replica_errors()):
                    raise
                if attempt == 2:
                    raise shard_unavailable(i, type(e).__name__) from None
                logger.warning("shard %d replica failed (%s); retrying once", i, type(e).__name__)

    async def _deadline(self, coro, stage: dict):
        """Run a request under the app's deadline; a miss is a 504 that names the stage it was in."""
        if self._inflight >= self.args.max_inflight:
            coro.close()
            raise overloaded(f"{self._inflight} requests in flight on this replica")
        self._inflight += 1
        try:
            return await asyncio.wait_for(coro, timeout=self.args.request_timeout_s)
        except asyncio.TimeoutError:
            raise deadline_exceeded(self.args.request_timeout_s, stage.get("stage", "starting")) from None
        finally:
            self._inflight -= 1

    async def _llm(self, messages: list[dict], max_tokens: int, what: str) -> str:
        if self.synth is None:
            raise llm_not_configured(what)
        try:
            return await self.synth.complete.remote(messages, max_tokens)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - an LLM outage is a 502 for the client, logged here
            logger.warning("LLM call failed: %s", e)
            ue = find_user_error(e)
            raise llm_failed(str(ue) if ue else type(e).__name__) from None

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0)  # no wait: under load the queue fills during an encode
    async def _embed_batch(self, items: list[tuple[str, str]]) -> list:
        """Concurrent queries' texts embedded in one call per model (items: (text, model)); each gets
        (its vector, the batch size) so the response's timings show whether batching happened."""
        vecs = await self.encoder.encode([t for t, _ in items], [mdl for _, mdl in items])
        return [(v, len(items)) for v in vecs]

    async def _retrieve(self, tenant: Tenant, text: str, k: int, min_score: float | None, stage: dict,
                        query: str | None = None, bm25_alpha: float | None = None) -> Retrieval:
        """Embed `text` (the query or its HyDE passage), fan out, merge. Hybrid search (the index's
        setting, or the request's `bm25_alpha`) also matches the user's own words, `query`, with BM25."""
        from qrag_ray.search.engine import format_results
        from qrag_ray.search.merge import merge_hits

        for attempt in (1, 2):
            ti = await self._tenant_index(tenant)
            policy = ti.policy
            if bm25_alpha is not None:
                if not ti.manifest.has_bm25:
                    raise bad_request("no_bm25_index", f"index '{tenant.name}' has no BM25 channel, so bm25_alpha "
                                                       "cannot apply: re-index it with bm25.enabled")
                policy = policy.with_bm25_alpha(bm25_alpha)
            key = ShardKey(tenant.name, ti.dir, ti.version)
            lex = [query or text] if policy.bm25_alpha is not None else None
            shards = list(range(ti.num_shards))
            # A lone request on a small tenant has nothing to batch with: its embedding and search run in
            # ONE worker-thread call (the batch queue and two thread hops cost ~0.8 ms of a ~10 ms
            # request at concurrency 1, docs/BENCHMARKS.md).
            try:
                if ti.local and self._inflight <= 1:
                    stage["stage"] = "embedding the query"
                    st = await self.encoder.model(ti.embedder)  # loaded once; a no-op after the first request
                    stage["stage"] = "embedding the query and searching"
                    loaded = await self.local.get_all(shards, key)
                    batch = 1
                    replies, embed_ms, search_ms = await asyncio.to_thread(
                        _embed_then_search, self.encoder, st, text, shards, loaded, k, min_score, lex, bm25_alpha)
                    self.local.observe(key, replies)
                    path = "router, one call"
                else:
                    t0 = time.perf_counter()
                    stage["stage"] = "embedding the query"
                    vec, batch = await self._embed_batch((text, ti.embedder))
                    qv = vec[None, :]
                    t1 = time.perf_counter()
                    stage["stage"] = "searching the shards"
                    path = "router" if ti.local else "shards"
                    if ti.local:  # a small tenant: all its shards here, in one worker thread
                        replies = await self.local.search_all(shards, key, qv, k, min_score, lex, bm25_alpha)
                    else:
                        replies = await asyncio.gather(*[self._call(ti, i, "search", key, qv, k, min_score, lex,
                                                                    bm25_alpha) for i in shards])
                    embed_ms, search_ms = (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000
                break
            except VersionMoved:  # a plain index directory was republished under this request
                self._active.pop(tenant.name, None)
                if attempt == 2:
                    raise index_unavailable(tenant.name, "its index changed twice during one request") from None
            except QragError as e:
                raise index_unavailable(tenant.name, str(e)) from None
        tm = time.perf_counter()
        hits = [r.hits[0] for r in replies]
        res, _ = merge_hits(hits, 0, k, min_score, policy)
        merge_s = time.perf_counter() - tm
        matched = {(r.shard, row): v for r in replies for row, v in r.matched.items()}
        chunks = {ci: meta for r in replies for ci, meta in r.chunks.items()}
        await self._fill_missing(ti, key, res, matched, chunks)
        tf = time.perf_counter()
        results = format_results(res, _Chunks(chunks), lambda s, row: matched[(s, row)])
        before = sum(int((h.rows[0] >= 0).sum()) for h in hits)
        self.metrics.before.observe(before, tags={"tenant": tenant.name})
        self.metrics.after.observe(len(results), tags={"tenant": tenant.name})
        timings = {"path": path, "embed_ms": embed_ms, "embed_batch": batch, "search_ms": search_ms,
                   "merge_ms": merge_s * 1000,
                   "format_ms": (time.perf_counter() - tf) * 1000, "rounds": max(r.rounds for r in replies),
                   "candidates": before, "shard_search_ms": [round(r.search_ms, 3) for r in replies]}
        return Retrieval(results, ti.version, timings)

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
        if not want:
            return
        calls = [self._call(ti, s, "lookup", key, sorted(rows), sorted(cis)) for s, (rows, cis) in want.items()]
        got = [await c for c in calls] if ti.local else await asyncio.gather(*calls)  # local: dict lookups, no I/O
        for s, (mt, ch) in zip(want, got):
            matched.update({(s, row): v for row, v in mt.items()})
            chunks.update(ch)

    async def _query_text(self, req: m._Request, stage: dict) -> tuple[str, str | None]:
        """The text to embed: the query, or in HyDE mode an LLM-written passage answering it."""
        if req.mode != "hyde":
            return req.query, None
        from qrag_ray.generation.parsing import hyde_passage
        from qrag_ray.generation.prompts import get_prompt

        stage["stage"] = "writing the HyDE passage (LLM)"
        raw = await self._llm(get_prompt("hyde").render(req.query), self.args.hyde_max_tokens, "mode=hyde")
        passage = hyde_passage(raw, req.query)
        return passage, passage

    # ---- routes --------------------------------------------------------------------------------
    @app.post("/v1/search", response_model=m.SearchResponse,
              responses=_errors(400, 401, 403, 404, 422, 429, 502, 503, 504), dependencies=[bearer])
    async def search(self, req: m.SearchRequest, request: Request) -> m.SearchResponse:
        """Top k distinct chunks for a query (exactly k when the index has them)."""
        t0 = time.perf_counter()
        tenant = self._auth(request, req.index)
        stage: dict = {}

        async def run():
            text, hypothetical = await self._query_text(req, stage)
            r = await self._retrieve(tenant, text, req.k, req.min_score, stage, req.query, req.bm25_alpha)
            return m.SearchResponse(results=r.results, index=tenant.name, index_version=r.index_version,
                                    mode=req.mode, took_ms=(time.perf_counter() - t0) * 1000,
                                    hypothetical=hypothetical, timings=r.timings)

        return await self._deadline(run(), stage)

    @app.post("/v1/answer", response_model=m.AnswerResponse,
              responses=_errors(400, 401, 403, 404, 422, 429, 502, 503, 504), dependencies=[bearer])
    async def answer(self, req: m.AnswerRequest, request: Request) -> m.AnswerResponse:
        """An answer synthesized from the retrieved chunks with [n] citations, or "I don't know"."""
        from qrag_ray.generation.parsing import DONT_KNOW, extract_citations, parse_answer
        from qrag_ray.generation.prompts import get_prompt

        t0 = time.perf_counter()
        tenant = self._auth(request, req.index)
        if self.synth is None:
            raise llm_not_configured("/v1/answer")
        stage: dict = {}

        async def run():
            text, _ = await self._query_text(req, stage)
            r = await self._retrieve(tenant, text, req.k, req.min_score, stage, req.query, req.bm25_alpha)
            # Gate on raw similarity, not the fused score: rrf/sum/hybrid scores live on other scales.
            # Results are best first, so the supported ones are a prefix and [n] numbers both lists alike.
            support = [x for x in r.results if x.get("cosine", x["score"]) >= self.args.answer_min_cosine]
            answer, citations = DONT_KNOW, []
            if support:
                stage["stage"] = "writing the answer (LLM)"
                msgs = get_prompt("answer").render(req.query, context=[x["text"] for x in support])
                answer = parse_answer(await self._llm(msgs, req.max_tokens, "/v1/answer"))
                if answer != DONT_KNOW:
                    citations = [m.Citation(n=n, chunk_id=support[n - 1]["chunk_id"], doc_id=support[n - 1]["doc_id"])
                                 for n in extract_citations(answer) if 1 <= n <= len(support)]
            return m.AnswerResponse(answer=answer, citations=citations, results=r.results, index=tenant.name,
                                    index_version=r.index_version, mode=req.mode,
                                    took_ms=(time.perf_counter() - t0) * 1000)

        return await self._deadline(run(), stage)

    @app.get("/v1/indexes", response_model=m.IndexesResponse, responses=_errors(401, 429), dependencies=[bearer])
    async def indexes(self, request: Request) -> m.IndexesResponse:
        """The indexes this key may query (its tenant's)."""
        tenant = self._auth(request)
        try:
            ti = await self._tenant_index(tenant)
        except ApiError as e:
            return m.IndexesResponse(indexes=[m.IndexInfo(name=tenant.name, index_version=None, representation=None,
                                                          num_shards=None, embedder=None, available=False,
                                                          error=e.message)])
        d = ti.manifest.data
        return m.IndexesResponse(indexes=[m.IndexInfo(
            name=tenant.name, index_version=ti.version, representation=d.get("representation"),
            num_shards=ti.num_shards, embedder=ti.embedder, counts=d.get("counts", {}), available=True)])

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

    @app.get("/v1/admin/status", response_model=m.AdminStatus, responses=_errors(401, 403), dependencies=[bearer])
    async def admin_status(self, request: Request) -> m.AdminStatus:
        """Every tenant's served version and problems, every shard deployment's cache (admin key only)."""
        self._ensure_watcher()
        tenants = self.registry.tenants
        tenants.is_admin(request.headers.get("authorization"))
        shard_status = await asyncio.gather(*[s.status.remote() for s in self.shards], return_exceptions=True)
        shard_problems: dict[str, list] = {}
        for tenant, p in self.local.status()["problems"].items():
            shard_problems.setdefault(tenant, []).append(p)
        shards = []
        for i, st in enumerate(shard_status):
            if isinstance(st, BaseException):
                shards.append(m.ShardStatus(shard=i, reachable=False, error=type(st).__name__))
                continue
            shards.append(m.ShardStatus(shard=i, reachable=True, loaded=st["loaded"], bytes=st["bytes"],
                                        max_bytes=st["max_bytes"]))
            for tenant, p in st["problems"].items():
                shard_problems.setdefault(tenant, []).append(p)
        out = []
        for t in tenants.by_name.values():
            active = self._active.get(t.name)
            try:
                newest = self._index_of(t)
                problem = self._problems.get(t.name)
            except QragError as e:
                newest, problem = None, str(e)
            versions = {x.version for x in (active, newest) if x is not None}
            sp = [p for p in shard_problems.get(t.name, []) if p["version"] in versions]
            problems = ([problem] if problem else []) + [f"shard {p['shard']}: {p['reason']}" for p in sp]
            known = active or newest
            out.append(m.TenantStatus(
                name=t.name, status="error" if problems else "ok", problems=problems,
                searched_in=None if known is None else ("router" if known.local else "shards"),
                serving_version=active.version if active else None,
                current_version=newest.version if newest else None,
                num_shards=(active or newest).num_shards if (active or newest) else None,
                rate_limit=t.rate_limit.model_dump() if t.rate_limit else None))
        reg = self.registry
        ok = all(t.status == "ok" for t in out) and all(s.reachable for s in shards) and reg.error is None
        loc = self.local.status()
        return m.AdminStatus(status="ok" if ok else "degraded", ready=self._ready, tenants=out, shards=shards,
                             router_cache=m.CacheStatus(loaded=loc["loaded"], bytes=loc["bytes"],
                                                        max_bytes=loc["max_bytes"]),
                             registry=m.RegistryStatus(path=str(reg.path) if reg.path else None,
                                                       tenants=len(tenants.by_name), reloads=reg.reloads,
                                                       loaded_at=reg.loaded_at, error=reg.error),
                             inflight=self._inflight)

    def check_health(self) -> None:
        """Serve's periodic probe: restart a replica whose tenant watcher died (it would stop seeing
        key rotations and new versions)."""
        w = self._watcher
        if w is not None and w.done() and not w.cancelled() and w.exception() is not None:
            raise RuntimeError(f"tenant watcher failed: {w.exception()!r}")
        if (e := self.local.refresher_failed()) is not None:
            raise RuntimeError(f"metrics task failed: {e!r}")
