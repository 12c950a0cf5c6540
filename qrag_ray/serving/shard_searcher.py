"""The ShardSearcher deployments and the Router's client of them. Deployment g (`ShardSearcher{g}`) searches
shard numbers g*per .. g*per+per-1 of any tenant's index (per: `shards_per_searcher`), so a query makes one
call per deployment; its replicas hold tenants' shards in a byte-bounded cache, with tenant affinity: Serve's
model multiplexing routes a call to a replica that holds its (tenant, version, group), so the cluster's cache
grows with its replicas. A replica reports its load in queries and search-thread time for its deployment's
autoscaling (serving/autoscaling.py) and, before it takes traffic, opens its group of the first tenants, so
an added replica shares their passes as soon as Serve routes to it."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError

from qrag_ray.errors import find_user_error
from qrag_ray.runtime.long_lived import freeze_long_lived
from qrag_ray.search.query import QueryBatch
from qrag_ray.search.shard import Shard, search_shards
from qrag_ray.search.shard_reply import ShardReply
from qrag_ray.serving.api_errors import overloaded, shard_unavailable
from qrag_ray.serving.app_metrics import process_metrics
from qrag_ray.serving.autoscaling import ShardLoad
from qrag_ray.serving.config import AppArgs, assigned_cpus, replica_id
from qrag_ray.serving.serve_multiplex import withdraw
from qrag_ray.serving.shard_cache import ShardCache, VersionKey
from qrag_ray.serving.tenant_versions import IndexReader

logger = logging.getLogger("ray.serve")


def group_shards(num_shards: int, per: int) -> list[list[int]]:
    """The shard numbers each ShardSearcher deployment searches, by deployment number."""
    return [list(range(first, min(first + per, num_shards))) for first in range(0, num_shards, per)]


def searcher_names(num_shards: int, per: int) -> list[str]:
    """The ShardSearcher deployments of an app over `num_shards` shard numbers, `per` each."""
    return [f"ShardSearcher{group}" for group in range(len(group_shards(num_shards, per)))]


def affinity_id(key: VersionKey, group: int) -> str:
    """What a call's replica should hold: Serve's multiplexed model id for (tenant, version, shard group)."""
    return f"{key.tenant}/{key.version}/{group}"


class ShardSearcher:
    """The ShardSearcher{g} deployment: its group's shards of any tenant, opened in a ShardCache and searched
    in `assigned_cpus()` threads (parallel searches, not OpenMP inside one: FAISS's IVF search parallelises
    over a batch's queries, never within one, and OpenMP threads wait for each other at every barrier,
    spinning where another search or replica holds the core). The groups a replica holds are Serve
    multiplexed models, so Serve routes a call carrying `affinity_id` to a replica holding it (else to the
    replica holding the fewest); the byte budget decides what is held, not a model count.

    With `args` (the app's) and its deployment number `group`, the constructor opens the group's shards of the
    app's first `warm_tenants` tenants searched by the ShardSearchers before it returns: Serve routes nothing
    to a replica before its constructor has returned, and routes those tenants' calls to the replicas holding
    them, so a replica added under load takes its share of their passes at once and no call waits for its
    loads."""

    async def __init__(self, cache_bytes: int, threads: int | None, per: int = 1, group: int = 0,
                       args: AppArgs | None = None):
        self.per = per
        self.metrics = process_metrics()
        self.cache = ShardCache(cache_bytes, threads, self.metrics, on_evict=self._withdraw)
        self.threads = assigned_cpus()
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="shard-search")
        self.load = ShardLoad(self.threads)
        self.reporter = asyncio.get_running_loop().create_task(self.metrics.report_versions(self.cache))
        self.replica = replica_id()
        if args is not None:
            await self._warm(args, group)
        freeze_long_lived()  # Ray, Serve and the search libraries, loaded: shards come and go in the byte cache

    async def _warm(self, args: AppArgs, group: int) -> None:
        """Open group `group`'s shards of the app's first `warm_tenants` tenants whose index the ShardSearchers
        search (bigger than `local_search_max_bytes`); a tenant that cannot be read or loaded is skipped (the
        Router's admin status reports it)."""
        reader = IndexReader(args.shards or 256, args.local_search_max_bytes, local=None, remote=self)
        numbers = range(group * self.per, (group + 1) * self.per)
        try:
            tenants = list(args.load_tenants().by_name.values())[:args.warm_tenants]
        except Exception as error:
            logger.warning("ShardSearcher%d: no tenants warmed (%s)", group, error)
            return
        for tenant in tenants:
            try:
                version = reader(tenant.index)
                if version.backend is not self:
                    continue
                key = version.key(tenant.name)
                await asyncio.gather(*[self._open(key, number) for number in numbers if number < version.num_shards])
            except Exception as error:
                logger.warning("ShardSearcher%d: tenant %r not warmed: %s", group, tenant.name, error)

    async def _open(self, key: VersionKey, number: int) -> Shard:
        # held from the start of its load: Serve routes the group's next calls here, to wait for this one load
        await self._hold(affinity_id(key, number // self.per))
        return await self.cache.get(key, number)

    @serve.multiplexed(max_num_models_per_replica=-1)
    async def _hold(self, model_id: str) -> str:
        return model_id  # a marker: the shard itself lives in the byte-bounded cache

    def _withdraw(self, key: VersionKey, number: int) -> None:
        # routing stops preferring this replica for a group none of whose shards it holds or loads any more;
        # Serve has no public call for it, hence the one adapter (serving/serve_multiplex.py)
        group = number // self.per
        others = [shard for shard in range(group * self.per, (group + 1) * self.per) if shard != number]
        if not self.cache.holds(key, others):
            withdraw(self, affinity_id(key, group))

    async def search(self, key: VersionKey, numbers: list[int], vectors: np.ndarray,
                     batch: QueryBatch) -> list[ShardReply]:
        """Shards `numbers` of `key` searched for every query vector, each reply with its page metadata."""
        with self.load.call(len(vectors)):
            cold = [not self.cache.is_open(key, number) for number in numbers]
            shards = await asyncio.gather(*[self._open(key, number) for number in numbers])
            with self.load.searching(min(len(shards), self.threads)):
                replies = await asyncio.to_thread(search_shards, shards, vectors, batch, self.pool, True)
        for reply, was_cold in zip(replies, cold, strict=True):
            reply.cold = was_cold
            reply.replica = self.replica
        self.metrics.searched(key.tenant, replies)
        return replies

    async def fetch(self, key: VersionKey, number: int, chunk_idx: list[int] | None, doc_id: str | None) -> list[dict]:
        """The records of these chunks, or of a document's chunks, in shard `number` (Shard.fetch_records)."""
        shard = await self._open(key, number)
        return await asyncio.to_thread(shard.fetch_records, chunk_idx, doc_id)

    async def prepare(self, key: VersionKey, number: int) -> None:
        """Open and verify shard `number` of `key` before it gets traffic (a new version, or start-up)."""
        await self._open(key, number)

    async def retire(self, key: VersionKey, number: int) -> bool:
        """Drop a version the Router moved off (in-flight requests keep their own reference)."""
        return self.cache.retire(key, number)

    def status(self) -> dict:
        """This replica's cache (api_models.CacheStatus)."""
        return self.cache.status()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics, asked for every few seconds: this replica's load since the last
        ask (serving/autoscaling.py, which ShardSearcherPolicy reads)."""
        return self.load.report()

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose metrics task died is restarted rather than kept."""
        task = self.reporter
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"metrics task failed: {task.exception()!r}")


class RemoteShards:
    """The ShardSearcher deployments as a shard backend, with LocalShards' methods: a call for shard s goes
    to deployment s // per, a search to every deployment at once (one call each). A call carries its
    (tenant, version, group) as Serve's multiplexed model id, so Serve routes it to a replica that holds
    that group (tenant affinity); a replica that died under a call is retried once (Serve routes the retry
    to a live one). `passes_at_once` is how many search passes of one query group the Router sends at once:
    the most running replicas of any of the deployments (`count_replicas`), so that concurrent passes go to
    different replicas (Serve routes each to the least busy replica holding the group)."""

    path = "shards"  # what `timings.path` says of a search here

    def __init__(self, handles: list, affinity: bool = True, per: int = 1):
        self.handles = list(handles)
        self.affinity = affinity
        self.per = per
        self.passes_at_once = 1
        self._methods: dict[tuple[int, str], object] = {}  # (group, method) -> its handle, made once

    async def count_replicas(self) -> int:
        """Read the deployments' running replicas from Serve's status (off the event loop) into
        `passes_at_once`; unchanged when Serve does not answer."""
        try:
            status = await asyncio.wait_for(asyncio.to_thread(serve.status), 10)
            deployments = status.applications[self.handles[0].app_name].deployments
            running = [sum(count for state, count in deployments[handle.deployment_name].replica_states.items()
                           if state == "RUNNING") for handle in self.handles]
            self.passes_at_once = max([1, *running])
        except Exception as error:  # Serve's status is advisory here: the last count stays
            logger.debug("ShardSearcher replicas not counted: %r", error)
        return self.passes_at_once

    async def _call(self, group: int, method: str, key: VersionKey, *args):
        handle = self._methods.get((group, method))
        if handle is None:
            handle = self._methods[(group, method)] = getattr(self.handles[group], method)
        if self.affinity:
            handle = handle.options(multiplexed_model_id=affinity_id(key, group))
        for attempt in (1, 2):
            try:
                return await handle.remote(key, *args)
            except BackPressureError:
                raise overloaded(f"ShardSearcher{group} is at its queue limit") from None
            except Exception as error:
                user_error = find_user_error(error)
                if user_error is not None:  # e.g. a shard that cannot load this tenant's index
                    raise user_error from None
                if not isinstance(error, (ActorDiedError, ActorUnavailableError, RayActorError)):
                    raise
                if attempt == 2:
                    raise shard_unavailable(f"ShardSearcher{group}", type(error).__name__) from None
                logger.warning("ShardSearcher%d replica failed (%s); retrying once", group, type(error).__name__)

    async def search(self, key: VersionKey, num_shards: int, vectors: np.ndarray,
                     batch: QueryBatch) -> list[ShardReply]:
        """Every shard's reply for the batch, one call per deployment."""
        calls = [self._call(group, "search", key, numbers, vectors, batch)
                 for group, numbers in enumerate(group_shards(num_shards, self.per))]
        return [reply for group_replies in await asyncio.gather(*calls) for reply in group_replies]

    async def fetch(self, key: VersionKey, number: int, chunk_idx: list[int] | None, doc_id: str | None) -> list[dict]:
        """The records of these chunks, or of a document's chunks, in shard `number`."""
        return await self._call(number // self.per, "fetch", key, number, chunk_idx, doc_id)

    async def prepare(self, key: VersionKey, number: int) -> None:
        """Open shard `number` in a replica of its deployment before it gets traffic."""
        await self._call(number // self.per, "prepare", key, number)

    async def retire(self, key: VersionKey, number: int) -> None:
        """Drop shard `number` of a version no request starts on any more."""
        await self._call(number // self.per, "retire", key, number)

    async def statuses(self) -> list[dict | BaseException]:
        """Each deployment's cache status (from whichever replica Serve routes to), or why it did not answer."""
        return await asyncio.gather(*[handle.status.remote() for handle in self.handles], return_exceptions=True)
