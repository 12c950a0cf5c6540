"""The FastAPI app the Router serves (routes: router.py): error rendering, the request-latency
middleware, the OpenAPI document. The app's metrics live on `app.state` of the app that serves the
request, never in a module global: Serve pickles the ingress class by value, so a module global would
not be the one the handlers read."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from qrag_ray.serving import api_models as m
from qrag_ray.serving.api_errors import ApiError

logger = logging.getLogger("ray.serve")

app = FastAPI(title="qrag-ray", version="1", description="Question-based retrieval over sharded FAISS indexes (Ray "
              "Serve). Send `Authorization: Bearer KEY` when the server has a tenants file; the admin status takes "
              "the admin key.")
bearer = Security(HTTPBearer(auto_error=False, description="the tenant's API key (`qrag tenants add` prints it once)"))


def metrics_of(asgi_app):
    """The app's metrics in this process (one set per replica: app_metrics.process_metrics)."""
    if getattr(asgi_app.state, "metrics", None) is None:
        from qrag_ray.serving.app_metrics import process_metrics

        asgi_app.state.metrics = process_metrics()
    return asgi_app.state.metrics


def window_of(asgi_app):
    """The RequestWindow of this app in this process: the console's live per-tenant request figures."""
    if getattr(asgi_app.state, "request_window", None) is None:
        from qrag_ray.serving.request_window import RequestWindow

        asgi_app.state.request_window = RequestWindow()
    return asgi_app.state.request_window


def in_request_window(route: str) -> bool:
    """A tenant's API route (search, answer, fetch, indexes), not the console's or the admin's own reads."""
    return route.startswith("/v1/") and not route.startswith(("/v1/console/", "/v1/admin/"))


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
_HEADERS = {401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
            429: _RETRY_AFTER, 503: _RETRY_AFTER}


def error_responses(*codes: int) -> dict:
    """The documented error responses of a route: the same body for all, with their headers."""
    return {c: {"model": m.ErrorResponse, "description": m.ERROR_DESCRIPTIONS[c]}
            | ({"headers": _HEADERS[c]} if c in _HEADERS else {}) for c in codes}


def _openapi() -> dict:
    """FastAPI's schema, minus the empty `example: {}` Serve's class-based view leaves on request
    bodies: an example the server itself rejects (no `query`) is not a truthful one."""
    if app.openapi_schema is None:
        for ops in FastAPI.openapi(app).get("paths", {}).values():  # FastAPI's own sets app.openapi_schema
            for operation in ops.values():
                for media in (operation.get("requestBody") or {}).get("content", {}).values():
                    if media.get("example") == {}:
                        media.pop("example")
    return app.openapi_schema


app.openapi = _openapi


# ------------------------------------------------------------------------------ error rendering
def _route_of(scope) -> str:
    return getattr(scope.get("route"), "path", None) or "unmatched"


def _error(request: Request, status: int, kind: str, message: str, headers: dict | None = None,
           detail: list | None = None) -> JSONResponse:
    tenant = getattr(request.state, "tenant", None) or "-"
    metrics_of(request.app).errors.inc(tags={"route": _route_of(request.scope), "tenant": tenant, "kind": kind})
    body = {"error": kind, "message": message}
    if detail:
        body["detail"] = detail
    return JSONResponse(body, status_code=status, headers=headers)


@app.exception_handler(ApiError)
async def _api_error(request: Request, error: ApiError):
    return _error(request, error.status, error.kind, error.message, error.headers, error.detail)


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, error: RequestValidationError):
    errs = error.errors()
    if any(err.get("type") == "json_invalid" for err in errs):
        return _error(request, 400, "malformed_json", "the request body is not valid JSON")
    detail = [{"loc": [x for x in err.get("loc", ()) if x != "body"] or ["body"],
               "msg": str(err.get("msg", "invalid")).removeprefix("Value error, "),
               "type": str(err.get("type", "invalid"))} for err in errs]
    message = "; ".join(f"{'.'.join(str(x) for x in d['loc'])}: {d['msg']}" for d in detail)
    too_long = any(d["type"] == "string_too_long" and d["loc"] == ["query"] for d in detail)
    # a filter that is not the grammar (or doc_ids that are not a list of ids) is the filter's error kind,
    # as the checks against the index's fields are
    in_filter = all(d["loc"][0] in ("filter", "doc_ids") for d in detail)
    # a write's record that is not a document (POST /v1/documents): the record's position and field are in
    # the message and `detail`, and nothing of the batch was logged
    in_record = all(len(d["loc"]) > 1 and d["loc"][0] == "documents" and isinstance(d["loc"][1], int) for d in detail)
    kind = ("query_too_long" if too_long else "invalid_filter" if in_filter else
            "invalid_document" if in_record else "invalid_request")
    return _error(request, 422, kind, message, detail=detail)


# FastAPI answers a body it could not parse, other than with a JSON syntax error, with this 400 (its json.loads
# raised something else: a RecursionError for a body nested thousands of levels deep)
_UNPARSED_BODY = "There was an error parsing the body"


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, error: StarletteHTTPException):
    if error.status_code == 400 and error.detail == _UNPARSED_BODY:
        return _error(request, 400, "malformed_json", "the request body could not be parsed as JSON (too deeply "
                      "nested, or not JSON)")
    kind = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
    msg = f"no route {request.method} {request.url.path}" if error.status_code in (404, 405) else str(error.detail)
    headers = getattr(error, "headers", None)
    if error.status_code == 405:
        headers = {**(headers or {}), "Allow": _allowed(request)}
    return _error(request, error.status_code, kind, msg, headers=headers)


def _allowed(request: Request) -> str:
    """Every method some route takes at this path: Starlette's 405 names only the first route whose path
    matched (POST /v1/documents), not the others at the same path (DELETE /v1/documents)."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


@app.exception_handler(Exception)
async def _bug(request: Request, error: Exception):
    logger.exception("unhandled error in %s %s", request.method, request.url.path)
    return _error(request, 500, "internal", f"internal error ({type(error).__name__}); see the Router replica log")


class _Timing:
    """Request latency per route, tenant and status (the Prometheus histogram, and a tenant's API requests
    in the console's window); plain ASGI, as Starlette's BaseHTTPMiddleware runs every request through
    extra tasks and streams that cost more than the rest of a small request."""

    def __init__(self, asgi_app):
        self.app = asgi_app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = [500]
        state = scope.setdefault("state", {})

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            route = _route_of(scope)
            tenant = state.get("tenant") or "-"
            metrics_of(scope["app"]).latency.observe(elapsed_ms, tags={"route": route, "tenant": tenant,
                                                               "status": str(status[0])})
            if in_request_window(route):
                window_of(scope["app"]).record(tenant, elapsed_ms, status[0])


app.add_middleware(_Timing)
