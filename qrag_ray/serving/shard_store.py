"""Loaded tenant shards in a byte-bounded LRU, searched off the event loop, and the ShardKey a request
names them by. The Router keeps a plain store for the small tenants it searches itself; each ShardSearcher
deployment (serving/shard_searcher.py) is a store asked only for its group of shard numbers. Both load and
search through qrag_ray.search.shard_search, so a tenant ranks the same whichever process searches it."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from ray import serve

from qrag_ray.errors import IndexFormatError
from qrag_ray.search.fetch import chunk_records
from qrag_ray.search.query import Query
from qrag_ray.search.shard_search import LoadedShard, ShardReply, group_pages, load_shard, search_hits
from qrag_ray.serving.config import assigned_cpus
from qrag_ray.runtime.byte_lru import ByteLRU

logger = logging.getLogger("ray.serve")


class VersionMoved(IndexFormatError):
    """The directory a request named now holds another index version (a plain index directory was
    republished in place); the router re-resolves the tenant and retries once."""


@dataclass(frozen=True)
class ShardKey:
    """Exactly what to search: one version on every shard, and no tenant table in the shard replicas."""

    tenant: str
    index_dir: str  # the directory holding manifest.json (a version directory under a versioned root)
    version: str  # the index_version the request was started with


def affinity_id(key: ShardKey, group: int) -> str:
    """What a request's replica should hold: Serve's multiplexed model id for (tenant, version, shard group:
    the ShardSearcher deployment's number)."""
    return f"{key.tenant}/{key.version}/{group}"


# Loads run in threads of their own, never in the event loop's default pool that the searches (and the
# Router's encodes) use: a burst of cold tenants, or one big shard being read and hashed, never holds a
# thread a warm search is waiting for. Two, so one big load does not queue the small ones behind it.
LOAD_THREADS = 2


class ShardStore:
    """Loaded shards in an LRU bounded in bytes, one load per key, FAISS off the event loop: as many
    searches at once as the replica has CPUs, each with `threads` FAISS threads (default 1)."""

    def __init__(self, cache_bytes: int, threads: int | None):
        from qrag_ray.serving.app_metrics import ShardMetrics

        # Parallel searches, not OpenMP inside one: FAISS's IVF search parallelises over a batch's queries,
        # never within one, and OpenMP threads wait for each other at every barrier, spinning where another
        # search or replica holds the core. Threads beyond the replica's CPUs would only wait on each other.
        self.threads = threads or 1
        self.searches = assigned_cpus()
        self.cache = ByteLRU(cache_bytes)
        self.metrics = ShardMetrics()
        self.problems: dict[str, dict] = {}  # tenant -> {"shard", "version", "reason"} of its last failed load
        self.counts: Counter = Counter()  # hits, cold_loads, evictions, load_seconds
        self.loads: dict[int, dict] = {}  # shard number -> its cold loads, their seconds and the slowest
        self._loading: dict[tuple[ShardKey, int], asyncio.Future] = {}
        self._loader = ThreadPoolExecutor(LOAD_THREADS, thread_name_prefix="shard-load")
        self._searcher = ThreadPoolExecutor(self.searches, thread_name_prefix="shard-search")
        self._refresher: asyncio.Task | None = None
        self._replica: str | None = None

    async def _refresh_gauge(self) -> None:
        """Ray drops a gauge sample that is not re-reported within ~2 export intervals, so the
        loaded-version gauge is re-set periodically for as long as the shard stays loaded."""
        while True:
            for key, shard in self.cache.keys():
                self.metrics.version.set(1, tags={"tenant": key.tenant, "shard": str(shard), "index_version": key.version})
            await asyncio.sleep(2.0)

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose gauge task died is restarted rather than kept."""
        t = self._refresher
        if t is not None and t.done() and not t.cancelled() and t.exception() is not None:
            raise RuntimeError(f"metrics task failed: {t.exception()!r}")

    async def get(self, shard: int, key: ShardKey) -> LoadedShard:
        if self._refresher is None:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_gauge())
        ck = (key, shard)
        hit = self.cache.get(ck)
        if hit is not None:
            return hit
        if ck not in self._loading:  # one load per key, however many requests wait (a deadline cancels a waiter)
            self._loading[ck] = asyncio.ensure_future(self._load(shard, key))
        return await asyncio.shield(self._loading[ck])

    async def _load(self, shard: int, key: ShardKey) -> LoadedShard:
        t0 = time.perf_counter()
        try:
            loaded = await asyncio.get_running_loop().run_in_executor(
                self._loader, load_shard, key.index_dir, shard, self.threads, True, True)
        except Exception as e:
            self.problems[key.tenant] = {"shard": shard, "version": key.version, "reason": f"{type(e).__name__}: {e}"}
            logger.error("shard %d of tenant %r (%s) failed to load: %s", shard, key.tenant, key.index_dir, e)
            raise
        finally:
            del self._loading[(key, shard)]
        if loaded.index_version != key.version:
            raise VersionMoved(f"{key.index_dir} now holds index version {loaded.index_version}, not {key.version}")
        if self.problems.get(key.tenant, {}).get("shard") == shard:
            self.problems.pop(key.tenant)
        self._count("cold_loads", key.tenant, shard)
        self.counts["load_seconds"] += (seconds := time.perf_counter() - t0)
        mine = self.loads.setdefault(shard, {"shard": shard, "cold_loads": 0, "seconds": 0.0, "max_seconds": 0.0})
        mine["cold_loads"] += 1
        mine["seconds"] += seconds
        mine["max_seconds"] = max(mine["max_seconds"], seconds)
        self.metrics.load_seconds.observe(seconds, tags={"tenant": key.tenant, "shard": str(shard)})
        for old, old_shard in self.cache.put((key, shard), loaded, loaded.nbytes):
            self._count("evictions", old.tenant, old_shard)
            self._evicted(old, old_shard)
            logger.info("evicted shard %d of tenant %r version %s (cache %d bytes)", old_shard, old.tenant,
                        old.version, self.cache.max_bytes)
        logger.info("shard %d of tenant %r loaded: %d vectors, index %s, %d bytes", shard, key.tenant,
                    loaded.index.ntotal, loaded.index_version, loaded.nbytes)
        return loaded

    def _count(self, event: str, tenant: str, shard: int) -> None:
        self.counts[event] += 1
        self.metrics.cache.inc(tags={"tenant": tenant, "shard": str(shard), "event": event[:-1]})

    def _evicted(self, key: ShardKey, shard: int) -> None:
        """Called for each shard the byte budget pushed out (nothing to do in a plain store)."""

    async def search(self, shards: list[int], key: ShardKey, qvecs: np.ndarray, q: Query) -> list[ShardReply]:
        """Each of `shards` searched for every query vector (in the replica's search threads: FAISS releases
        the GIL), with the page's metadata: of the group's own top k where that decides the page
        (`group_winners`), else of each shard's, so a group of shards replies about as much as one."""
        cold = [self.cache.get((key, s)) is None for s in shards]
        for s, c in zip(shards, cold):  # a hit is a search served from memory: lookups and prepares are not
            if not c:
                self._count("hits", key.tenant, s)
        loaded = await asyncio.gather(*[self.get(s, key) for s in shards])
        run = functools.partial(asyncio.get_running_loop().run_in_executor, self._searcher)
        found = await asyncio.gather(*[run(search_hits, ls, s, qvecs, q, True) for s, ls in zip(shards, loaded)])
        replies = await run(group_pages, loaded, found, q)
        if self._replica is None:
            self._replica = serve.get_replica_context().replica_id.unique_id
        for r, c in zip(replies, cold):
            r.cold, r.replica = c, self._replica
        self.observe(key, replies)
        return replies

    def observe(self, key: ShardKey, replies: list[ShardReply]) -> None:
        for r in replies:
            self.metrics.latency.observe(r.search_ms, tags={"tenant": key.tenant, "shard": str(r.shard)})

    async def lookup(self, shard: int, key: ShardKey, rows: list[int], chunk_idxs: list[int]) -> tuple[dict, dict]:
        ls = await self.get(shard, key)
        return ls.index.matched(rows), ls.chunk_meta(chunk_idxs)

    async def fetch(self, shard: int, key: ShardKey, chunk_idxs: list[int] | None, doc_id: str | None) -> list[dict]:
        """The records of these chunks, or of a document's chunks, in this shard (qrag_ray.search.fetch)."""
        ls = await self.get(shard, key)
        return await asyncio.to_thread(chunk_records, ls, chunk_idxs, doc_id)

    async def prepare(self, shard: int, key: ShardKey) -> None:
        """Load and verify `key` before it gets traffic (a new version, or start-up)."""
        await self.get(shard, key)

    async def retire(self, shard: int, key: ShardKey) -> bool:
        """Drop a version the router moved off (in-flight requests keep their own reference)."""
        self._evicted(key, shard)
        return self.cache.pop((key, shard)) is not None

    def status(self) -> dict:
        return {"loaded": len(self.cache), "bytes": self.cache.bytes, "max_bytes": self.cache.max_bytes,
                "problems": dict(self.problems), **{k: self.counts[k] for k in CACHE_COUNTS},
                "shard_loads": [dict(v) for _, v in sorted(self.loads.items())]}


CACHE_COUNTS = ("hits", "cold_loads", "evictions", "load_seconds")
