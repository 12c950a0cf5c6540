"""FAISS's thread count is OpenMP's per-thread setting: a shard loaded with `threads` searches with that
many in whichever thread runs the search (Serve replicas search in worker threads, whose own setting is
every core)."""

from __future__ import annotations

import threading

import faiss
import numpy as np

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.search.query import QueryBatch
from qrag_ray.search.shard import Shard, search_shards
from support.synthetic_index import synthetic_docs, write_synthetic_index


def test_a_search_in_another_thread_runs_with_the_shards_threads(tmp_path):
    shard = Shard.open(write_synthetic_index(tmp_path / "i", synthetic_docs(20)), 0, threads=1)
    vectors = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    seen = {}

    def worker():
        faiss.omp_set_num_threads(3)  # what this thread would use otherwise
        (reply,) = search_shards([shard], vectors, QueryBatch(5, None, SearchConfig()))
        seen["threads"] = faiss.omp_get_max_threads()
        seen["hits"] = reply.candidates

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["threads"] == 1
    assert len(seen["hits"]) == 2 and all(count > 0 for count in seen["hits"])
