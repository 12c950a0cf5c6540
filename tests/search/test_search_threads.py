"""FAISS's thread count is OpenMP's per-thread setting: a shard loaded with `threads` searches with that
many in whichever thread runs the search (Serve replicas search in worker threads, whose own setting is
every core)."""

from __future__ import annotations

import threading

import faiss
import numpy as np

from qrag_ray.search.query import Query
from qrag_ray.search.shard_search import load_shard, search_loaded
from qrag_ray.config.search_policy import SearchConfig
from support.synthetic_index import synthetic_docs, write_synthetic_index


def test_a_search_in_another_thread_runs_with_the_shards_threads(tmp_path):
    ls = load_shard(write_synthetic_index(tmp_path / "i", synthetic_docs(20)), 0, threads=1)
    q = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    seen = {}

    def worker():
        faiss.omp_set_num_threads(3)  # what this thread would use otherwise
        reply = search_loaded(ls, 0, q, Query(5, None, SearchConfig()))
        seen["threads"], seen["hits"] = faiss.omp_get_max_threads(), reply.candidates

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["threads"] == 1
    assert all(n > 0 for n in seen["hits"])
