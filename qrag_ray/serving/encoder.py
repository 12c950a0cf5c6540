"""Query embedding inside the Router replica (a process hop fewer per request): models by name, loaded
once, encoded off the event loop."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np

logger = logging.getLogger("ray.serve")


class QueryEncoder:
    def __init__(self, threads: int = 1):
        self.threads = threads
        self._models: dict[str, asyncio.Future] = {}  # name -> its load (loading or loaded)
        # One encode at a time: a batch its deadline cancelled leaves its encode running in a worker thread
        # while the next batch starts, and a fast tokenizer shared by two threads can fail ("Already borrowed").
        self._lock = threading.Lock()

    def _load_sync(self, name: str):
        import torch

        from qrag_ray.embedding import load_sentence_transformer

        torch.set_num_threads(self.threads)
        st = load_sentence_transformer(name, device=None, threads=self.threads, dtype="auto")  # CUDA: half precision
        logger.info("query embedder loaded %s", name)
        return st

    async def model(self, name: str):
        fut = self._models.get(name)
        if fut is None:  # one load per model, however many requests wait (a deadline may cancel a waiter, not the load)
            fut = self._models[name] = asyncio.ensure_future(asyncio.to_thread(self._load_sync, name))
            fut.add_done_callback(lambda f: self._models.pop(name) if f.cancelled() or f.exception() else None)
        return await asyncio.shield(fut)

    def _encode(self, st, texts: list[str]) -> np.ndarray:
        from qrag_ray.embedding import encode

        with self._lock:
            return encode(st, texts)

    async def encode(self, texts: list[str], models: list[str]) -> list[np.ndarray]:
        """One vector per text, each with its own model; one encode call per distinct model."""
        out: dict[int, np.ndarray] = {}
        for name in dict.fromkeys(models):
            idx = [i for i, m in enumerate(models) if m == name]
            vecs = await asyncio.to_thread(self._encode, await self.model(name), [texts[i] for i in idx])
            out.update(zip(idx, vecs))
        return [out[i] for i in range(len(texts))]
