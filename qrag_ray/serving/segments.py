"""A written index as one backend: its base version's shards (wherever they are searched) and its deltas
(small indexes of the documents written since the base, searched in the Router beside a small tenant's
shards), each segment leaving out the documents a later write replaced or deleted. Their replies merge in
one pass of the retrieval core, with one fusion and one dedup, as the shards of one index do."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import numpy as np

from qrag_ray.search.query import QueryBatch, Tombstones
from qrag_ray.search.shard_reply import ShardReply
from qrag_ray.serving.shard_cache import VersionKey


@dataclass(frozen=True)
class DeltaIndex:
    """One delta index of a written version: where it is, its own index version, its newest sequence number."""

    index_dir: str
    version: str
    seq: int


class Segments:
    """The base backend's shards (`base`: LocalShards or RemoteShards) and the `deltas`, searched through
    `local` (the Router's LocalShards): the same methods as each. Every segment's batch names the root's
    tombstones at `generation` and its own sequence number, so it leaves out what later writes hid."""

    def __init__(self, base, local, root: str, generation: int, base_seq: int, deltas: tuple[DeltaIndex, ...],
                 hidden: dict[int, frozenset[str]]):
        self.base = base
        self.local = local
        self.root = root
        self.generation = generation
        self.base_seq = base_seq
        self.deltas = deltas
        self.hidden = hidden  # segment seq -> the documents it leaves out (for the fetch routes)
        self.path = base.path

    @property
    def passes_at_once(self) -> int:
        """The base's (its shard groups' running replicas): the deltas are small and searched in the Router."""
        return getattr(self.base, "passes_at_once", 1)

    def _tombstones(self, seq: int) -> Tombstones:
        return Tombstones(self.root, self.generation, seq)

    def _delta_key(self, key: VersionKey, delta: DeltaIndex) -> VersionKey:
        return VersionKey(key.tenant, delta.index_dir, delta.version)

    async def search(self, key: VersionKey, num_shards: int, vectors: np.ndarray,
                     batch: QueryBatch) -> list[ShardReply]:
        """Every segment's replies for the batch; a delta's shard numbered after the base's, so each
        (shard, row) names one vector."""
        base = self.base.search(key, num_shards, vectors, replace(batch, tombstones=self._tombstones(self.base_seq)))
        deltas = [self.local.search(self._delta_key(key, delta), 1, vectors,
                                    replace(batch, tombstones=self._tombstones(delta.seq))) for delta in self.deltas]
        found = await asyncio.gather(base, *deltas)
        replies = list(found[0])
        for offset, delta_replies in enumerate(found[1:]):
            for reply in delta_replies:
                reply.shard = num_shards + offset
                replies.append(reply)
        return replies

    def _visible(self, records: list[dict], seq: int) -> list[dict]:
        hidden = self.hidden.get(seq, frozenset())
        return [record for record in records if record["doc_id"] not in hidden]

    async def fetch(self, key: VersionKey, number: int, chunk_idx: list[int] | None, doc_id: str | None) -> list[dict]:
        """The visible records of these chunks, or of a document's chunks, in base shard `number` and (asked
        by chunk, or for shard 0 of a document's fan-out) in every delta: a document lives in one segment."""
        base = self._visible(await self.base.fetch(key, number, chunk_idx, doc_id), self.base_seq)
        if doc_id is not None and number != 0:
            return base
        found = await asyncio.gather(*[self.local.fetch(self._delta_key(key, delta), 0, chunk_idx, doc_id)
                                       for delta in self.deltas])
        return base + [record for delta, records in zip(self.deltas, found, strict=True)
                       for record in self._visible(records, delta.seq)]

    async def prepare(self, key: VersionKey, number: int) -> None:
        """Open base shard `number` (and, with shard 0, every delta) before traffic."""
        await self.base.prepare(key, number)
        if number == 0:
            await asyncio.gather(*[self.local.prepare(self._delta_key(key, delta), 0) for delta in self.deltas])

    async def retire(self, key: VersionKey, number: int) -> None:
        """Drop base shard `number` (and, with shard 0, every delta) of a version no request starts on."""
        await self.base.retire(key, number)
        if number == 0:
            await asyncio.gather(*[self.local.retire(self._delta_key(key, delta), 0) for delta in self.deltas])
