"""The ShardSearcher{g} deployment: a shard store asked only for its group of shard numbers, with tenant
affinity: Serve's model multiplexing routes a request to a replica that holds its (tenant, version, group),
so the cluster's cache grows with its replicas."""

from __future__ import annotations

from ray import serve

from qrag_ray.runtime.long_lived import freeze_long_lived
from qrag_ray.search.shard_search import LoadedShard
from qrag_ray.serving.serve_multiplex import withdraw
from qrag_ray.serving.shard_store import ShardKey, ShardStore, affinity_id


class ShardSearcher(ShardStore):
    """The ShardSearcher{g} deployment, searching shards g*per .. g*per+per-1: a store whose held shard
    groups are Serve multiplexed models, so that Serve routes a request carrying `affinity_id` as its
    multiplexed model id to a replica holding it (else to the replica holding the fewest). The byte
    budget decides what is held, not a model count."""

    def __init__(self, cache_bytes: int, threads: int | None, per: int = 1):
        super().__init__(cache_bytes, threads)
        self.per = per
        freeze_long_lived()  # Ray, Serve and the search libraries, loaded: shards come and go in the byte cache

    async def get(self, shard: int, key: ShardKey) -> LoadedShard:
        # held from the start of its load: Serve routes the group's next calls here, to wait for this one load
        await self._hold(affinity_id(key, shard // self.per))
        try:
            return await super().get(shard, key)
        except Exception:
            self._evicted(key, shard)  # a load that failed holds nothing
            raise

    @serve.multiplexed(max_num_models_per_replica=-1)
    async def _hold(self, model_id: str) -> str:
        return model_id  # a marker: the shard itself lives in the byte-bounded cache

    def _evicted(self, key: ShardKey, shard: int) -> None:
        # routing stops preferring this replica for a group none of whose shards it holds or loads any more;
        # Serve has no public call for it, hence the one adapter (serving/serve_multiplex.py)
        group = shard // self.per
        held = [*self.cache.keys(), *self._loading]
        if not any(k == key and s // self.per == group and s != shard for k, s in held):
            withdraw(self, affinity_id(key, group))
