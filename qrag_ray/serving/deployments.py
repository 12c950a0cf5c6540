"""Serve deployments behind the router: the query embedder, one searcher per shard, the LLM.

Each ShardSearcher replica serves one shard number for every tenant: tenant shards load on demand
through `serve.multiplexed` (model id = tenant name, LRU), so many tenants share replicas instead of
one app per tenant. A replica answers with vector-level `ShardHits` (the router merges them with the
same `merge_hits` as the in-process engine) plus the texts for the rows that can make the page: the
rows of its own top-k chunks (every vector of a chunk lives in its shard), so one round trip usually
suffices; the router asks `lookup` for anything else.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
from ray import serve

from qrag_ray.search.merge import FusionPolicy, merge_hits

logger = logging.getLogger("ray.serve")


def _assigned_cpus(default: int = 1) -> int:
    """The replica's CPU share, so FAISS / torch threads match what Ray scheduled it for."""
    try:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        if cpus:
            return max(1, int(round(cpus)))
    except Exception:  # noqa: BLE001 - outside Ray: keep the default
        pass
    return default


# ---------------------------------------------------------------------------------- embedder
@dataclass
class EmbedReply:
    vectors: np.ndarray
    ms: float


class QueryEmbedder:
    """Sentence-transformers models by name (the tenants' index embedders), loaded once per replica."""

    def __init__(self, models: list[str], threads: int | None = None):
        import torch

        torch.set_num_threads(threads or _assigned_cpus())
        self._models: dict[str, object] = {}
        self._lock = asyncio.Lock()
        for m in models:
            self._load(m)

    def _load(self, name: str):
        st = self._models.get(name)
        if st is None:
            from qrag_ray.embedding import load_sentence_transformer

            st = self._models[name] = load_sentence_transformer(name, device=None)
            logger.info("QueryEmbedder loaded %s", name)
        return st

    async def embed(self, texts: list[str], model: str) -> EmbedReply:
        from qrag_ray.embedding import encode

        t0 = time.perf_counter()
        st = self._load(model)
        # One encode at a time: torch already uses the replica's threads; overlapping calls only thrash.
        async with self._lock:
            vecs = await asyncio.to_thread(encode, st, texts)
        return EmbedReply(vecs, (time.perf_counter() - t0) * 1000)


# ---------------------------------------------------------------------------------- shards
@dataclass
class LoadedShard:
    tenant: str
    searcher: object  # qrag_ray.index.searcher.ShardSearcher
    chunks: dict[int, dict]  # chunk_idx -> {chunk_id, doc_id, title, text}: this shard's chunks only
    policy: FusionPolicy
    index_version: str


@dataclass
class ShardReply:
    shard: int
    index_version: str
    ntotal: int
    hits: object  # ShardHits for the batch of queries
    matched: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, text)
    chunks: dict[int, dict] = field(default_factory=dict)  # chunk_idx -> meta
    search_ms: float = 0.0


def load_shard(tenant: str, index_dir: str, shard: int, threads: int | None) -> LoadedShard:
    """Load and verify (sha256) one shard of one tenant's index: FAISS file, row metadata, its chunks."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from qrag_ray.errors import IndexFormatError
    from qrag_ray.index.format import CHUNKS, load_manifest, verify_files
    from qrag_ray.index.searcher import ShardSearcher

    manifest = load_manifest(index_dir)
    if shard >= manifest.num_shards:
        raise IndexFormatError(f"index {index_dir} has {manifest.num_shards} shards, no shard {shard}")
    searcher = ShardSearcher(index_dir, shard, manifest, verify=True, threads=threads, use_gpu=True)
    verify_files(manifest, [CHUNKS])
    t = pq.read_table(manifest.file(CHUNKS), columns=["chunk_idx", "chunk_id", "doc_id", "title", "text", "shard"])
    t = t.filter(pc.equal(t.column("shard"), shard))
    cols = {c: t.column(c).to_pylist() for c in ("chunk_idx", "chunk_id", "doc_id", "title", "text")}
    chunks = {int(ci): {"chunk_id": a, "doc_id": b, "title": c, "text": d}
              for ci, a, b, c, d in zip(cols["chunk_idx"], cols["chunk_id"], cols["doc_id"], cols["title"], cols["text"])}
    return LoadedShard(tenant, searcher, chunks, FusionPolicy.from_manifest(manifest), manifest.index_version)


class ShardSearcherDeployment:
    """Shard `shard` of every tenant's index; the request's multiplexed model id names the tenant."""

    async def __init__(self, shard: int, indexes: dict[str, str], max_tenants: int = 8,
                 faiss_threads: int | None = None):
        from qrag_ray.serving.metrics import ShardMetrics

        self.shard = shard
        self.indexes = dict(indexes)
        self.threads = faiss_threads or _assigned_cpus()
        self.metrics = ShardMetrics()
        self.problems: dict[str, str] = {}
        self._versions: dict[str, str] = {}  # tenant -> index_version of the loaded shard

        async def load(tenant: str) -> LoadedShard:  # a plain function: multiplexed keeps its LRU on it
            return await self._load(tenant)

        self.get_shard = serve.multiplexed(max_num_models_per_replica=max_tenants)(load)
        # Load eagerly what fits, so a broken shard shows up in /healthz at startup, not at the first query.
        for tenant in list(self.indexes)[:max_tenants]:
            try:
                await self.get_shard(tenant)
            except Exception as e:  # noqa: BLE001 - reported by status() -> /healthz
                self.problems.setdefault(tenant, f"{type(e).__name__}: {e}")
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_gauge())

    async def _refresh_gauge(self) -> None:
        """Ray drops a gauge sample that is not re-reported within ~2 export intervals, so the
        loaded-version gauge is re-set periodically for as long as the shard stays loaded."""
        while True:
            for tenant, version in list(self._versions.items()):
                self.metrics.version.set(1, tags={"tenant": tenant, "shard": str(self.shard), "index_version": version})
            await asyncio.sleep(2.0)

    async def _load(self, tenant: str) -> LoadedShard:
        index_dir = self.indexes.get(tenant)
        if index_dir is None:
            raise KeyError(f"unknown tenant {tenant!r}")
        try:
            loaded = await asyncio.to_thread(load_shard, tenant, index_dir, self.shard, self.threads)
        except Exception as e:
            self.problems[tenant] = f"{type(e).__name__}: {e}"
            logger.error("shard %d of tenant %r (%s) failed to load: %s", self.shard, tenant, index_dir, e)
            raise
        self.problems.pop(tenant, None)
        self._versions[tenant] = loaded.index_version
        weakref.finalize(loaded, self._versions.pop, tenant, None)  # LRU eviction drops it from the gauge
        logger.info("shard %d of tenant %r loaded: %d vectors, index %s", self.shard, tenant,
                    loaded.searcher.ntotal, loaded.index_version)
        return loaded

    async def search(self, qvecs: np.ndarray, k_vectors: int, k: int, min_score: float | None,
                     queries: list[str] | None = None) -> ShardReply:
        tenant = serve.get_multiplexed_model_id()
        ls = await self.get_shard(tenant)
        t0 = time.perf_counter()
        hits = ls.searcher.search(qvecs, k_vectors, queries)
        ms = (time.perf_counter() - t0) * 1000
        self.metrics.latency.observe(ms, tags={"tenant": tenant, "shard": str(self.shard)})
        reply = ShardReply(self.shard, ls.index_version, ls.searcher.ntotal, hits, search_ms=ms)
        # Texts for this shard's own top-k chunks: the only rows of this shard that can reach the page.
        for qi in range(len(qvecs)):
            local, _ = merge_hits([hits], qi, k, min_score, ls.policy)
            for r in local:
                reply.chunks[r.chunk_idx] = ls.chunks[r.chunk_idx]
                for _, row, _ in r.matches:
                    reply.matched[row] = ls.searcher.matched(row)
        return reply

    async def lookup(self, rows: list[int], chunk_idxs: list[int]) -> tuple[dict, dict]:
        ls = await self.get_shard(serve.get_multiplexed_model_id())
        return ({int(r): ls.searcher.matched(int(r)) for r in rows},
                {int(c): ls.chunks[int(c)] for c in chunk_idxs})

    async def status(self) -> dict:
        return {"shard": self.shard, "problems": dict(self.problems)}


# ---------------------------------------------------------------------------------- LLM
class Synthesizer:
    """The query-time LLM (HyDE passages, answers) behind qrag_ray.generation.chat."""

    def __init__(self, generator: dict):
        from qrag_ray.generation.chat import get_chat_model

        self.model = get_chat_model(generator)
        if hasattr(self.model, "start"):  # vLLM: pay the engine start-up before traffic
            self.model.start()

    async def complete(self, messages: list[dict], max_tokens: int) -> str:
        return await self.model.acomplete(messages, max_tokens=max_tokens, temperature=0.0)

