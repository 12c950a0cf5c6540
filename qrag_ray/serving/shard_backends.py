"""Where a tenant version's shards are searched from the Router: `RouterShards`, the Router's own store for
small tenants, or `RemoteShards`, the ShardSearcher deployments (`timings.path`: "router" or "shards")."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError

from qrag_ray.errors import find_user_error
from qrag_ray.search.query import Query
from qrag_ray.search.retrieve import Found, LocalShards, Wanted
from qrag_ray.search.shard_search import ShardReply
from qrag_ray.serving.api_errors import overloaded, shard_unavailable
from qrag_ray.serving.shard_store import ShardKey, ShardStore, affinity_id

logger = logging.getLogger("ray.serve")


class RouterShards(LocalShards):
    """Small tenants' shards in the Router's own store, searched in one worker-thread call."""

    path = "router"

    def __init__(self, store: ShardStore):
        super().__init__(store.get, offload=True)
        self.store = store

    async def call(self, shard: int, method: str, key: ShardKey, *args):
        return await getattr(self.store, method)(shard, key, *args)

    async def search(self, key: ShardKey, num_shards: int, qvecs: np.ndarray, q: Query) -> list[ShardReply]:
        replies = await super().search(key, num_shards, qvecs, q)
        self.store.observe(key, replies)
        return replies


class RemoteShards:
    """The ShardSearcher deployments, deployment g searching shards g*per .. g*per+per-1, so a query makes
    one call per deployment. A call carries its (tenant, version, g) as Serve's multiplexed model id, so
    Serve routes it to a replica that holds that group (tenant affinity); a replica that died under a call
    is retried once (Serve routes the retry to a live one)."""

    path = "shards"

    def __init__(self, handles: list, affinity: bool = True, per: int = 1):
        self.handles, self.affinity, self.per = list(handles), affinity, per
        self._methods: dict[tuple[int, str], object] = {}  # (group, method) -> its handle, made once

    async def call(self, shard: int, method: str, key: ShardKey, *args):
        """`method` of the deployment searching `shard`, for that shard."""
        return await self._call(shard // self.per, method, shard, key, *args)

    async def _call(self, group: int, method: str, shards, key: ShardKey, *args):
        if (handle := self._methods.get((group, method))) is None:
            handle = self._methods[(group, method)] = getattr(self.handles[group], method)
        if self.affinity:
            handle = handle.options(multiplexed_model_id=affinity_id(key, group))
        for attempt in (1, 2):
            try:
                return await handle.remote(shards, key, *args)
            except BackPressureError:
                raise overloaded(f"ShardSearcher{group} is at its queue limit") from None
            except Exception as e:
                if (ue := find_user_error(e)) is not None:  # e.g. a shard that cannot load this tenant's index
                    raise ue from None
                if not isinstance(e, (ActorDiedError, ActorUnavailableError, RayActorError)):
                    raise
                if attempt == 2:
                    raise shard_unavailable(shards, type(e).__name__) from None
                logger.warning("ShardSearcher%d replica failed (%s); retrying once", group, type(e).__name__)

    async def search(self, key: ShardKey, num_shards: int, qvecs: np.ndarray, q: Query) -> list[ShardReply]:
        groups = [list(range(s, min(s + self.per, num_shards))) for s in range(0, num_shards, self.per)]
        replies = await asyncio.gather(*[self._call(g, "search", shards, key, qvecs, q) for g, shards in enumerate(groups)])
        return [r for group in replies for r in group]

    async def lookup(self, key: ShardKey, want: Wanted) -> Found:
        return list(await asyncio.gather(*[self.call(s, "lookup", key, rows, cis) for s, (rows, cis) in want.items()]))
