"""ShardStore, the byte-bounded shard cache of the Router and of every ShardSearcher replica, on real indexes
without Serve: one load per shard however many requests and paths (a search, a version's warm-up, a page's
lookup) ask for it at once; loads in threads of their own, so a burst of them never holds the thread a
warm search needs; load seconds per shard in the status."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import numpy as np
import pytest

from qrag_ray.index.format import load_manifest
from qrag_ray.search.query import Query
from qrag_ray.serving import shard_store
from qrag_ray.serving.shard_backends import RouterShards
from qrag_ray.serving.shard_store import ShardKey, ShardStore

pytestmark = pytest.mark.integration  # real FAISS shards, built by the session's indexes (Ray)


def _key(tenant: str, index) -> ShardKey:
    return ShardKey(tenant, str(index), load_manifest(index).index_version)


def _query(index) -> tuple[np.ndarray, Query]:
    m = load_manifest(index)
    v = np.random.default_rng(0).standard_normal((2, m.dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True), Query(5, None, m.search_policy)


def test_every_path_asking_for_one_cold_shard_at_once_shares_one_load(tenant_indexes, monkeypatch):
    real, calls = shard_store.load_shard, Counter()

    def slow_load(index_dir, shard, *args):
        calls[(index_dir, shard)] += 1
        time.sleep(0.3)  # every ask below arrives while the first one's load runs
        return real(index_dir, shard, *args)

    monkeypatch.setattr(shard_store, "load_shard", slow_load)
    index = tenant_indexes["alpha"]
    store, key = ShardStore(256 << 20, 1), _key("alpha", index)
    qvecs, q = _query(index)

    async def burst():
        backend = RouterShards(store)
        return await asyncio.gather(*[backend.search(key, 3, qvecs, q) for _ in range(4)],
                                    *[store.prepare(s, key) for s in range(3)], store.lookup(1, key, [0], []))

    out = asyncio.run(burst())
    assert all(len(replies) == 3 for replies in out[:4])
    assert calls == {(str(index), s): 1 for s in range(3)}
    st = store.status()
    assert st["cold_loads"] == 3 and st["loaded"] == 3
    assert [(x["shard"], x["cold_loads"]) for x in st["shard_loads"]] == [(0, 1), (1, 1), (2, 1)]
    assert all(x["max_seconds"] >= 0.3 and x["seconds"] >= x["max_seconds"] for x in st["shard_loads"])


def test_a_burst_of_cold_loads_never_holds_the_thread_a_warm_search_needs(tenant_indexes, monkeypatch):
    """Forty stuck loads (more than any default worker pool's threads) while a warm tenant is searched."""
    index, other = tenant_indexes["alpha"], tenant_indexes["beta"]
    store, warm = ShardStore(256 << 20, 1), _key("alpha", index)
    qvecs, q = _query(index)
    real, release = shard_store.load_shard, threading.Event()

    def stuck_load(*args):
        release.wait(120)
        return real(*args)

    async def go():
        backend = RouterShards(store)
        await backend.search(warm, 3, qvecs, q)  # warm: loaded before the loads get stuck
        monkeypatch.setattr(shard_store, "load_shard", stuck_load)
        cold = [asyncio.ensure_future(backend.search(_key(f"cold{i}", other), 3, qvecs, q)) for i in range(14)]
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        try:
            replies = await asyncio.wait_for(backend.search(warm, 3, qvecs, q), 30)
        finally:
            release.set()
        warm_s = time.perf_counter() - t0
        await asyncio.gather(*cold)
        return replies, warm_s

    replies, warm_s = asyncio.run(go())
    assert len(replies) == 3 and warm_s < 10
    assert store.status()["cold_loads"] == 3 + 14 * 3
