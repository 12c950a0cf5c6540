"""Opened tenant shards in a byte-bounded LRU, one load per shard however many requests ask, and the
VersionKey a request names them by. The Router keeps one for the small tenants it searches itself
(LocalShards), every ShardSearcher replica one for its group of shard numbers. A cache and nothing else: who
searches a shard searches it (qrag_ray.search.shard.search_shards), so a tenant ranks the same whichever
process searches it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from qrag_ray.errors import IndexFormatError
from qrag_ray.runtime.byte_lru import ByteLRU
from qrag_ray.search.shard import Shard

logger = logging.getLogger("ray.serve")

CACHE_COUNTS = ("hits", "cold_loads", "evictions", "load_seconds")
# Loads run in threads of their own, never in the event loop's default pool that the searches (and the
# Router's encodes) use: a burst of cold tenants, or one big shard being read and hashed, never holds a
# thread a warm search is waiting for. Two, so one big load does not queue the small ones behind it.
LOAD_THREADS = 2


class VersionMoved(IndexFormatError):
    """The directory a request named now holds another index version (a plain index directory was
    republished in place); the Router re-resolves the tenant and retries once."""


@dataclass(frozen=True)
class VersionKey:
    """What a shard call names: one tenant's index version, so every shard answers a request from the same
    version and a replica needs no tenant table."""

    tenant: str
    index_dir: str  # the directory holding manifest.json (a version directory under a versioned root)
    version: str  # the index_version the request was started with


class ShardCache:
    """Opened shards by (version, shard number) in an LRU bounded in bytes, one load per key, loads read in
    their own threads; each shard's FAISS searches use `threads` OpenMP threads. `metrics` (the app's
    Prometheus metrics, or None outside Serve) counts hits, cold loads, evictions and load seconds;
    `on_evict(key, number)` hears of every shard the budget pushed out or the caller retired."""

    def __init__(self, max_bytes: int, threads: int | None, metrics=None,
                 on_evict: Callable[[VersionKey, int], None] | None = None):
        self.threads = threads or 1
        self.lru = ByteLRU(max_bytes)
        self.metrics = metrics
        self.on_evict = on_evict
        self.problems: dict[str, dict] = {}  # tenant -> {"shard", "version", "reason"} of its last failed load
        self.counts: Counter = Counter()  # CACHE_COUNTS
        self.loads: dict[int, dict] = {}  # shard number -> its cold loads, their seconds and the slowest
        self._loading: dict[tuple[VersionKey, int], asyncio.Future] = {}
        self._loader = ThreadPoolExecutor(LOAD_THREADS, thread_name_prefix="shard-load")

    def holds(self, key: VersionKey, numbers: list[int]) -> bool:
        """Whether any of these shards of `key` is opened or opening here."""
        held = {*self.lru.keys(), *self._loading}
        return any((key, number) in held for number in numbers)

    def is_open(self, key: VersionKey, number: int) -> bool:
        """Whether shard `number` of `key` is opened here now (a get would not load it)."""
        return self.lru.get((key, number)) is not None

    async def get(self, key: VersionKey, number: int) -> Shard:
        """Shard `number` of `key`, opened here or loaded now (one load however many ask at once; a deadline
        cancels a waiter, never the load)."""
        entry = (key, number)
        shard = self.lru.get(entry)
        if shard is not None:
            self._count("hits", key.tenant, number)
            return shard
        if entry not in self._loading:
            self._loading[entry] = asyncio.ensure_future(self._load(key, number))
        return await asyncio.shield(self._loading[entry])

    async def _load(self, key: VersionKey, number: int) -> Shard:
        started = time.perf_counter()
        try:
            try:
                shard = await asyncio.get_running_loop().run_in_executor(
                    self._loader, Shard.open, key.index_dir, number, self.threads, True, True)
            finally:
                del self._loading[(key, number)]
            if shard.index_version != key.version:
                raise VersionMoved(f"{key.index_dir} now holds index version {shard.index_version}, not {key.version}")
        except Exception as error:
            if not isinstance(error, VersionMoved):
                self.problems[key.tenant] = {"shard": number, "version": key.version,
                                             "reason": f"{type(error).__name__}: {error}"}
                logger.error("shard %d of tenant %r (%s) failed to load: %s", number, key.tenant, key.index_dir,
                             error)
            self._evicted(key, number)  # a load that failed holds nothing
            raise
        if self.problems.get(key.tenant, {}).get("shard") == number:
            self.problems.pop(key.tenant)
        seconds = time.perf_counter() - started
        self._count("cold_loads", key.tenant, number)
        self.counts["load_seconds"] += seconds
        mine = self.loads.setdefault(number, {"shard": number, "cold_loads": 0, "seconds": 0.0, "max_seconds": 0.0})
        mine["cold_loads"] += 1
        mine["seconds"] += seconds
        mine["max_seconds"] = max(mine["max_seconds"], seconds)
        if self.metrics is not None:
            self.metrics.load_seconds.observe(seconds, tags={"tenant": key.tenant, "shard": str(number)})
        for old_key, old_number in self.lru.put((key, number), shard, shard.nbytes):
            self._count("evictions", old_key.tenant, old_number)
            self._evicted(old_key, old_number)
            logger.info("evicted shard %d of tenant %r version %s (cache %d bytes)", old_number, old_key.tenant,
                        old_key.version, self.lru.max_bytes)
        logger.info("shard %d of tenant %r loaded: %d vectors, index %s, %d bytes", number, key.tenant,
                    shard.ntotal, shard.index_version, shard.nbytes)
        return shard

    def _count(self, event: str, tenant: str, number: int) -> None:
        self.counts[event] += 1
        if self.metrics is not None:
            self.metrics.cache.inc(tags={"tenant": tenant, "shard": str(number), "event": event[:-1]})

    def _evicted(self, key: VersionKey, number: int) -> None:
        if self.on_evict is not None:
            self.on_evict(key, number)

    def retire(self, key: VersionKey, number: int) -> bool:
        """Drop a shard of a version the Router moved off (in-flight requests keep their own reference)."""
        dropped = self.lru.pop((key, number)) is not None
        self._evicted(key, number)
        return dropped

    def loaded_versions(self) -> list[tuple[VersionKey, int]]:
        """The (version, shard number) pairs opened here."""
        return self.lru.keys()

    def status(self) -> dict:
        """The cache as the admin status shows it (api_models.CacheStatus)."""
        return {"loaded": len(self.lru), "bytes": self.lru.bytes, "max_bytes": self.lru.max_bytes,
                "problems": dict(self.problems), **{name: self.counts[name] for name in CACHE_COUNTS},
                "shard_loads": [dict(loads) for _, loads in sorted(self.loads.items())]}
