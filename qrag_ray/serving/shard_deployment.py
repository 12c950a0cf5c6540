"""The ShardSearcher deployment: shard number `shard` of every tenant too big for the Router, loaded
on demand into a ShardStore. A request names its `ShardKey` and `Query`; the reply carries the hits
and the texts of this shard's own top k chunks, so the Router merges once in one round trip."""

from __future__ import annotations

import numpy as np

from qrag_ray.serving.config import assigned_cpus
from qrag_ray.serving.messages import Query, ShardKey, ShardReply
from qrag_ray.serving.shard_store import ShardStore


class ShardSearcherDeployment:
    def __init__(self, shard: int, cache_bytes: int, faiss_threads: int | None):
        self.shard = shard
        self.store = ShardStore(cache_bytes, faiss_threads or assigned_cpus())

    async def search(self, key: ShardKey, qvecs: np.ndarray, query: Query) -> ShardReply:
        return await self.store.search(self.shard, key, qvecs, query)

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
