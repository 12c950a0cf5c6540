"""The FastAPI ingress: authenticate, embed, fan out to the shards, merge, dedup, (optionally) answer.

Ranking is the in-process engine's: the same `merge_hits` over the same per-shard `ShardHits`, the
same widening (x4 per round from `initial_multiplier`) while a wider search could change the page, and
the same `format_results`. Every user mistake is an `ApiError` rendered as `{"error", "message"}` with a
4xx; only bugs are 500s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from qrag_ray.errors import QragError
from qrag_ray.serving import api_models as m
from qrag_ray.serving.errors import ApiError, bad_request, index_unavailable, llm_failed, llm_not_configured
from qrag_ray.serving.tenants import Tenant, Tenants

logger = logging.getLogger("ray.serve")

app = FastAPI(
    title="qrag-ray",
    version="1",
    description="Question-based retrieval over sharded FAISS indexes (Ray Serve). Send `Authorization: Bearer KEY` "
                "when the server has a tenants file.",
)

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
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
        detail.append({"loc": loc, "msg": msg, "type": err.get("type")})
    too_long = any(err.get("type") == "string_too_long" for err in errs)
    return _error(request, 413 if too_long else 422, "query_too_long" if too_long else "invalid_request",
                  "; ".join(parts), detail=detail)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, e: StarletteHTTPException):
    kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
    msg = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
    return _error(request, e.status_code, kind, msg)


@app.exception_handler(Exception)
async def _bug(request: Request, e: Exception):
    logger.exception("unhandled error in %s %s", request.method, request.url.path)
    return _error(request, 500, "internal", f"internal error ({type(e).__name__}); see the Router replica log")


@app.middleware("http")
async def _timing(request: Request, call_next):
    t0 = time.perf_counter()
    status = 500
    try:
        response = await call_next(request)
        status = response.status_code
        return response
    finally:
        if _ROUTER is not None:
            _ROUTER.metrics.latency.observe((time.perf_counter() - t0) * 1000, tags={
                "route": _route_of(request), "tenant": _tenant_of(request), "status": str(status)})


# ------------------------------------------------------------------------------ per-tenant state
@dataclass
class TenantIndex:
    """What the router needs of an index: no vectors, no texts (those stay in the shard replicas)."""

    manifest: object
    policy: object
    multiplier: int
    num_shards: int
    embedder: str


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


# ------------------------------------------------------------------------------ the deployment
@serve.ingress(app)
class Router:
    def __init__(self, embedder, shards: list, synthesizer, tenants: list[dict], open_tenant: bool, args: dict):
        from qrag_ray.serving.config import AppArgs
        from qrag_ray.serving.metrics import RouterMetrics

        self.embedder = embedder
        self.shards = list(shards)
        self.synth = synthesizer
        self.tenants = Tenants({t["name"]: Tenant.model_validate(t) for t in tenants}, open=open_tenant)
        self.args = AppArgs.model_validate(args)
        self.metrics = RouterMetrics()
        self._indexes: OrderedDict[str, TenantIndex] = OrderedDict()
        _set_router(self)

    # ---- helpers -------------------------------------------------------------------------------
    def _auth(self, request: Request, index: str | None = None) -> Tenant:
        tenant = self.tenants.authenticate(request.headers.get("authorization"))
        request.state.tenant = tenant.name
        return self.tenants.resolve(tenant, index)

    def _tenant_index(self, tenant: Tenant) -> TenantIndex:
        ti = self._indexes.get(tenant.name)
        if ti is not None:
            self._indexes.move_to_end(tenant.name)
            return ti
        from qrag_ray.index.format import load_manifest
        from qrag_ray.search.engine import check_hybrid, initial_multiplier
        from qrag_ray.search.merge import FusionPolicy

        try:
            man = load_manifest(tenant.index)
        except QragError as e:
            raise index_unavailable(tenant.name, str(e)) from None
        if man.num_shards > len(self.shards):
            raise index_unavailable(tenant.name, f"it has {man.num_shards} shards but the app runs "
                                                 f"{len(self.shards)} ShardSearcher deployments (raise args.shards)")
        policy = FusionPolicy.from_manifest(man)
        try:
            check_hybrid(policy, man)
        except QragError as e:
            raise index_unavailable(tenant.name, str(e)) from None
        ti = TenantIndex(man, policy, initial_multiplier(man), man.num_shards, man.embedder_model)
        self._indexes[tenant.name] = ti
        while len(self._indexes) > 256:
            self._indexes.popitem(last=False)
        return ti

    async def _llm(self, messages: list[dict], max_tokens: int, what: str) -> str:
        if self.synth is None:
            raise llm_not_configured(what)
        try:
            return await self.synth.complete.remote(messages, max_tokens)
        except Exception as e:  # noqa: BLE001 - an LLM outage is a 502 for the client, logged here
            logger.warning("LLM call failed: %s", e)
            from qrag_ray.cli import find_user_error

            ue = find_user_error(e)
            raise llm_failed(str(ue) if ue else type(e).__name__) from None

    async def _retrieve(self, tenant: Tenant, text: str, k: int, min_score: float | None,
                        query: str | None = None, bm25_alpha: float | None = None) -> Retrieval:
        """Embed `text` (the query or its HyDE passage), fan out, merge. Hybrid search (the index's
        setting, or the request's `bm25_alpha`) also matches the user's own words, `query`, with BM25."""
        from qrag_ray.search.engine import format_results
        from qrag_ray.search.merge import merge_hits

        ti = self._tenant_index(tenant)
        policy = ti.policy
        if bm25_alpha is not None:
            if not ti.manifest.has_bm25:
                raise bad_request("no_bm25_index", f"index '{tenant.name}' has no BM25 channel, so bm25_alpha "
                                                   "cannot apply: re-index it with bm25.enabled")
            policy = policy.with_bm25_alpha(bm25_alpha)
        t0 = time.perf_counter()
        emb = await self.embedder.embed.remote([text], ti.embedder)
        qv = emb.vectors
        t1 = time.perf_counter()
        handles = [self.shards[i].options(multiplexed_model_id=tenant.name) for i in range(ti.num_shards)]
        mult, rounds, search_s, merge_s = ti.multiplier, 0, 0.0, 0.0
        try:
            while True:
                rounds += 1
                ts = time.perf_counter()
                lex = [query or text] if policy.bm25_alpha is not None else None
                replies = await asyncio.gather(*[h.search.remote(qv, k * mult, k, min_score, lex) for h in handles])
                tm = time.perf_counter()
                hits = [r.hits for r in replies]
                total = sum(r.ntotal for r in replies)
                res, more = merge_hits(hits, 0, k, min_score, policy)
                search_s += tm - ts
                merge_s += time.perf_counter() - tm
                if more and k * mult < total:
                    mult *= 4
                    continue
                break
        except ApiError:
            raise
        except Exception as e:  # noqa: BLE001 - a shard that cannot load this tenant's index
            from qrag_ray.cli import find_user_error

            ue = find_user_error(e)
            if ue is None:
                raise
            raise index_unavailable(tenant.name, str(ue)) from None
        tf = time.perf_counter()
        matched = {(r.shard, row): v for r in replies for row, v in r.matched.items()}
        chunks = {ci: meta for r in replies for ci, meta in r.chunks.items()}
        await self._fill_missing(handles, res, matched, chunks)
        results = format_results(res, _Chunks(chunks), lambda s, row: matched[(s, row)])
        format_s = time.perf_counter() - tf
        before = sum(int((h.rows[0] >= 0).sum()) for h in hits)
        self.metrics.before.observe(before, tags={"tenant": tenant.name})
        self.metrics.after.observe(len(results), tags={"tenant": tenant.name})
        versions = {r.index_version for r in replies}
        timings = {"embed_ms": (t1 - t0) * 1000, "search_ms": search_s * 1000, "merge_ms": merge_s * 1000,
                   "format_ms": format_s * 1000, "rounds": rounds, "candidates": before,
                   "shard_search_ms": [round(r.search_ms, 3) for r in replies]}
        return Retrieval(results, ",".join(sorted(versions)), timings)

    @staticmethod
    async def _fill_missing(handles, res, matched: dict, chunks: dict) -> None:
        """Rows / chunks on the page that a shard did not send up front (only if the fusion policy
        ranks a chunk differently inside its shard than across shards)."""
        want: dict[int, tuple[set, set]] = {}
        for r in res:
            for shard, row, _ in r.matches:
                if (shard, row) not in matched:
                    want.setdefault(shard, (set(), set()))[0].add(row)
            if r.chunk_idx not in chunks:  # a chunk lives in shard chunk_idx % shards (pipeline)
                want.setdefault(r.chunk_idx % len(handles), (set(), set()))[1].add(r.chunk_idx)
        if not want:
            return
        got = await asyncio.gather(*[handles[s].lookup.remote(sorted(rows), sorted(cis)) for s, (rows, cis) in want.items()])
        for s, (mt, ch) in zip(want, got):
            matched.update({(s, row): v for row, v in mt.items()})
            chunks.update(ch)

    async def _query_text(self, req: m._Request) -> tuple[str, str | None]:
        """The text to embed: the query, or in HyDE mode an LLM-written passage answering it."""
        if req.mode != "hyde":
            return req.query, None
        from qrag_ray.generation.parsing import parse_output
        from qrag_ray.generation.prompts import get_prompt

        raw = await self._llm(get_prompt("hyde").render(req.query), self.args.hyde_max_tokens, "mode=hyde")
        texts = parse_output(raw, "text")
        passage = texts[0] if texts else req.query
        return passage, passage

    # ---- routes --------------------------------------------------------------------------------
    @app.post("/v1/search", response_model=m.SearchResponse,
              responses={400: {"model": m.ErrorResponse}, 401: {"model": m.ErrorResponse},
                         403: {"model": m.ErrorResponse}, 404: {"model": m.ErrorResponse},
                         413: {"model": m.ErrorResponse}, 422: {"model": m.ErrorResponse}})
    async def search(self, req: m.SearchRequest, request: Request) -> m.SearchResponse:
        """Top k distinct chunks for a query (exactly k when the index has them)."""
        t0 = time.perf_counter()
        tenant = self._auth(request, req.index)
        text, hypothetical = await self._query_text(req)
        r = await self._retrieve(tenant, text, req.k, req.min_score, req.query, req.bm25_alpha)
        return m.SearchResponse(results=r.results, index=tenant.name, index_version=r.index_version, mode=req.mode,
                                took_ms=(time.perf_counter() - t0) * 1000, hypothetical=hypothetical,
                                timings=r.timings)

    @app.post("/v1/answer", response_model=m.AnswerResponse,
              responses={401: {"model": m.ErrorResponse}, 503: {"model": m.ErrorResponse}})
    async def answer(self, req: m.AnswerRequest, request: Request) -> m.AnswerResponse:
        """An answer synthesized from the retrieved chunks with [n] citations, or "I don't know"."""
        from qrag_ray.generation.parsing import DONT_KNOW, extract_citations, parse_answer
        from qrag_ray.generation.prompts import get_prompt

        t0 = time.perf_counter()
        tenant = self._auth(request, req.index)
        if self.synth is None:
            raise llm_not_configured("/v1/answer")
        text, _ = await self._query_text(req)
        r = await self._retrieve(tenant, text, req.k, req.min_score, req.query, req.bm25_alpha)
        # results are best first, so the supported ones are a prefix and [n] numbers both lists alike
        support = [x for x in r.results if x["score"] >= self.args.answer_min_score]
        answer, citations = DONT_KNOW, []
        if support:
            msgs = get_prompt("answer").render(req.query, context=[x["text"] for x in support])
            answer = parse_answer(await self._llm(msgs, req.max_tokens, "/v1/answer"))
            if answer != DONT_KNOW:
                citations = [m.Citation(n=n, chunk_id=support[n - 1]["chunk_id"], doc_id=support[n - 1]["doc_id"])
                             for n in extract_citations(answer) if 1 <= n <= len(support)]
        return m.AnswerResponse(answer=answer, citations=citations, results=r.results, index=tenant.name,
                                index_version=r.index_version, mode=req.mode,
                                took_ms=(time.perf_counter() - t0) * 1000)

    @app.get("/v1/indexes", response_model=m.IndexesResponse, responses={401: {"model": m.ErrorResponse}})
    async def indexes(self, request: Request) -> m.IndexesResponse:
        """The indexes this key may query (its tenant's)."""
        tenant = self._auth(request)
        try:
            ti = self._tenant_index(tenant)
        except ApiError as e:
            return m.IndexesResponse(indexes=[m.IndexInfo(name=tenant.name, index_version=None, representation=None,
                                                          num_shards=None, embedder=None, available=False,
                                                          error=e.message)])
        d = ti.manifest.data
        return m.IndexesResponse(indexes=[m.IndexInfo(
            name=tenant.name, index_version=ti.manifest.index_version, representation=d.get("representation"),
            num_shards=ti.num_shards, embedder=ti.embedder, counts=d.get("counts", {}), available=True)])

    @app.get("/healthz", response_model=m.HealthResponse, responses={503: {"model": m.HealthResponse}})
    async def healthz(self):
        """200 when every tenant's index and every shard replica loaded; 503 with the reasons otherwise."""
        problems: list[dict] = []
        for t in self.tenants.by_name.values():
            try:
                self._tenant_index(t)
            except ApiError as e:
                problems.append({"tenant": t.name, "reason": e.message})
        statuses = await asyncio.gather(*[s.status.remote() for s in self.shards], return_exceptions=True)
        for i, st in enumerate(statuses):
            if isinstance(st, BaseException):
                problems.append({"shard": i, "reason": f"shard replica unreachable: {type(st).__name__}"})
                continue
            for tenant, reason in st["problems"].items():
                problems.append({"tenant": tenant, "shard": st["shard"], "reason": reason})
        body = m.HealthResponse(status="unhealthy" if problems else "ok", problems=problems)
        return JSONResponse(body.model_dump(), status_code=503 if problems else 200)
