"""Serve deployments behind the router: one searcher per shard number, and the LLM.

Each ShardSearcher replica serves one shard number for every tenant that is too big to be searched
inside the Router (`local_search_max_bytes`; small tenants are searched there, with the same code). A request names exactly what
to search: the tenant, the index *version directory* and the version it must be (`ShardKey`), so
a request is answered from one version on every shard, and a replica needs no tenant table of its
own (the router's registry is the only one, and it reloads). Loaded shards live in a cache bounded
in bytes (`shard_cache_bytes`), so thousands of small tenants share a replica and a big one evicts
them. FAISS runs in a worker thread, never on the replica's event loop.

A replica answers with vector-level hits deep enough that its own top k distinct chunks are final
(`search_shard_exact`), plus the texts of those chunks, so the router merges once in one round trip.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from qrag_ray.errors import IndexFormatError
from qrag_ray.search.merge import FusionPolicy, merge_hits
from qrag_ray.serving.shard_cache import ByteLRU

logger = logging.getLogger("ray.serve")

DEFAULT_CACHE_BYTES = 2 << 30


def _assigned_cpus(default: int = 1) -> int:
    """The replica's CPU share, so FAISS / torch threads match what Ray scheduled it for."""
    try:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        if cpus:
            return max(1, int(round(cpus)))
    except Exception:  # noqa: BLE001 - outside Ray: keep the default
        pass
    return default


class VersionMoved(IndexFormatError):
    """The directory a request named now holds another index version (a plain index directory was
    republished in place); the router re-resolves the tenant and retries once."""


@dataclass(frozen=True)
class ShardKey:
    tenant: str
    index_dir: str  # the directory holding manifest.json (a version directory under a versioned root)
    version: str  # the index_version the request was started with


# ---------------------------------------------------------------------------------- shards
@dataclass
class LoadedShard:
    tenant: str
    searcher: object  # qrag_ray.index.searcher.ShardSearcher
    chunks: dict[int, dict]  # chunk_idx -> {chunk_id, doc_id, title, text}: this shard's chunks only
    policy: FusionPolicy
    index_version: str
    multiplier: int
    nbytes: int


@dataclass
class ShardReply:
    shard: int
    index_version: str
    ntotal: int
    hits: list  # one ShardHits per query, each final for this shard's top k
    matched: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, text)
    chunks: dict[int, dict] = field(default_factory=dict)  # chunk_idx -> meta
    search_ms: float = 0.0
    rounds: int = 1


def load_shard(tenant: str, index_dir: str, shard: int, threads: int | None) -> LoadedShard:
    """Load and verify (sha256) one shard of one tenant's index: FAISS file, row metadata, its chunks."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from qrag_ray.index.format import CHUNKS, files_under, load_manifest, verify_files
    from qrag_ray.index.searcher import ShardSearcher
    from qrag_ray.search.engine import initial_multiplier

    manifest = load_manifest(index_dir)
    if shard >= manifest.num_shards:
        raise IndexFormatError(f"index {index_dir} has {manifest.num_shards} shards, no shard {shard}")
    searcher = ShardSearcher(index_dir, shard, manifest, verify=True, threads=threads, use_gpu=True)
    verify_files(manifest, [CHUNKS])
    t = pq.read_table(manifest.file(CHUNKS), columns=["chunk_idx", "chunk_id", "doc_id", "title", "text", "shard"])
    t = t.filter(pc.equal(t.column("shard"), shard))
    cols = {c: t.column(c).to_pylist() for c in ("chunk_idx", "chunk_id", "doc_id", "title", "text")}
    chunks = {int(ci): {"chunk_id": a, "doc_id": b, "title": c, "text": d}
              for ci, a, b, c, d in zip(cols["chunk_idx"], cols["chunk_id"], cols["doc_id"], cols["title"], cols["text"])}
    info = manifest.shard(shard)
    rels = [info["faiss"], info["meta"]] + (files_under(manifest, info["bm25"]) if info.get("bm25") else [])
    nbytes = sum(os.path.getsize(manifest.file(r)) for r in rels) + int(t.nbytes)
    return LoadedShard(tenant, searcher, chunks, FusionPolicy.from_manifest(manifest), manifest.index_version,
                       initial_multiplier(manifest), nbytes)


class ShardStore:
    """Loaded tenant shards (any shard number) in a byte-bounded LRU, one load per key, FAISS off the
    event loop. A ShardSearcher replica keeps one for its shard number; the Router keeps one for the
    small tenants it searches itself (no process hop). Both answer through the same methods, so a
    tenant ranks the same whichever process searches it."""

    def __init__(self, cache_bytes: int, threads: int):
        from qrag_ray.serving.metrics import ShardMetrics

        self.threads = threads
        self.cache = ByteLRU(cache_bytes)
        self.metrics = ShardMetrics()
        self.problems: dict[str, dict] = {}  # tenant -> {"shard", "version", "reason"} of its last failed load
        self._loading: dict[tuple[ShardKey, int], asyncio.Future] = {}
        self._refresher: asyncio.Task | None = None

    def _ensure_refresher(self) -> None:
        if self._refresher is None:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_gauge())

    async def _refresh_gauge(self) -> None:
        """Ray drops a gauge sample that is not re-reported within ~2 export intervals, so the
        loaded-version gauge is re-set periodically for as long as the shard stays loaded."""
        while True:
            for key, shard in self.cache.keys():
                self.metrics.version.set(1, tags={"tenant": key.tenant, "shard": str(shard),
                                                  "index_version": key.version})
            await asyncio.sleep(2.0)

    def refresher_failed(self) -> BaseException | None:
        t = self._refresher
        return t.exception() if t is not None and t.done() and not t.cancelled() else None

    async def get(self, shard: int, key: ShardKey) -> LoadedShard:
        self._ensure_refresher()
        ck = (key, shard)
        hit = self.cache.get(ck)
        if hit is not None:
            return hit
        pending = self._loading.get(ck)
        if pending is not None:  # one load per key, however many requests wait for it
            return await asyncio.shield(pending)
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "exception never retrieved"
        self._loading[ck] = fut
        try:
            loaded = await asyncio.to_thread(load_shard, key.tenant, key.index_dir, shard, self.threads)
            if loaded.index_version != key.version:
                raise VersionMoved(f"{key.index_dir} now holds index version {loaded.index_version}, "
                                   f"not {key.version}")
        except Exception as e:
            if not isinstance(e, VersionMoved):
                self.problems[key.tenant] = {"shard": shard, "version": key.version, "reason": f"{type(e).__name__}: {e}"}
                logger.error("shard %d of tenant %r (%s) failed to load: %s", shard, key.tenant, key.index_dir, e)
            fut.set_exception(e)
            raise
        finally:
            self._loading.pop(ck, None)
        if self.problems.get(key.tenant, {}).get("shard") == shard:
            self.problems.pop(key.tenant, None)
        for old, old_shard in self.cache.put(ck, loaded, loaded.nbytes):
            logger.info("evicted shard %d of tenant %r version %s (cache %d bytes)", old_shard, old.tenant,
                        old.version, self.cache.max_bytes)
        logger.info("shard %d of tenant %r loaded: %d vectors, index %s, %d bytes", shard, key.tenant,
                    loaded.searcher.ntotal, loaded.index_version, loaded.nbytes)
        fut.set_result(loaded)
        return loaded

    async def search(self, shard: int, key: ShardKey, qvecs: np.ndarray, k: int, min_score: float | None,
                     queries: list[str] | None = None, bm25_alpha: float | None = None) -> ShardReply:
        ls = await self.get(shard, key)
        policy = ls.policy if bm25_alpha is None else ls.policy.with_bm25_alpha(bm25_alpha)
        t0 = time.perf_counter()
        reply = await asyncio.to_thread(_search_loaded, ls, shard, qvecs, k, min_score, policy, queries)
        reply.search_ms = (time.perf_counter() - t0) * 1000
        self.metrics.latency.observe(reply.search_ms, tags={"tenant": key.tenant, "shard": str(shard)})
        return reply

    async def search_all(self, shards: list[int], key: ShardKey, qvecs: np.ndarray, k: int,
                         min_score: float | None, queries: list[str] | None = None,
                         bm25_alpha: float | None = None) -> list[ShardReply]:
        """Every shard of a small tenant searched in ONE worker thread, one after the other: each search
        is well under a millisecond there, so one thread hop instead of one per shard is what counts."""
        loaded = await self.get_all(shards, key)
        replies = await asyncio.to_thread(search_loaded_all, shards, loaded, qvecs, k, min_score, queries, bm25_alpha)
        self.observe(key, replies)
        return replies

    async def get_all(self, shards: list[int], key: ShardKey) -> list[LoadedShard]:
        return [await self.get(s, key) for s in shards]

    def observe(self, key: ShardKey, replies: list[ShardReply]) -> None:
        for r in replies:
            self.metrics.latency.observe(r.search_ms, tags={"tenant": key.tenant, "shard": str(r.shard)})

    async def lookup(self, shard: int, key: ShardKey, rows: list[int], chunk_idxs: list[int]) -> tuple[dict, dict]:
        ls = await self.get(shard, key)
        return ({int(r): ls.searcher.matched(int(r)) for r in rows},
                {int(c): ls.chunks[int(c)] for c in chunk_idxs})

    async def prepare(self, shard: int, key: ShardKey) -> dict:
        """Load and verify `key` before it gets traffic (a new version, or start-up)."""
        ls = await self.get(shard, key)
        return {"shard": shard, "tenant": key.tenant, "version": ls.index_version, "ntotal": ls.searcher.ntotal}

    async def retire(self, shard: int, key: ShardKey) -> bool:
        """Drop a version the router moved off (in-flight requests keep their own reference)."""
        return self.cache.pop((key, shard)) is not None

    def status(self) -> dict:
        return {"loaded": len(self.cache), "bytes": self.cache.bytes, "max_bytes": self.cache.max_bytes,
                "problems": dict(self.problems)}


def search_loaded_all(shards: list[int], loaded: list[LoadedShard], qvecs: np.ndarray, k: int,
                      min_score: float | None, queries: list[str] | None,
                      bm25_alpha: float | None) -> list[ShardReply]:
    """A small tenant's shards, loaded in the Router's own process, searched in the calling (worker)
    thread, each timed. Hits only (`page=False`): the Router looks the merged page's chunks up itself."""
    out = []
    for s, ls in zip(shards, loaded):
        policy = ls.policy if bm25_alpha is None else ls.policy.with_bm25_alpha(bm25_alpha)
        t0 = time.perf_counter()
        reply = _search_loaded(ls, s, qvecs, k, min_score, policy, queries, page=False)
        reply.search_ms = (time.perf_counter() - t0) * 1000
        out.append(reply)
    return out


def _search_loaded(ls: LoadedShard, shard: int, qvecs: np.ndarray, k: int, min_score: float | None,
                   policy: FusionPolicy, queries: list[str] | None, page: bool = True) -> ShardReply:
    """The shard's final local hits plus (`page`) the texts of its own top-k chunks: the only rows of
    this shard that can reach the page, sent with the hits to save a second call. In the Router's own
    process that second call is a dict lookup, so there `page=False` skips the per-shard merge and only
    the merged page's chunks are looked up (run in a worker thread)."""
    from qrag_ray.search.engine import search_shard_exact

    hits, rounds = search_shard_exact(ls.searcher, qvecs, k, ls.multiplier, min_score, policy, queries)
    reply = ShardReply(shard, ls.index_version, ls.searcher.ntotal, hits, rounds=rounds)
    for h in (hits if page else ()):
        for r in merge_hits([h], 0, k, min_score, policy)[0]:
            reply.chunks[r.chunk_idx] = ls.chunks[r.chunk_idx]
            for _, row, _ in r.matches:
                reply.matched[row] = ls.searcher.matched(row)
    return reply


class ShardSearcherDeployment:
    """Shard `shard` of any tenant's index, loaded on demand (a ShardStore for one shard number)."""

    def __init__(self, shard: int, cache_bytes: int = DEFAULT_CACHE_BYTES, faiss_threads: int | None = None):
        self.shard = shard
        self.store = ShardStore(cache_bytes, faiss_threads or _assigned_cpus())

    async def search(self, key: ShardKey, qvecs: np.ndarray, k: int, min_score: float | None,
                     queries: list[str] | None = None, bm25_alpha: float | None = None) -> ShardReply:
        return await self.store.search(self.shard, key, qvecs, k, min_score, queries, bm25_alpha)

    async def lookup(self, key: ShardKey, rows: list[int], chunk_idxs: list[int]) -> tuple[dict, dict]:
        return await self.store.lookup(self.shard, key, rows, chunk_idxs)

    async def prepare(self, key: ShardKey) -> dict:
        return await self.store.prepare(self.shard, key)

    async def retire(self, key: ShardKey) -> bool:
        return await self.store.retire(self.shard, key)

    async def status(self) -> dict:
        return {"shard": self.shard, **self.store.status()}

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose gauge task died is restarted rather than kept."""
        e = self.store.refresher_failed()
        if e is not None:
            raise RuntimeError(f"shard {self.shard}: metrics task failed: {e!r}")


# ---------------------------------------------------------------------------------- LLM
class Synthesizer:
    """The query-time LLM (HyDE passages, answers) behind qrag_ray.generation.chat."""

    def __init__(self, generator: dict):
        from qrag_ray.generation.chat import get_chat_model

        self.model = get_chat_model(generator)
        if hasattr(self.model, "start"):  # vLLM: pay the engine start-up before traffic
            self.model.start()

    async def complete(self, messages: list[dict], max_tokens: int) -> str:
        return await self.model.acomplete(messages, max_tokens=max_tokens, temperature=0.0)
