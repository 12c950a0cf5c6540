"""Query embedding inside the Router replica (a process hop fewer per request): models by name, loaded
once, encoded off the event loop. Concurrent encode calls for one model share the next model call: while
one call runs, the texts asked for meanwhile wait and then go in one call together (serving/coalesce.py), so
the search passes that run at once (serving/search_passes.py: one per tenant group) embed their queries
together and nothing ever waits for a batch to fill."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np

from qrag_ray.serving.coalesce import Coalescer

logger = logging.getLogger("ray.serve")


class QueryEncoder:
    def __init__(self, threads: int = 1):
        self.threads = threads
        self._models: dict[str, asyncio.Future] = {}  # name -> its load (loading or loaded)
        self._calls = Coalescer(self._model_call)  # per model: one call at a time, over every text waiting
        # One model call at a time: a fast tokenizer shared by two threads can fail ("Already borrowed").
        self._lock = threading.Lock()

    def _load_sync(self, name: str):
        import torch

        from qrag_ray.embedding import load_sentence_transformer

        torch.set_num_threads(self.threads)
        model = load_sentence_transformer(name, device=None, threads=self.threads, dtype="auto")  # CUDA: half precision
        logger.info("query embedder loaded %s", name)
        return model

    async def model(self, name: str):
        fut = self._models.get(name)
        if fut is None:  # one load per model, however many requests wait (a deadline may cancel a waiter, not the load)
            fut = self._models[name] = asyncio.ensure_future(asyncio.to_thread(self._load_sync, name))
            fut.add_done_callback(lambda f: self._models.pop(name) if f.cancelled() or f.exception() else None)
        return await asyncio.shield(fut)

    def _encode(self, model, texts: list[str]) -> np.ndarray:
        from qrag_ray.embedding import encode

        with self._lock:
            return encode(model, texts)

    async def encode(self, texts: list[str], model: str) -> tuple[np.ndarray, int]:
        """One vector per text (a row each), from a model call shared with the callers waiting beside it; and
        how many texts that call embedded."""
        return await self._calls.submit(model, texts)

    async def _model_call(self, name: str, asked: list[list[str]]) -> list[tuple[np.ndarray, int]]:
        """One model call over the texts of every caller waiting (each caller's own slice back)."""
        texts = [t for ts in asked for t in ts]
        vectors = await asyncio.to_thread(self._encode, await self.model(name), texts)
        out = []
        start = 0
        for caller_texts in asked:
            out.append((vectors[start:start + len(caller_texts)], len(texts)))
            start += len(caller_texts)
        return out
