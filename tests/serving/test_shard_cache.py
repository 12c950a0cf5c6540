"""ShardCache, the byte-bounded cache of opened shards of the Router and of every ShardSearcher replica, on
real indexes without Serve: one load per shard however many requests and paths (a search, a version's
warm-up, a fetch) ask for it at once; loads in threads of their own, so a burst of them never holds the
thread a warm search needs; load seconds per shard in the status."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import numpy as np
import pytest

from qrag_ray.index.format import load_manifest
from qrag_ray.search.query import QueryBatch
from qrag_ray.search.retrieve import LocalShards
from qrag_ray.search.shard import Shard
from qrag_ray.serving.shard_cache import ShardCache, VersionKey

pytestmark = pytest.mark.integration  # real FAISS shards, built by the session's indexes (Ray)


def _key(tenant: str, index) -> VersionKey:
    return VersionKey(tenant, str(index), load_manifest(index).index_version)


def _query(index) -> tuple[np.ndarray, QueryBatch]:
    manifest = load_manifest(index)
    vectors = np.random.default_rng(0).standard_normal((2, manifest.dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True), QueryBatch(5, None, manifest.search_policy)


def _local(cache: ShardCache) -> LocalShards:
    return LocalShards(cache.get, cache.retire, offload=True)


def test_every_path_asking_for_one_cold_shard_at_once_shares_one_load(tenant_indexes, monkeypatch):
    real = Shard.open
    calls = Counter()

    def slow_open(index_dir, number, *args):
        calls[(index_dir, number)] += 1
        time.sleep(0.3)  # every ask below arrives while the first one's load runs
        return real(index_dir, number, *args)

    monkeypatch.setattr(Shard, "open", slow_open)
    index = tenant_indexes["alpha"]
    cache = ShardCache(256 << 20, 1)
    key = _key("alpha", index)
    vectors, batch = _query(index)

    async def burst():
        backend = _local(cache)
        return await asyncio.gather(*[backend.search(key, 3, vectors, batch) for _ in range(4)],
                                    *[backend.prepare(key, number) for number in range(3)],
                                    backend.fetch(key, 1, [0], None))

    outcomes = asyncio.run(burst())
    assert all(len(replies) == 3 for replies in outcomes[:4])
    assert calls == {(str(index), s): 1 for s in range(3)}
    status = cache.status()
    assert status["cold_loads"] == 3 and status["loaded"] == 3
    assert [(x["shard"], x["cold_loads"]) for x in status["shard_loads"]] == [(0, 1), (1, 1), (2, 1)]
    assert all(x["max_seconds"] >= 0.3 and x["seconds"] >= x["max_seconds"] for x in status["shard_loads"])


def test_a_burst_of_cold_loads_never_holds_the_thread_a_warm_search_needs(tenant_indexes, monkeypatch):
    """Forty stuck loads (more than any default worker pool's threads) while a warm tenant is searched."""
    index = tenant_indexes["alpha"]
    other = tenant_indexes["beta"]
    cache = ShardCache(256 << 20, 1)
    warm = _key("alpha", index)
    vectors, batch = _query(index)
    real = Shard.open
    release = threading.Event()

    def stuck_open(*args):
        release.wait(120)
        return real(*args)

    async def go():
        backend = _local(cache)
        await backend.search(warm, 3, vectors, batch)  # warm: loaded before the loads get stuck
        monkeypatch.setattr(Shard, "open", stuck_open)
        cold = [asyncio.ensure_future(backend.search(_key(f"cold{i}", other), 3, vectors, batch)) for i in range(14)]
        await asyncio.sleep(0.5)
        start = time.perf_counter()
        try:
            replies = await asyncio.wait_for(backend.search(warm, 3, vectors, batch), 30)
        finally:
            release.set()
        warm_s = time.perf_counter() - start
        await asyncio.gather(*cold)
        return replies, warm_s

    replies, warm_s = asyncio.run(go())
    assert len(replies) == 3 and warm_s < 10
    assert cache.status()["cold_loads"] == 3 + 14 * 3


@pytest.mark.parametrize("faiss_threads,threads", [(None, 1), (3, 3)])
def test_each_search_uses_one_faiss_thread_unless_asked(faiss_threads, threads):
    """OpenMP threads of one search spin at its barriers where other searches hold the cores: a replica runs
    as many searches at once as it has CPUs (its search pool), each on one FAISS thread by default."""
    assert ShardCache(1 << 20, faiss_threads).threads == threads
