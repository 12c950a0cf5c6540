"""The browser console at `/console` (docs/SERVING.md, "The console"): its static pages, served with the
headers that keep them safe, and the read-only JSON they need that the API's routes do not give (the
Router's routes call in here): an index described as `qrag info` describes it, every vector of one chunk,
and the operate view's figures.

The pages are files of `console_assets/` (HTML, ES modules, CSS; no build step, no library) served only
when the app's `console` arg is on; off, every console route answers 404 like an unknown route. They hold
the tenant key in the tab (sessionStorage) and call the public API with it, so the console can show
nothing its key could not read through the API.

The index reads open the index's own files in a worker thread, never through a shard store: a person
browsing an index must not load, evict or hold up the shards that serve queries. What they compute is
kept per index version (a version never changes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qrag_ray.index.format import read_table_file
from qrag_ray.index.summary import index_bytes, summarize_index
from qrag_ray.runtime.byte_lru import ByteLRU
from qrag_ray.search.filters import OPERATORS
from qrag_ray.search.shard import shard_of_chunk
from qrag_ray.serving import api_models as m
from qrag_ray.serving.api_errors import ApiError
from qrag_ray.serving.config import replica_id
from qrag_ray.serving.console_models import (
    ConsoleCache,
    ConsoleDeployment,
    ConsoleField,
    ConsoleIndex,
    ConsoleOperate,
    ConsoleRequests,
    ConsoleTenant,
    ConsoleVector,
    ConsoleVectors,
)
from qrag_ray.serving.tenant_versions import IndexVersion

ASSETS = Path(__file__).with_name("console_assets")
PAGE = "index.html"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# Scripts and styles only from the console's own files (no inline script or style, no eval), requests only
# to this origin, no frames, no forms posted elsewhere, no referrer sent with the page's links.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
ASSET_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                 "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                 "Cross-Origin-Opener-Policy": "same-origin", "Cache-Control": "no-cache"}
SAMPLES_MAX = 20
VERSIONS_KEPT = 32  # index versions whose summary (and bytes) a Router replica keeps


def console_off() -> ApiError:
    """What every console route answers on a server started without it: an unknown route's 404."""
    return ApiError(404, "not_found", "the console is off on this server (turn it on with the serve app's "
                                      "`console: true`; `qrag serve` has it on unless --no-console)")


def asset_names() -> dict[str, Path]:
    """The files the console serves, by name: the asset folder's, of the known types (nothing else on disk)."""
    return {p.name: p for p in sorted(ASSETS.iterdir()) if p.is_file() and p.suffix in CONTENT_TYPES}


class Console:
    """The console of one Router replica: `on` is the app's `console` arg."""

    def __init__(self, enabled: bool):
        self.on = enabled
        self.assets = asset_names() if enabled else {}
        self._summaries = ByteLRU(VERSIONS_KEPT)  # (dir, version, samples) -> the summary task
        self._bytes = ByteLRU(VERSIONS_KEPT)  # (dir, version) -> index bytes on disk

    def require(self) -> None:
        if not self.on:
            raise console_off()

    # ---- the pages ------------------------------------------------------------------------------
    def asset(self, name: str):
        """One file of the console with its content type and the security headers; unknown names are 404."""
        from fastapi.responses import Response

        self.require()
        path = self.assets.get(name)
        if path is None:
            raise ApiError(404, "not_found", f"the console has no file {name!r}")
        return Response(path.read_bytes(), media_type=CONTENT_TYPES[path.suffix], headers=ASSET_HEADERS)

    def page(self):
        """The console's one HTML page (its views are the page's own, by the URL's #fragment)."""
        return self.asset(PAGE)

    def entry(self):
        """`/console` sends the browser to `/console/` (relative, so under any route prefix), where the
        page's own relative links resolve inside the console."""
        from fastapi.responses import RedirectResponse

        self.require()
        return RedirectResponse("console/", status_code=308, headers=ASSET_HEADERS)

    # ---- the index view -------------------------------------------------------------------------
    async def index(self, version: IndexVersion, name: str, llm: bool, samples: int) -> ConsoleIndex:
        """What `qrag info` shows of the tenant's index version (its server path left out), with the
        filter operators of each metadata field and what the search form may offer."""
        key = (version.dir, version.index_version, samples)
        task = self._summaries.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            # a task of its own: a request that misses its deadline leaves it running for the next one
            task = asyncio.ensure_future(asyncio.to_thread(summarize_index, version.dir, samples))
            self._summaries.put(key, task, 1)
        summary = dict(await asyncio.shield(task))
        summary.pop("path", None)
        schema = summary.get("metadata_schema") or {}
        fields = [ConsoleField(name=field, type=kind, operators=list(OPERATORS.get(kind, ())))
                  for field, kind in sorted(schema.items())]
        bm25_alpha = version.policy.bm25_alpha if version.manifest.has_bm25 else None
        return ConsoleIndex(name=name, fields=fields, llm=llm, bm25_alpha=bm25_alpha, **summary)

    async def vectors(self, version: IndexVersion, name: str, chunk_id: str) -> ConsoleVectors:
        """Every vector the index holds for one chunk (its kind and the text embedded), in stored order."""
        rows = await asyncio.to_thread(chunk_vectors, version, chunk_id)
        if not rows:
            raise ApiError(404, "not_found", f"index '{name}' has no chunk {chunk_id!r}")
        return ConsoleVectors(chunk_id=chunk_id, index=name, index_version=version.index_version,
                                vectors=[ConsoleVector(**r) for r in rows])

    # ---- the operate view -----------------------------------------------------------------------
    async def operate(self, status: m.AdminStatus, active: dict[str, IndexVersion], requests: dict[str, dict],
                      window_s: float) -> ConsoleOperate:
        """The admin status with what the operate view adds: each tenant's index bytes and requests in
        this replica's window, every store's cache counts side by side, the app's deployments."""
        sizes = await asyncio.gather(*[self._index_bytes(active[t.name]) if t.name in active else _none()
                                       for t in status.tenants])
        tenants = [ConsoleTenant(**t.model_dump(), index_bytes=size,
                                   requests=ConsoleRequests(**requests[t.name]) if t.name in requests else None)
                   for t, size in zip(status.tenants, sizes, strict=True)]
        caches = [ConsoleCache(where="Router", **status.router_cache.model_dump(exclude={"shard"}))]
        caches += [ConsoleCache(where=f"ShardSearcher{s.shard}", **s.model_dump(exclude={"shard"}))
                   for s in status.shards]
        deployments, problem = await asyncio.to_thread(serve_deployments)
        anonymous = requests.get("-")
        return ConsoleOperate(
            status=status.status, ready=status.ready, inflight=status.inflight, window_s=window_s,
            tenants=tenants, unauthenticated=ConsoleRequests(**anonymous) if anonymous else None,
            caches=caches, deployments=deployments, deployments_error=problem, replica=replica_id() or None,
            registry=status.registry, at=time.time())

    async def _index_bytes(self, version: IndexVersion) -> int:
        key = (version.dir, version.index_version)
        found = self._bytes.get(key)
        if found is None:
            found = (await asyncio.to_thread(index_bytes, version.manifest))["total"]
            self._bytes.put(key, found, 1)
        return found


async def _none() -> None:
    return None


def chunk_vectors(version: IndexVersion, chunk_id: str) -> list[dict]:
    """[{kind, text}] of the chunk's vectors, read from its shard's row table (memory-mapped where the
    index has Arrow files: only the chunk's rows are decoded)."""
    chunk_idx, number = shard_of_chunk(chunk_id, version.num_shards)
    path = version.manifest.file(version.manifest.shard(number).meta)
    if path.suffix == ".arrow":
        table = read_table_file(path, ["chunk_idx", "kind", "text"])
        table = table.filter(pc.equal(table.column("chunk_idx"), pa.scalar(chunk_idx, pa.int64())))
    else:
        table = pq.read_table(path, columns=["chunk_idx", "kind", "text"], filters=[("chunk_idx", "=", chunk_idx)])
    return [{"kind": str(row["kind"]), "text": row["text"]} for row in table.select(["kind", "text"]).to_pylist()]


def serve_deployments() -> tuple[list[ConsoleDeployment], str | None]:
    """(this app's deployments with their replicas by state, the reason when Serve could not say).
    Blocking (a call to Serve's controller): run it in a thread."""
    try:
        from ray import serve

        app_name = serve.get_replica_context().app_name
        status = serve.status()
    except Exception as error:
        return [], f"{type(error).__name__}: {error}"
    found = status.applications.get(app_name)
    if found is None:
        return [], f"Serve reports no application {app_name!r}"
    return [ConsoleDeployment(name=name, status=_text(d.status), message=d.message or "",
                                replicas={_text(state): count for state, count in d.replica_states.items()})
            for name, d in sorted(found.deployments.items())], None


def _text(value) -> str:
    return str(getattr(value, "value", value))
