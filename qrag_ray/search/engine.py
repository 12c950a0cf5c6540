"""In-process search (`qrag search`, `qrag eval`): an index's shards opened in this process, searched
through the retrieval core the Serve Router runs (search/retrieve.py), so both rank identically."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from pathlib import Path

import numpy as np

from qrag_ray.config.search_policy import SearchConfig
from qrag_ray.embedding import encode, load_sentence_transformer
from qrag_ray.errors import QragError
from qrag_ray.index.format import load_manifest
from qrag_ray.search.filters import Filter, compile_filter
from qrag_ray.search.page import SearchResult
from qrag_ray.search.query import QueryBatch, check_hybrid
from qrag_ray.search.retrieve import BatchPages, LocalShards, retrieve
from qrag_ray.search.shard import Shard


class SearchEngine:
    """An index searched in this process: its shards opened up front, its query embedder loaded on first use."""

    def __init__(self, index_dir: str | Path, verify: bool = True, embedder=None, threads: int | None = None,
                 policy: SearchConfig | None = None):
        self.manifest = load_manifest(index_dir)
        self.shards = [Shard.open(self.manifest, number, threads, verify) for number in range(self.manifest.num_shards)]
        self.policy = policy or self.manifest.search_policy
        check_hybrid(self.policy, self.manifest)
        self._embedder = embedder
        self.backend = LocalShards(self._opened)
        self._loop = asyncio.new_event_loop()
        self.last: BatchPages | None = None  # the last batch's retrieval, with its timings

    async def _opened(self, key: Hashable, number: int) -> Shard:
        return self.shards[number]

    @property
    def embedder(self):
        """The index's query embedder (loaded on first use)."""
        if self._embedder is None:
            self._embedder = load_sentence_transformer(self.manifest.embedder_model)
        return self._embedder

    def embed(self, queries: list[str]) -> np.ndarray:
        """One normalised vector per query."""
        return encode(self.embedder, queries)

    def compile_filter(self, filter: dict | None = None, doc_ids: list[str] | None = None) -> Filter | None:
        """A filter (the API's grammar) and doc_ids checked against this index (InvalidFilter if not)."""
        return compile_filter(filter, doc_ids, self.manifest.metadata_schema)

    def search_vectors(self, vectors: np.ndarray, k: int, min_score: float | None = None,
                       queries: list[str] | None = None, filter: Filter | None = None) -> list[list[SearchResult]]:
        """Top k chunks per query vector (among those `filter` passes); a hybrid policy also needs the
        query texts."""
        texts = None if queries is None or self.policy.bm25_alpha is None else tuple(queries)
        batch = QueryBatch(k, min_score, self.policy, texts, filter)
        self.last = self._loop.run_until_complete(retrieve(self.backend, None, len(self.shards), vectors, batch))
        return self.last.pages

    def search(self, queries: list[str], k: int = 10, min_score: float | None = None, filter: dict | None = None,
               doc_ids: list[str] | None = None) -> list[list[dict]]:
        """Top k chunks per query as the CLI prints them (JSON-ready dicts)."""
        if not all(isinstance(query, str) and query.strip() for query in queries):
            raise QragError("query must be a non-empty string")
        compiled = self.compile_filter(filter, doc_ids)
        pages = self.search_vectors(self.embed(queries), k, min_score, queries, compiled)
        return [[result.to_json() for result in page] for page in pages]
