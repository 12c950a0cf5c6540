"""Query embedding inside the Router replica (a process hop fewer per request): models by name, loaded
once, encoded off the event loop. Concurrent encode calls for one model share the next model call: while
one call runs, the texts asked for meanwhile wait and then go in one call together, so a burst that Serve
formed into several small batches is still embedded as one (nothing ever waits for a batch to fill)."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field

import numpy as np

logger = logging.getLogger("ray.serve")


@dataclass
class _Calls:
    """One model's texts waiting for its next model call, and whether a call is running."""

    waiting: list[tuple[list[str], asyncio.Future]] = field(default_factory=list)
    running: asyncio.Task | None = None


class QueryEncoder:
    def __init__(self, threads: int = 1):
        self.threads = threads
        self._models: dict[str, asyncio.Future] = {}  # name -> its load (loading or loaded)
        self._calls: dict[str, _Calls] = {}
        # One model call at a time: a fast tokenizer shared by two threads can fail ("Already borrowed").
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

    async def encode(self, texts: list[str], models: list[str]) -> tuple[list[np.ndarray], int]:
        """One vector per text, each with its own model; and the most texts one model call embedded with them."""
        out: dict[int, np.ndarray] = {}
        shared = 0
        for name in dict.fromkeys(models):
            idx = [i for i, m in enumerate(models) if m == name]
            vecs, n = await self._call(name, [texts[i] for i in idx])
            out.update(zip(idx, vecs))
            shared = max(shared, n)
        return [out[i] for i in range(len(texts))], shared

    async def _call(self, name: str, texts: list[str]) -> tuple[np.ndarray, int]:
        calls = self._calls.setdefault(name, _Calls())
        fut = asyncio.get_running_loop().create_future()  # a deadline cancels it, not the model call
        calls.waiting.append((texts, fut))
        if calls.running is None:
            calls.running = asyncio.ensure_future(self._run(name, calls))
        return await fut

    async def _run(self, name: str, calls: _Calls) -> None:
        """Model calls while texts wait, each over all the texts waiting when it starts."""
        try:
            while calls.waiting:
                now, calls.waiting = [(ts, f) for ts, f in calls.waiting if not f.done()], []  # a deadline gave up
                texts = [t for ts, _ in now for t in ts]
                if not texts:
                    continue
                try:
                    vecs = await asyncio.to_thread(self._encode, await self.model(name), texts)
                except Exception as e:  # noqa: BLE001 - each caller gets the error (a model that fails to load)
                    for _, f in now:
                        if not f.done():
                            f.set_exception(e)
                    continue
                start = 0
                for ts, f in now:
                    if not f.done():
                        f.set_result((vecs[start:start + len(ts)], len(texts)))
                    start += len(ts)
        finally:
            calls.running = None
