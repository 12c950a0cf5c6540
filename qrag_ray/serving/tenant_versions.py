"""Which index version each tenant is served from (no Serve needed; shard calls injected).

A new version is loaded and verified on every shard (and its embedder loaded) while the old one keeps
serving; only then does the tenant's pointer move, and the old version leaves the shard caches once
the requests started on it are done (`retire_after_s`). A version that fails to load leaves the old
one in force and is retried after `retry_s`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from qrag_ray.errors import QragError
from qrag_ray.index.format import Manifest
from qrag_ray.index.versions import resolve_index
from qrag_ray.search.query import check_hybrid
from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.serving.api_errors import ApiError, index_unavailable
from qrag_ray.serving.shard_store import ShardKey
from qrag_ray.runtime.byte_lru import ByteLRU
from qrag_ray.serving.tenants import Tenant

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class TenantIndex:
    """One immutable index version as the Router needs it (vectors and texts stay in the shard stores)."""

    dir: str
    version: str
    manifest: Manifest
    policy: SearchConfig
    num_shards: int
    embedder: str
    local: bool  # small enough to search inside the Router (no shard hop)

    def key(self, tenant: str) -> ShardKey:
        return ShardKey(tenant, self.dir, self.version)


class IndexReader:
    """tenant index path -> the TenantIndex it points at now, computed once per version (the last `keep`)."""

    def __init__(self, max_shards: int, local_max_bytes: int, keep: int = 4096):
        self.max_shards, self.local_max_bytes = max_shards, local_max_bytes
        self._seen = ByteLRU(keep)  # (dir, version) -> TenantIndex, each counted as 1

    def __call__(self, path: str) -> TenantIndex:
        r = resolve_index(path)
        if (ti := self._seen.get((str(r.dir), r.version))) is not None:
            return ti
        man = r.manifest  # the manifest the version was read from: no second read to disagree with
        if man.num_shards > self.max_shards:
            raise QragError(f"it has {man.num_shards} shards but the app serves {self.max_shards} (raise args.shards)")
        policy = man.search_policy
        check_hybrid(policy, man)
        nbytes = sum(man.file(rel).stat().st_size for rel in man.files)
        ti = TenantIndex(str(r.dir), r.version, man, policy, man.num_shards, man.embedder_model,
                         local=nbytes <= self.local_max_bytes)
        self._seen.put((ti.dir, ti.version), ti, 1)
        return ti


class TenantVersions:
    """`call_shard(index, shard, "prepare"|"retire", key)` reaches a shard store; `warm_encoder(model)`
    loads a query embedder."""

    def __init__(self, read: Callable[[str], TenantIndex], call_shard: Callable[..., Awaitable],
                 warm_encoder: Callable[[str], Awaitable], retire_after_s: float, retry_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.read, self.call_shard, self.warm_encoder = read, call_shard, warm_encoder
        self.retire_after_s, self.retry_s, self.clock = retire_after_s, retry_s, clock
        self.active: dict[str, TenantIndex] = {}  # tenant -> the version its requests start on
        self.problems: dict[str, str] = {}  # tenant -> why its index (or its newest version) is not served
        self._retry_at: dict[tuple[str, str], float] = {}  # (tenant, version) that failed to warm -> next try
        self._retiring: set[asyncio.Task] = set()

    async def sync(self, tenants: dict[str, Tenant], warm_first: int | None = None) -> None:
        """One watcher pass over the tenant table in force: retire tenants that are gone, then move
        every served tenant (and, at start-up, the first `warm_first`) to its newest version."""
        for gone in set(self.active) - set(tenants):
            self._retire_later(self.active.pop(gone), gone, 0.0)
        names = list(tenants)[:warm_first] if warm_first is not None else []
        for name in dict.fromkeys(names + list(self.active)):
            await self.check(tenants[name], warm=True)

    async def current(self, tenant: Tenant) -> TenantIndex:
        """The version a request of `tenant` starts on; first use loads without a warm-up (no traffic yet)."""
        ti = self.active.get(tenant.name) or await self.check(tenant, warm=False)
        if ti is None:
            raise index_unavailable(tenant.name, self.problems.get(tenant.name, "it could not be read"))
        return ti

    def moved(self, tenant: str) -> None:
        """A shard found another version in the directory a request named: resolve again next time."""
        self.active.pop(tenant, None)

    def newest(self, tenant: Tenant) -> tuple[TenantIndex | None, str | None]:
        """(the version the tenant's path points at, the problem to report)."""
        try:
            return self.read(tenant.index), self.problems.get(tenant.name)
        except QragError as e:
            return None, str(e)

    async def check(self, tenant: Tenant, warm: bool) -> TenantIndex | None:
        """Resolve the tenant's index; switch to a new version only once every shard has loaded it."""
        old = self.active.get(tenant.name)
        try:
            ti = self.read(tenant.index)
        except QragError as e:
            self.problems[tenant.name] = str(e)
            return old
        if old is not None and (old.version, old.dir) == (ti.version, ti.dir):
            return old
        if warm:
            if self.clock() < self._retry_at.get((tenant.name, ti.version), 0.0):
                return old
            try:
                await asyncio.gather(self.warm_encoder(ti.embedder), *[
                    self.call_shard(ti, i, "prepare", ti.key(tenant.name)) for i in range(ti.num_shards)])
            except (ApiError, QragError) as e:  # str(ApiError) is its message
                self.problems[tenant.name] = (f"version {ti.version} failed to load, still serving "
                                              f"{old.version}: {e}" if old else str(e))
                self._retry_at[(tenant.name, ti.version)] = self.clock() + self.retry_s
                return old
        self.active[tenant.name] = ti
        self.problems.pop(tenant.name, None)
        if old is not None:
            logger.info("tenant %r now serves index version %s (was %s)", tenant.name, ti.version, old.version)
            self._retire_later(old, tenant.name, self.retire_after_s)
        return ti

    def _retire_later(self, ti: TenantIndex, tenant: str, delay: float) -> None:
        async def retire():
            await asyncio.sleep(delay)  # requests started on it finish first
            if not any((a.dir, a.version) == (ti.dir, ti.version) for a in self.active.values()):
                await asyncio.gather(*[self.call_shard(ti, i, "retire", ti.key(tenant)) for i in range(ti.num_shards)],
                                     return_exceptions=True)

        task = asyncio.get_running_loop().create_task(retire())
        self._retiring.add(task)  # a reference until done, so the task is not collected mid-way
        task.add_done_callback(self._retiring.discard)
