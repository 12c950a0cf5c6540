"""A ShardSearcher replica's threads: as many searches at once as it has CPUs (a group's shards side by side
as far as they go), each with one FAISS thread unless `faiss_threads` says otherwise: OpenMP threads of one
search spin at its barriers where other searches hold the cores."""

from __future__ import annotations

import pytest

from qrag_ray.serving import shard_store
from qrag_ray.serving.shard_store import ShardStore


@pytest.mark.parametrize("cpus,faiss_threads,searches,threads", [
    (1, None, 1, 1),  # the default replica: one search at a time (a group's shards in turns)
    (4, None, 4, 1),  # a node-sized group of 4 shards: side by side
    (2, 3, 2, 3),  # faiss_threads set: as asked
])
def test_searches_at_once_are_the_replicas_cpus(monkeypatch, cpus, faiss_threads, searches, threads):
    monkeypatch.setattr(shard_store, "assigned_cpus", lambda: cpus)
    store = ShardStore(1 << 20, faiss_threads)
    assert (store.searches, store.threads) == (searches, threads)
