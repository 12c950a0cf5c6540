"""Which index version each tenant is served from (no Serve needed: the versions carry their shard backends).

A new version is loaded and verified on every shard (and its embedder loaded) while the old one keeps
serving; only then does the tenant's pointer move, and the old version leaves the shard caches once
the requests started on it are done (`retire_after_s`). A version that fails to load leaves the old
one in force and is retried after `retry_s`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.errors import QragError
from qrag_ray.index.file_checks import manifest_now
from qrag_ray.index.format import Manifest
from qrag_ray.index.versions import is_versioned_root, resolve_index
from qrag_ray.index.write_state import WriteState, read_write_state
from qrag_ray.runtime.byte_lru import ByteLRU
from qrag_ray.search.query import check_hybrid
from qrag_ray.serving.api_errors import ApiError, index_unavailable
from qrag_ray.serving.segments import DeltaIndex, Segments
from qrag_ray.serving.shard_cache import VersionKey
from qrag_ray.serving.tenants import Tenant

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class IndexVersion:
    """One immutable version of a tenant's index as the Router needs it (vectors and texts stay with the
    shards), with the backend its shards are searched through: LocalShards (small enough to search inside
    the Router, no shard hop) or RemoteShards (the ShardSearcher deployments)."""

    dir: str
    index_version: str
    manifest: Manifest
    policy: SearchConfig
    num_shards: int
    embedder: str
    backend: Any  # LocalShards | RemoteShards, or Segments over one of them and the deltas of a written index
    metadata_schema: dict[str, str] | None = None  # the fields a filter may name (written documents' included)
    root: str | None = None  # a versioned root: its writes are followed (serving/segments.py)
    generation: int = 0  # the writes of the root this view includes (its write state's generation)

    def key(self, tenant: str) -> VersionKey:
        """What the shard calls of `tenant`'s requests on this version name."""
        return VersionKey(tenant, self.dir, self.index_version)


class IndexReader:
    """tenant index path -> the IndexVersion it points at now, computed once per version (the last `keep`):
    searched in the Router (`local`) when its files total at most `local_max_bytes`, else by the
    ShardSearchers (`remote`)."""

    def __init__(self, max_shards: int, local_max_bytes: int, local, remote, keep: int = 4096):
        self.max_shards = max_shards
        self.local_max_bytes = local_max_bytes
        self.local = local
        self.remote = remote
        self._seen = ByteLRU(keep)  # (dir, version) -> IndexVersion, each counted as 1
        self._delta_versions = ByteLRU(keep)  # a delta's directory -> its index version

    def __call__(self, path: str) -> IndexVersion:
        """The version `path` points at, with the writes applied over it (a versioned root's write state)."""
        version = self._base(path)
        if version.root is None:
            return version
        state = read_write_state(version.root)
        return version if state is None else self.with_writes(version, state)

    def with_writes(self, version: IndexVersion, state: WriteState) -> IndexVersion:
        """`version` (a base) seen through the write state of its root: its deltas searched beside its shards,
        the documents later writes hid left out of each segment. A state over another base (a compaction
        between publishing its version and resetting the state) is not applied: the watcher swaps bases."""
        if state.base_version != version.index_version:
            return version
        base = version.backend.base if isinstance(version.backend, Segments) else version.backend
        deltas = tuple(DeltaIndex(str(delta.path), self._delta_version(delta.path), delta.last_seq)
                       for delta in state.deltas)
        hidden = {segment.seq: segment.hidden for segment in state.segments()}
        segments = Segments(base, self.local, version.root, state.generation, state.base_seq, deltas, hidden)
        schema = state.metadata_schema or version.manifest.metadata_schema
        return replace(version, backend=segments, metadata_schema=schema, generation=state.generation)

    def _delta_version(self, path: Path) -> str:
        known = self._delta_versions.get(str(path))
        if known is None:
            known = manifest_now(path).index_version
            self._delta_versions.put(str(path), known, 1)
        return known

    def _base(self, path: str) -> IndexVersion:
        resolved = resolve_index(path)
        seen = self._seen.get((str(resolved.dir), resolved.version))
        if seen is not None:
            return seen
        manifest = resolved.manifest  # the manifest the version was read from: no second read to disagree with
        if manifest.num_shards > self.max_shards:
            raise QragError(f"it has {manifest.num_shards} shards but the app serves {self.max_shards} "
                            "(raise args.shards)")
        policy = manifest.search_policy
        check_hybrid(policy, manifest)
        nbytes = sum(manifest.file(name).stat().st_size for name in manifest.files)
        backend = self.local if nbytes <= self.local_max_bytes else self.remote
        root = str(resolved.root) if is_versioned_root(resolved.root) else None
        version = IndexVersion(str(resolved.dir), resolved.version, manifest, policy, manifest.num_shards,
                               manifest.embedder_model, backend, manifest.metadata_schema, root)
        self._seen.put((version.dir, version.index_version), version, 1)
        return version


class TenantVersions:
    """Each tenant's version in force. `read(path)` gives the IndexVersion a tenant's path points at;
    `warm_encoder(model)` loads a query embedder."""

    def __init__(self, read: Callable[[str], IndexVersion], warm_encoder: Callable[[str], Awaitable],
                 retire_after_s: float, retry_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.read = read
        self.warm_encoder = warm_encoder
        self.retire_after_s = retire_after_s
        self.retry_s = retry_s
        self.clock = clock
        self.active: dict[str, IndexVersion] = {}  # tenant -> the version its requests start on
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

    async def current(self, tenant: Tenant) -> IndexVersion:
        """The version a request of `tenant` starts on; first use loads without a warm-up (no traffic yet)."""
        version = self.active.get(tenant.name) or await self.check(tenant, warm=False)
        if version is None:
            raise index_unavailable(tenant.name, self.problems.get(tenant.name, "it could not be read"))
        if version.root is not None:
            version = self._follow_writes(tenant.name, version)
        return version

    def _follow_writes(self, tenant: str, version: IndexVersion) -> IndexVersion:
        """`version` moved to its root's newest write state, read per request (a stat while it is unchanged),
        so an applied write is searched by the next request of any replica."""
        try:
            state = read_write_state(version.root)
        except QragError as error:  # a torn or foreign STATE: keep what was served, say why
            self.problems[tenant] = str(error)
            return version
        if state is None or state.generation == version.generation or state.base_version != version.index_version:
            return version
        moved = self.read.with_writes(version, state)
        if self.active.get(tenant) is version:
            self.active[tenant] = moved
        return moved

    def moved(self, tenant: str) -> None:
        """A shard found another version in the directory a request named: resolve again next time."""
        self.active.pop(tenant, None)

    def newest(self, tenant: Tenant) -> tuple[IndexVersion | None, str | None]:
        """(the version the tenant's path points at, the problem to report)."""
        try:
            return self.read(tenant.index), self.problems.get(tenant.name)
        except QragError as error:
            return None, str(error)

    async def check(self, tenant: Tenant, warm: bool) -> IndexVersion | None:
        """Resolve the tenant's index; switch to a new version only once every shard has loaded it."""
        old = self.active.get(tenant.name)
        try:
            version = self.read(tenant.index)
        except QragError as error:
            self.problems[tenant.name] = str(error)
            return old
        if old is not None and (old.index_version, old.dir) == (version.index_version, version.dir):
            return old
        if warm:
            if self.clock() < self._retry_at.get((tenant.name, version.index_version), 0.0):
                return old
            try:
                key = version.key(tenant.name)
                await asyncio.gather(self.warm_encoder(version.embedder),
                                     *[version.backend.prepare(key, number) for number in range(version.num_shards)])
            except (ApiError, QragError) as error:  # str(ApiError) is its message
                self.problems[tenant.name] = (f"version {version.index_version} failed to load, still serving "
                                              f"{old.index_version}: {error}" if old else str(error))
                self._retry_at[(tenant.name, version.index_version)] = self.clock() + self.retry_s
                return old
        self.active[tenant.name] = version
        self.problems.pop(tenant.name, None)
        if old is not None:
            logger.info("tenant %r now serves index version %s (was %s)", tenant.name, version.index_version,
                        old.index_version)
            self._retire_later(old, tenant.name, self.retire_after_s)
        return version

    def _retire_later(self, version: IndexVersion, tenant: str, delay: float) -> None:
        async def retire():
            await asyncio.sleep(delay)  # requests started on it finish first
            if not any((a.dir, a.index_version) == (version.dir, version.index_version) for a in self.active.values()):
                key = version.key(tenant)
                await asyncio.gather(*[version.backend.retire(key, number) for number in range(version.num_shards)],
                                     return_exceptions=True)

        task = asyncio.get_running_loop().create_task(retire())
        self._retiring.add(task)  # a reference until done, so the task is not collected mid-way
        task.add_done_callback(self._retiring.discard)
